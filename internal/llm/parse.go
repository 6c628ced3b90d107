package llm

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/wire"
)

// ParsedRequest is what llmq needs to know about a client's request body to
// admit, reserve and price it.
type ParsedRequest struct {
	Model string // body.model
	// MaxTokens is max_tokens or max_completion_tokens (the larger, if both are
	// given); 0 when absent, and the caller substitutes the model's default.
	MaxTokens int64
	N         int64 // the number of choices, each of which may use MaxTokens
	// PredictionTokens are the tokens of a chat body's predicted output:
	// those the model does not use are billed as output beyond MaxTokens.
	PredictionTokens int64
	PromptTokens     int64 // llmq's estimate of what the provider will count
	// ContentTokens is the content alone (message text, image allowances,
	// embedding inputs), with no overhead or margin.
	ContentTokens int64
	Inputs        int64  // embedding inputs; 0 for chat
	Encoding      string // the tokenizer encoding the counts used
	// KnownModel is false when Model matched no known tokenizer, so
	// PromptTokens carries the safety margin.
	KnownModel bool
}

// invalid is a request body that can never be sent; param is the JSON path
// of the offending value ("messages[2].content").
func invalid(param, format string, args ...any) *wire.Error {
	return wire.Invalid(param, client.CodeInvalidRequest, format, args...)
}

const (
	maxChoices         = 128
	maxEmbeddingInputs = 2048
	maxTokensParam     = math.MaxInt32
)

var validRoles = map[string]bool{
	"system": true, "user": true, "assistant": true, "tool": true, "developer": true, "function": true,
}

// bodyHead holds the members every endpoint's body has; the raw types that
// embed it keep the members llmq does not read in Other (see checkCase).
type bodyHead struct {
	Model  json.RawMessage `json:"model"`
	Stream json.RawMessage `json:"stream"`
	Other  otherMembers    `json:",unknown"`
}

// rawChatBody holds the members of a chat completions body llmq reads.
type rawChatBody struct {
	bodyHead
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	N                   json.RawMessage `json:"n"`
	Tools               json.RawMessage `json:"tools"`
	Functions           json.RawMessage `json:"functions"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	ServiceTier         json.RawMessage `json:"service_tier"`
	Prediction          json.RawMessage `json:"prediction"`
	WebSearchOptions    json.RawMessage `json:"web_search_options"`
	Modalities          json.RawMessage `json:"modalities"`
	Audio               json.RawMessage `json:"audio"`
}

type rawEmbeddingsBody struct {
	bodyHead
	Input json.RawMessage `json:"input"`
}

type rawMessage struct {
	Role         json.RawMessage `json:"role"`
	Content      json.RawMessage `json:"content"`
	Name         json.RawMessage `json:"name"`
	ToolCallID   json.RawMessage `json:"tool_call_id"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	FunctionCall json.RawMessage `json:"function_call"`
	Other        otherMembers    `json:",unknown"`
}

// partHead holds the members of a content part of either API that
// parseParts reads alike.
type partHead struct {
	Type    json.RawMessage `json:"type"`
	Text    json.RawMessage `json:"text"`
	Refusal json.RawMessage `json:"refusal"`
	Other   otherMembers    `json:",unknown"`
}

func (h *partHead) head() *partHead { return h }

type rawPart struct {
	partHead
	ImageURL json.RawMessage `json:"image_url"`
}

// message is a chat message reduced to what is counted.
type message struct {
	role, name string
	hasName    bool
	texts      []string // text content, one string per part
	media      []string // one entry per non-text part: its detail ("low", ...)
	extra      []string // tool_call_id, tool call names and arguments
}

// request is a validated body reduced to what is counted and what else
// decides its bill.
type request struct {
	endpoint     string
	model        string
	maxTokens    int64
	outputParam  string // the field stating the output limit ("" for none)
	n            int64
	messages     []message
	tools        json.RawMessage // tools or functions, as sent
	toolsKey     string
	schema       json.RawMessage // response_format of type json_schema
	inputs       []string        // embedding inputs as text
	tokenIDs     int64           // embedding inputs given as token ids
	nInputs      int64
	prediction   []string // a chat body's predicted output
	serviceTier  string   // "" for none or "auto"
	builtinTools []string // each kind once (see BuiltinTool)
	maxToolCalls int64    // 0 for none
	// uncounted is the param of the first part of the prompt llmq cannot
	// count (a file, audio, a part of a type it does not know); audio is
	// the param of the first audio part or audio output asked for, which
	// no price covers.
	uncounted, audio string
	// previousResponseID is a Responses API body's previous_response_id,
	// itemRefs the ids of its item_reference items, and unseen the param
	// of context stored at the provider that llmq cannot know (a
	// conversation, a prompt template).
	previousResponseID string
	itemRefs           []string
	unseen             string
	stores             bool  // a Responses API body's store is not false
	variant            error // see checkCase
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// jsonInt reads an integer parameter, also written as 1e3 or 100.0.
func jsonInt(raw json.RawMessage) (int64, bool) {
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, false
	}
	if v, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return v, true
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > math.MaxInt64/2 {
		return 0, false
	}
	return int64(f), true
}

func intParam(raw json.RawMessage, param string, lo, hi int64) (int64, bool, error) {
	if isNull(raw) {
		return 0, false, nil
	}
	v, ok := jsonInt(raw)
	if !ok {
		return 0, false, invalid(param, "'%s' must be an integer", param)
	}
	if v < lo || v > hi {
		return 0, false, invalid(param, "'%s' must be between %d and %d, got %d", param, lo, hi, v)
	}
	return v, true, nil
}

func parseBody(endpoint string, body []byte) (*request, error) {
	if !KnownEndpoint(endpoint) {
		return nil, invalid("endpoint", "'endpoint' must be %s, got %q", EndpointList, endpoint)
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, invalid("body", "'body' must be a JSON object")
	}
	r := &request{endpoint: endpoint, n: 1}
	switch endpoint {
	case EndpointEmbeddings:
		var rb rawEmbeddingsBody
		if err := r.decodeHead(body, &rb, &rb.bodyHead); err != nil {
			return nil, err
		}
		return r, parseInput(r, rb.Input)
	case EndpointResponses:
		var rb rawResponsesBody
		if err := r.decodeHead(body, &rb, &rb.bodyHead); err != nil {
			return nil, err
		}
		return r, parseResponses(r, &rb)
	case EndpointMessages:
		var rb rawMessagesBody
		if err := r.decodeHead(body, &rb, &rb.bodyHead); err != nil {
			return nil, err
		}
		return r, parseMessagesAPI(r, &rb)
	}
	var rb rawChatBody
	if err := r.decodeHead(body, &rb, &rb.bodyHead); err != nil {
		return nil, err
	}
	mt, hasMT, err := intParam(rb.MaxTokens, "max_tokens", 1, maxTokensParam)
	if err != nil {
		return nil, err
	}
	mct, hasMCT, err := intParam(rb.MaxCompletionTokens, "max_completion_tokens", 1, maxTokensParam)
	if err != nil {
		return nil, err
	}
	switch {
	case hasMCT && (!hasMT || mct >= mt):
		r.maxTokens, r.outputParam = mct, "max_completion_tokens"
	case hasMT:
		r.maxTokens, r.outputParam = mt, "max_tokens"
	}
	if n, has, err := intParam(rb.N, "n", 1, maxChoices); err != nil {
		return nil, err
	} else if has {
		r.n = n
	}
	if err := parseMessages(r, rb.Messages); err != nil {
		return nil, err
	}
	switch {
	case !isNull(rb.Tools):
		r.tools, r.toolsKey = rb.Tools, "tools"
	case !isNull(rb.Functions):
		r.tools, r.toolsKey = rb.Functions, "functions"
	}
	if !isNull(rb.ResponseFormat) {
		var rf struct {
			Type       string          `json:"type"`
			JSONSchema json.RawMessage `json:"json_schema"`
		}
		if unmarshal(rb.ResponseFormat, &rf) == nil && rf.Type == "json_schema" {
			r.schema = rf.JSONSchema
		}
	}
	if err := parseServiceTier(r, rb.ServiceTier); err != nil {
		return nil, err
	}
	if err := parsePrediction(r, rb.Prediction); err != nil {
		return nil, err
	}
	if !isNull(rb.WebSearchOptions) {
		// A search model searches once per request, billed per call.
		r.builtinTools = append(r.builtinTools, ToolWebSearch)
	}
	switch {
	case !isNull(rb.Audio):
		r.audio = cmp.Or(r.audio, "audio")
	case !isNull(rb.Modalities) && bytes.Contains(rb.Modalities, []byte(`"audio"`)):
		r.audio = cmp.Or(r.audio, "modalities")
	}
	return r, nil
}

// decodeHead decodes body into rb, then reads the model and stream members
// every endpoint has (of head, rb's own).
func (r *request) decodeHead(body []byte, rb any, head *bodyHead) error {
	if err := unmarshal(body, rb); err != nil {
		return invalid("body", "'body' is not valid JSON: %v", err)
	}
	r.checkCase(rb, head.Other, "")
	if isNull(head.Model) {
		return invalid("model", "'model' is required")
	}
	model, ok := jsonString(head.Model)
	if !ok || model == "" {
		return invalid("model", "'model' must be a non-empty string")
	}
	r.model = model
	return refuseTrue(head.Stream, "stream", "'stream' is not supported: llmq runs requests in the background and stores whole responses")
}

func refuseTrue(raw json.RawMessage, param, refusal string) error {
	switch string(raw) {
	case "", "null", "false":
		return nil
	case "true":
		return invalid(param, "%s", refusal)
	}
	return invalid(param, "'%s' must be a boolean", param)
}

// parseServiceTier reads service_tier ("auto" asks for the account's
// default, as none does).
func parseServiceTier(r *request, raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	tier, ok := jsonString(raw)
	if !ok || tier == "" || len(tier) > 64 {
		return invalid("service_tier", "'service_tier' must be a non-empty string such as 'auto', 'default', 'flex' or 'priority'")
	}
	if tier != "auto" {
		r.serviceTier = tier
	}
	return nil
}

func parsePrediction(r *request, raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var p struct {
		Type    string          `json:"type"`
		Content json.RawMessage `json:"content"`
	}
	if unmarshal(raw, &p) != nil || p.Type != "content" {
		return invalid("prediction", "'prediction' must be an object of type 'content' with a content")
	}
	m := &message{role: "assistant"}
	if err := r.parseContent(m, p.Content, "prediction.content"); err != nil {
		return err
	}
	if len(m.media) > 0 {
		return invalid("prediction.content", "'prediction.content' must be text")
	}
	r.prediction = m.texts
	return nil
}

func parseMessages(r *request, raw json.RawMessage) error {
	if isNull(raw) {
		return invalid("messages", "'messages' is required")
	}
	var msgs []json.RawMessage
	if raw[0] != '[' || unmarshal(raw, &msgs) != nil {
		return invalid("messages", "'messages' must be an array of message objects")
	}
	if len(msgs) == 0 {
		return invalid("messages", "'messages' must not be empty")
	}
	r.messages = make([]message, len(msgs))
	for i, mraw := range msgs {
		p := "messages[" + strconv.Itoa(i) + "]"
		var rm rawMessage
		if len(mraw) == 0 || mraw[0] != '{' || unmarshal(mraw, &rm) != nil {
			return invalid(p, "'%s' must be an object", p)
		}
		r.checkCase(&rm, rm.Other, p)
		m := &r.messages[i]
		role, ok := jsonString(rm.Role)
		if !ok {
			return invalid(p+".role", "'%s.role' must be a string", p)
		}
		if !validRoles[role] {
			return invalid(p+".role", "'%s.role' must be one of system, user, assistant, tool, developer, function; got %q", p, role)
		}
		m.role = role
		if !isNull(rm.Name) {
			if m.name, ok = jsonString(rm.Name); !ok {
				return invalid(p+".name", "'%s.name' must be a string", p)
			}
			m.hasName = true
		}
		if err := r.parseContent(m, rm.Content, p+".content"); err != nil {
			return err
		}
		if !isNull(rm.ToolCallID) {
			if id, ok := jsonString(rm.ToolCallID); ok {
				m.extra = append(m.extra, id)
			}
		}
		// Tool calls are counted by their names and arguments, the text the
		// model produced; their malformation is the provider's to report.
		if !isNull(rm.ToolCalls) {
			var calls []struct {
				Function functionCall `json:"function"`
			}
			if unmarshal(rm.ToolCalls, &calls) == nil {
				for _, c := range calls {
					m.extra = append(m.extra, c.Function.Name, c.Function.Arguments)
				}
			} else {
				m.extra = append(m.extra, string(rm.ToolCalls))
			}
		}
		if !isNull(rm.FunctionCall) {
			var fc functionCall
			if unmarshal(rm.FunctionCall, &fc) == nil {
				m.extra = append(m.extra, fc.Name, fc.Arguments)
			} else {
				m.extra = append(m.extra, string(rm.FunctionCall))
			}
		}
	}
	return nil
}

type functionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

func (r *request) parseContent(m *message, raw json.RawMessage, p string) error {
	if isNull(raw) {
		// An assistant turn that only called tools has no content.
		if m.role == "assistant" {
			return nil
		}
		return invalid(p, "'%s' is required for %s messages", p, m.role)
	}
	return parseParts(r, m, raw, p, []string{"text"}, "image_url", func(part *rawPart, pp string) (string, error) {
		var img struct {
			URL    string `json:"url"`
			Detail string `json:"detail"`
		}
		if isNull(part.ImageURL) || unmarshal(part.ImageURL, &img) != nil || img.URL == "" {
			return "", invalid(pp+".image_url", "'%s.image_url' must be an object with a url", pp)
		}
		return img.Detail, nil
	})
}

// parseParts reads content at p that is not null into m: a string, or an
// array of parts of text (of textTypes), refusals, images (of imageType,
// whose detail image reads), and the parts llmq cannot count, which it
// notes.
func parseParts[V any, P interface {
	*V
	head() *partHead
}](r *request, m *message, raw json.RawMessage, p string, textTypes []string, imageType string, image func(P, string) (string, error)) error {
	switch {
	case raw[0] == '"':
		s, ok := jsonString(raw)
		if !ok {
			return invalid(p, "'%s' must be a string or an array of content parts", p)
		}
		m.texts = append(m.texts, s)
		return nil
	case raw[0] != '[':
		return invalid(p, "'%s' must be a string or an array of content parts", p)
	}
	var parts []json.RawMessage
	if err := unmarshal(raw, &parts); err != nil {
		return invalid(p, "'%s' must be a string or an array of content part objects", p)
	}
	if len(parts) == 0 {
		return invalid(p, "'%s' must not be an empty array", p)
	}
	for j, praw := range parts {
		pp := p + "[" + strconv.Itoa(j) + "]"
		part := P(new(V))
		if len(praw) == 0 || praw[0] != '{' || unmarshal(praw, part) != nil {
			return invalid(pp, "'%s' must be a content part object", pp)
		}
		h := part.head()
		r.checkCase(part, h.Other, pp)
		typ, ok := jsonString(h.Type)
		if !ok || typ == "" {
			return invalid(pp+".type", "'%s.type' must be a non-empty string", pp)
		}
		switch {
		case slices.Contains(textTypes, typ) || typ == "refusal":
			member, raw := "text", h.Text
			if typ == "refusal" {
				member, raw = "refusal", h.Refusal
			}
			s, ok := jsonString(raw)
			if !ok {
				return invalid(pp+"."+member, "'%s.%s' must be a string", pp, member)
			}
			m.texts = append(m.texts, s)
		case typ == imageType:
			detail, err := image(part, pp)
			if err != nil {
				return err
			}
			m.media = append(m.media, detail)
		case typ == "input_audio":
			m.media = append(m.media, "")
			r.audio = cmp.Or(r.audio, pp)
		default: // files and whatever comes next, of a size not llmq's to know
			m.media = append(m.media, "")
			r.uncounted = cmp.Or(r.uncounted, pp)
		}
	}
	return nil
}

func parseInput(r *request, raw json.RawMessage) error {
	const what = "'input' must be a non-empty string, array of strings, array of token ids or array of arrays of token ids"
	if isNull(raw) {
		return invalid("input", "'input' is required")
	}
	if raw[0] == '"' {
		s, ok := jsonString(raw)
		if !ok || s == "" {
			return invalid("input", "'input' must be a non-empty string")
		}
		r.inputs, r.nInputs = []string{s}, 1
		return nil
	}
	if raw[0] != '[' {
		return invalid("input", what)
	}
	var strs []string
	if err := unmarshal(raw, &strs); err == nil { // [] too
		if len(strs) == 0 {
			return invalid("input", "'input' must not be an empty array")
		}
		if len(strs) > maxEmbeddingInputs {
			return invalid("input", "'input' must have at most %d items, got %d", maxEmbeddingInputs, len(strs))
		}
		for i, s := range strs {
			if s == "" {
				return invalid(fmt.Sprintf("input[%d]", i), "'input[%d]' must be a non-empty string", i)
			}
		}
		r.inputs, r.nInputs = strs, int64(len(strs))
		return nil
	}
	var ids []int64
	if err := unmarshal(raw, &ids); err == nil {
		r.tokenIDs, r.nInputs = int64(len(ids)), 1
		return tokenIDs(ids, "input")
	}
	var lists [][]int64
	if err := unmarshal(raw, &lists); err != nil {
		return invalid("input", what)
	}
	if len(lists) > maxEmbeddingInputs {
		return invalid("input", "'input' must have at most %d items, got %d", maxEmbeddingInputs, len(lists))
	}
	for i, l := range lists {
		p := fmt.Sprintf("input[%d]", i)
		if len(l) == 0 {
			return invalid(p, "'%s' must be a non-empty array of token ids", p)
		}
		if err := tokenIDs(l, p); err != nil {
			return err
		}
		r.tokenIDs += int64(len(l))
	}
	r.nInputs = int64(len(lists))
	return nil
}

func tokenIDs(ids []int64, p string) error {
	for j, id := range ids {
		if id < 0 {
			return invalid(fmt.Sprintf("%s[%d]", p, j), "'%s[%d]' must be a token id (a non-negative integer)", p, j)
		}
	}
	return nil
}
