package llm

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer"
)

// The overheads of OpenAI's cookbook ("How to count tokens with tiktoken").
const (
	tokensPerMessage = 3
	tokensPerName    = 1
	tokensPerReply   = 3

	toolPropInit = 3
	toolPropKey  = 3
	toolEnumInit = -3
	toolEnumItem = 3
	toolFuncEnd  = 12

	// ImageTokens is the allowance for one image (or any non-text part) whose
	// size llmq cannot know: the most a high-detail image costs on gpt-4o.
	ImageTokens = 1445
	// ImageTokensLow is the cost of an image sent with detail "low".
	ImageTokensLow = 85

	// UnknownModelMarginPercent is added to the prompt estimate of a model no
	// tokenizer is known for: small-vocabulary tokenizers produce up to a
	// quarter more tokens, and an estimate too low costs 429s and
	// under-reserved budgets.
	UnknownModelMarginPercent = 25
	// ClaudeMarginPercent is added instead to a Claude model's estimate:
	// Anthropic publishes no tokenizer, and Claude's count of a text runs
	// 20 to 35% above o200k_base's.
	ClaudeMarginPercent = 50
	FallbackEncoding    = "o200k_base" // of models no tokenizer is known for
)

// imageAllowance lists models that bill images above gpt-4o's rates, per
// OpenAI's vision pricing.
var imageAllowance = []struct {
	prefix    string
	high, low int64
}{
	{"gpt-4o-mini", 2833 + 8*5667, 2833},
	{"gpt-4.1-nano", 3779, 3779},
	{"gpt-4.1-mini", 2489, 2489},
	{"o4-mini", 2642, 2642},
	{"claude", 1600, 1600}, // Anthropic's: an image within 1.15 megapixels
}

// encodingPrefixes maps model-name prefixes to encodings, most specific first.
var encodingPrefixes = []struct {
	encoding string
	prefixes []string
}{
	{"o200k_base", []string{"gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "gpt-oss", "o1", "o3", "o4"}},
	{"cl100k_base", []string{"gpt-4", "gpt-3.5", "gpt-35", "text-embedding-3", "text-embedding-ada-002"}},
}

// normalizeModel strips what does not change the tokenizer: case, a
// fine-tune's "ft:" prefix and a router's "vendor/" prefix.
func normalizeModel(model string) string {
	m := strings.ToLower(strings.TrimSpace(model))
	m = strings.TrimPrefix(m, "ft:")
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:]
	}
	return m
}

// EncodingForModel returns the tokenizer encoding of model, and whether the
// model is known; unknown models get FallbackEncoding.
func EncodingForModel(model string) (encoding string, known bool) {
	m := normalizeModel(model)
	for _, e := range encodingPrefixes {
		for _, prefix := range e.prefixes {
			if strings.HasPrefix(m, prefix) {
				return e.encoding, true
			}
		}
	}
	return FallbackEncoding, false
}

// codecs loads each encoding's codec (a vocabulary) once for the process.
var codecs = map[string]func() (tokenizer.Codec, error){}

func init() {
	for _, encoding := range []string{"o200k_base", "cl100k_base", "p50k_base", "r50k_base", "p50k_edit"} {
		codecs[encoding] = sync.OnceValues(func() (tokenizer.Codec, error) { return tokenizer.Get(tokenizer.Encoding(encoding)) })
	}
}

func codecFor(encoding string) (tokenizer.Codec, error) {
	load, ok := codecs[encoding]
	if !ok {
		return nil, fmt.Errorf("llm: unknown tokenizer encoding %q (want o200k_base, cl100k_base, p50k_base or r50k_base)", encoding)
	}
	return load()
}

// Estimator counts the prompt tokens of request bodies by the cookbook's
// count, with a flat allowance per image or other media part, and
// function definitions by the cookbook's formula, anything else (nested
// schemas, a json_schema response format) as its JSON text. The simulator
// charges ContentTokens by the same rules. It is safe for concurrent use.
type Estimator struct{}

// NewEstimator returns an Estimator.
func NewEstimator() *Estimator { return &Estimator{} }

// PromptTokens estimates the prompt tokens of body for endpoint (see Parse).
func (e *Estimator) PromptTokens(endpoint, model, encoding string, body []byte) (int64, error) {
	p, err := e.Parse(endpoint, model, encoding, body)
	if err != nil {
		return 0, err
	}
	return p.PromptTokens, nil
}

// Parse decodes body and counts it (see Count). Invalid bodies return a
// *wire.Error.
func (e *Estimator) Parse(endpoint, model, encoding string, body []byte) (*ParsedRequest, error) {
	b, err := Decode(endpoint, body)
	if err != nil {
		return nil, err
	}
	return e.Count(b, model, encoding)
}

// Body is a request body validated for its endpoint, decoded once: admission
// learns the model from it, then counts it as the model's upstream does.
type Body struct{ r *request }

// Decode validates body for endpoint without counting it.
func Decode(endpoint string, body []byte) (*Body, error) {
	r, err := parseBody(endpoint, body)
	if err != nil {
		return nil, err
	}
	return &Body{r: r}, nil
}

// Model is body.model: the name the client asked for.
func (b *Body) Model() string { return b.r.model }

// CaseVariant is the refusal of the first member whose name differs from one
// llmq reads only in case.
func (b *Body) CaseVariant() error { return b.r.variant }

// Endpoint and the accessors below read the body's parts that decide its
// bill beside the tokens, as request's fields document them.
func (b *Body) Endpoint() string         { return b.r.endpoint }
func (b *Body) OutputParam() string      { return b.r.outputParam }
func (b *Body) ServiceTier() string      { return b.r.serviceTier }
func (b *Body) BuiltinTools() []string   { return b.r.builtinTools }
func (b *Body) MaxToolCalls() int64      { return b.r.maxToolCalls }
func (b *Body) Uncounted() string        { return b.r.uncounted }
func (b *Body) Audio() string            { return b.r.audio }
func (b *Body) Unseen() string           { return b.r.unseen }
func (b *Body) StoresResponse() bool     { return b.r.stores }
func (b *Body) ItemReferences() []string { return b.r.itemRefs }

// Count counts b with the tokenizer of model ("" uses body.model) or the
// given encoding (which then adds no margin).
func (e *Estimator) Count(b *Body, model, encoding string) (*ParsedRequest, error) {
	r := b.r
	model = cmp.Or(model, r.model)
	known := true
	if encoding == "" {
		encoding, known = EncodingForModel(model)
	}
	codec, err := codecFor(encoding)
	if err != nil {
		return nil, err
	}
	c := counter{codec: codec}
	content, overhead := c.request(r, normalizeModel(model))
	prompt := content + overhead
	if !known {
		margin := int64(UnknownModelMarginPercent)
		if strings.HasPrefix(normalizeModel(model), "claude") {
			margin = ClaudeMarginPercent
		}
		prompt += (prompt*margin + 99) / 100
	}
	return &ParsedRequest{
		Model:            r.model,
		PredictionTokens: c.texts(r.prediction),
		MaxTokens:        r.maxTokens,
		N:                r.n,
		PromptTokens:     prompt,
		ContentTokens:    content,
		Inputs:           r.nInputs,
		Encoding:         encoding,
		KnownModel:       known,
	}, nil
}

type counter struct {
	codec tokenizer.Codec
}

func (c counter) text(s string) int64 {
	if s == "" {
		return 0
	}
	n, _ := c.codec.Count(s) // fails only in strict mode, not used
	return int64(n)
}

func (c counter) texts(ss []string) (n int64) {
	for _, s := range ss {
		n += c.text(s)
	}
	return n
}

// request returns the content tokens and the overhead llmq adds to them.
func (c counter) request(r *request, model string) (content, overhead int64) {
	if r.endpoint == EndpointEmbeddings {
		return c.texts(r.inputs) + r.tokenIDs, 0
	}
	high, low := int64(ImageTokens), int64(ImageTokensLow)
	for _, a := range imageAllowance {
		if strings.HasPrefix(model, a.prefix) {
			high, low = a.high, a.low
			break
		}
	}
	for i := range r.messages {
		m := &r.messages[i]
		content += c.texts(m.texts)
		for _, detail := range m.media {
			if detail == "low" {
				content += low
			} else {
				content += high
			}
		}
		overhead += tokensPerMessage + c.text(m.role)
		if m.hasName {
			overhead += c.text(m.name) + tokensPerName
		}
		overhead += c.texts(m.extra)
	}
	overhead += tokensPerReply
	if len(r.tools) > 0 {
		overhead += c.tools(r.tools, r.toolsKey == "functions")
	}
	if len(r.schema) > 0 {
		overhead += c.json(r.schema)
	}
	return content, overhead
}

// json counts a JSON value as its compact text, more than a provider's
// rendering of schemas.
func (c counter) json(raw json.RawMessage) int64 {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return c.text(string(raw))
	}
	return c.text(b.String())
}

type toolSpec struct {
	Type     string       `json:"type"`
	Function *functionDef `json:"function"`
}

type functionDef struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Parameters  struct {
		Properties map[string]json.RawMessage `json:"properties"`
	} `json:"parameters"`
}

// tools counts function definitions by the cookbook's formula, others as
// their JSON text.
func (c counter) tools(raw json.RawMessage, legacy bool) int64 {
	var defs []*functionDef
	var n int64
	if legacy {
		if unmarshal(raw, &defs) != nil {
			return c.json(raw)
		}
	} else {
		var specs []json.RawMessage
		if unmarshal(raw, &specs) != nil {
			return c.json(raw)
		}
		for _, s := range specs {
			var t toolSpec
			if unmarshal(s, &t) != nil || t.Function == nil {
				n += c.json(s)
				continue
			}
			defs = append(defs, t.Function)
		}
	}
	if len(defs) == 0 {
		return n
	}
	funcInit := int64(10)
	if c.codec.GetName() == "o200k_base" {
		funcInit = 7
	}
	for _, f := range defs {
		if f == nil {
			continue
		}
		n += funcInit + c.text(f.Name+":"+strings.TrimSuffix(f.Description, "."))
		if len(f.Parameters.Properties) == 0 {
			continue
		}
		n += toolPropInit
		for key, praw := range f.Parameters.Properties {
			n += toolPropKey + c.property(key, praw)
		}
	}
	return n + toolFuncEnd
}

func (c counter) property(key string, raw json.RawMessage) int64 {
	var all map[string]json.RawMessage
	if unmarshal(raw, &all) != nil {
		return c.text(key) + c.json(raw)
	}
	var n int64
	typ, ok := jsonString(all["type"])
	if !ok && !isNull(all["type"]) {
		var b bytes.Buffer
		_ = json.Compact(&b, all["type"])
		typ = b.String()
	}
	desc, _ := jsonString(all["description"])
	if enumRaw, ok := all["enum"]; ok {
		var items []json.RawMessage
		if unmarshal(enumRaw, &items) == nil {
			n += toolEnumInit
			for _, it := range items {
				s, ok := jsonString(it)
				if !ok {
					s = string(it)
				}
				n += toolEnumItem + c.text(s)
			}
		}
	}
	n += c.text(key + ":" + typ + ":" + strings.TrimSuffix(desc, "."))
	delete(all, "type")
	delete(all, "description")
	delete(all, "enum")
	if len(all) > 0 {
		rest, _ := json.Marshal(all)
		n += c.text(string(rest))
	}
	return n
}
