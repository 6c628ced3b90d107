package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// EndpointMessages is Anthropic's Messages API.
const EndpointMessages = "/v1/messages"

// The cache lifetimes of Anthropic's prompt cache: the default, and the
// hour a breakpoint's cache_control may ask with "ttl": "1h".
const (
	cacheTTL     = 5 * time.Minute
	cacheTTLHour = time.Hour
)

// maxBreakpoints is how many cache_control breakpoints a request may set.
const maxBreakpoints = 4

// messagesRequest is what the simulator reads of a Messages API body.
type messagesRequest struct {
	model     string
	maxTokens int64
	stops     []string
	// blocks are the prompt's text blocks in the order the cache sees
	// them: the system prompt's, then each message's.
	blocks []promptBlock
}

// promptBlock is one text block of a prompt; a cache_control breakpoint
// caches the prompt up to and including it, for ttl.
type promptBlock struct {
	text       string
	breakpoint bool
	ttl        time.Duration
}

// anthropicRefusal is an answer in Anthropic's error shape.
type anthropicRefusal struct {
	status       int
	typ, message string
}

func invalid(format string, a ...any) *anthropicRefusal {
	return &anthropicRefusal{http.StatusBadRequest, "invalid_request_error", fmt.Sprintf(format, a...)}
}

// readMessagesRequest validates body as Anthropic does the fields the
// simulator reads: model and max_tokens required, messages of user and
// assistant turns whose content is a string or text blocks, system a string
// or text blocks, stop_sequences strings, cache_control ephemeral with a
// ttl of 5m or 1h, at most four breakpoints.
func readMessagesRequest(body []byte) (*messagesRequest, *anthropicRefusal) {
	var raw struct {
		Model         *string           `json:"model"`
		MaxTokens     *json.Number      `json:"max_tokens"`
		System        json.RawMessage   `json:"system"`
		Messages      []json.RawMessage `json:"messages"`
		StopSequences []string          `json:"stop_sequences"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, invalid("The request body is not valid JSON: %v", err)
	}
	switch {
	case raw.Model == nil:
		return nil, invalid("model: Field required")
	case *raw.Model == "":
		return nil, invalid("model: String should have at least 1 character")
	case raw.MaxTokens == nil:
		return nil, invalid("max_tokens: Field required")
	case raw.Messages == nil:
		return nil, invalid("messages: Field required")
	}
	maxTokens, err := strconv.ParseInt(raw.MaxTokens.String(), 10, 64)
	if err != nil || maxTokens < 1 {
		return nil, invalid("max_tokens: Input should be a valid integer greater than or equal to 1")
	}
	rq := &messagesRequest{model: *raw.Model, maxTokens: maxTokens, stops: raw.StopSequences}
	if len(raw.System) > 0 && string(raw.System) != "null" {
		if bad := rq.readContent("system", raw.System); bad != nil {
			return nil, bad
		}
	}
	if len(raw.Messages) == 0 {
		return nil, invalid("messages: at least one message is required")
	}
	for i, m := range raw.Messages {
		var msg struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(m, &msg); err != nil {
			return nil, invalid("messages.%d: Input should be a valid dictionary", i)
		}
		if msg.Role != "user" && msg.Role != "assistant" {
			return nil, invalid("messages.%d.role: Input should be 'user' or 'assistant'", i)
		}
		if len(msg.Content) == 0 {
			return nil, invalid("messages.%d.content: Field required", i)
		}
		if bad := rq.readContent(fmt.Sprintf("messages.%d.content", i), msg.Content); bad != nil {
			return nil, bad
		}
	}
	n := 0
	for _, b := range rq.blocks {
		if b.breakpoint {
			n++
		}
	}
	if n > maxBreakpoints {
		return nil, invalid("A maximum of %d blocks with cache_control may be provided. Found %d.", maxBreakpoints, n)
	}
	return rq, nil
}

// readContent appends the text blocks of content (a string, or an array of
// text blocks) at path.
func (rq *messagesRequest) readContent(path string, content json.RawMessage) *anthropicRefusal {
	var text string
	if json.Unmarshal(content, &text) == nil {
		rq.blocks = append(rq.blocks, promptBlock{text: text})
		return nil
	}
	var blocks []struct {
		Type         string  `json:"type"`
		Text         *string `json:"text"`
		CacheControl *struct {
			Type string `json:"type"`
			TTL  string `json:"ttl"`
		} `json:"cache_control"`
	}
	if err := json.Unmarshal(content, &blocks); err != nil {
		return invalid("%s: Input should be a valid string or a list of content blocks", path)
	}
	for i, b := range blocks {
		if b.Type != "text" || b.Text == nil {
			return invalid("%s.%d: the simulator takes text blocks only, with their text", path, i)
		}
		pb := promptBlock{text: *b.Text}
		if cc := b.CacheControl; cc != nil {
			if cc.Type != "ephemeral" {
				return invalid("%s.%d.cache_control.type: Input should be 'ephemeral'", path, i)
			}
			switch cc.TTL {
			case "", "5m":
				pb.breakpoint, pb.ttl = true, cacheTTL
			case "1h":
				pb.breakpoint, pb.ttl = true, cacheTTLHour
			default:
				return invalid("%s.%d.cache_control.ttl: Input should be '5m' or '1h'", path, i)
			}
		}
		rq.blocks = append(rq.blocks, pb)
	}
	return nil
}

// breakpoint is the prompt up to one cache_control breakpoint: its tokens,
// its key in the cache, its lifetime.
type breakpoint struct {
	tokens int64
	key    [sha256.Size]byte
	ttl    time.Duration
}

// countPrompt counts rq's prompt as the provider does (llmq's estimator's
// content tokens, times Config.PromptFactor), in all and up to each
// breakpoint.
func (s *Server) countPrompt(rq *messagesRequest) (total int64, points []breakpoint) {
	h := sha256.New()
	h.Write([]byte(rq.model))
	var segment []string
	for _, b := range rq.blocks {
		segment = append(segment, b.text)
		fmt.Fprintf(h, "\x00%d:%s", len(b.text), b.text)
		if b.breakpoint {
			total += s.countTexts(segment)
			segment = segment[:0]
			p := breakpoint{tokens: total, ttl: b.ttl}
			h.Sum(p.key[:0])
			points = append(points, p)
		}
	}
	return total + s.countTexts(segment), points
}

// countTexts counts texts as the content of a chat request's messages.
func (s *Server) countTexts(texts []string) int64 {
	if len(texts) == 0 {
		return 0
	}
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := make([]message, len(texts))
	for i, t := range texts {
		msgs[i] = message{"user", t}
	}
	body, _ := json.Marshal(struct {
		Model    string    `json:"model"`
		Messages []message `json:"messages"`
	}{"gpt-4o", msgs})
	p, err := s.est.Parse(llm.EndpointChat, "", "", body)
	if err != nil {
		return 0 // a body of strings always parses
	}
	return int64(float64(p.ContentTokens)*s.cfg.PromptFactor + 0.999999)
}

// promptCache is Anthropic's prompt cache as the simulator keeps it: when
// each cached prefix expires, on the simulator's clock.
type promptCache struct {
	mu      sync.Mutex
	expires map[[sha256.Size]byte]time.Time
}

func newPromptCache() *promptCache {
	return &promptCache{expires: make(map[[sha256.Size]byte]time.Time)}
}

// cacheUse is how a prompt meets the cache: its tokens read from it,
// written to it for five minutes and for the hour, and the rest, input.
type cacheUse struct {
	read, write5m, write1h, input int64
	// hit is how many of points were read; points are the breakpoints the
	// cache holds afterwards.
	hit    int
	points []breakpoint
}

// lookup finds the longest prefix of the prompt that the cache holds at
// now (a read) and what the breakpoints after it write, each the tokens
// since the one before, for its own lifetime. Prefixes shorter than min
// tokens are not cached. Nothing changes until commit.
func (c *promptCache) lookup(total int64, points []breakpoint, now time.Time, min int64) cacheUse {
	var eligible []breakpoint
	for _, p := range points {
		if p.tokens >= min {
			eligible = append(eligible, p)
		}
	}
	u := cacheUse{points: eligible}
	c.mu.Lock()
	for i := len(eligible) - 1; i >= 0; i-- {
		if exp, ok := c.expires[eligible[i].key]; ok && now.Before(exp) {
			u.hit, u.read = i+1, eligible[i].tokens
			break
		}
	}
	c.mu.Unlock()
	cursor := u.read
	for _, p := range eligible[u.hit:] {
		if p.ttl == cacheTTLHour {
			u.write1h += p.tokens - cursor
		} else {
			u.write5m += p.tokens - cursor
		}
		cursor = p.tokens
	}
	u.input = total - cursor
	return u
}

// commit records an admitted call's use of the cache at now: what it read
// lives on for its lifetime from now, what it wrote is cached.
func (c *promptCache) commit(u cacheUse, now time.Time) {
	if len(u.points) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range u.points {
		if exp := now.Add(p.ttl); exp.After(c.expires[p.key]) {
			c.expires[p.key] = exp
		}
	}
	if len(c.expires) > 100_000 {
		for k, exp := range c.expires {
			if !now.Before(exp) {
				delete(c.expires, k)
			}
		}
	}
}

// anthropicError writes Anthropic's error shape.
func anthropicError(w http.ResponseWriter, status int, typ, message, requestID string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(anthropicErrorBody(typ, message, requestID))
}

// anthropicErrorBody is Anthropic's error: {"type":"error","error":{"type",
// "message"},"request_id"}.
func anthropicErrorBody(typ, message, requestID string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"type":"error","error":{"type":`)
	appendJSONString(&b, typ)
	b.WriteString(`,"message":`)
	appendJSONString(&b, message)
	b.WriteString(`}`)
	if requestID != "" {
		b.WriteString(`,"request_id":`)
		appendJSONString(&b, requestID)
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// anthropicAnswer fills the exchange with an error in Anthropic's shape.
func (x *Exchange) anthropicAnswer(status int, typ, message string) *Exchange {
	x.status, x.body = status, anthropicErrorBody(typ, message, x.header.Get("Request-Id"))
	x.header.Set("Content-Type", "application/json")
	return x
}

// serveMessages serves POST /v1/messages as Anthropic does: the x-api-key
// and anthropic-version headers required, stream a boolean.
func (s *Server) serveMessages(w http.ResponseWriter, r *http.Request) {
	s.flight.Add(1)
	defer s.flight.Add(-1)
	bad := func(status int, typ, message string) {
		if status == http.StatusUnauthorized {
			s.count(func(st *Stats) { st.Unauthorized++ })
		} else {
			s.count(func(st *Stats) { st.BadRequests++ })
		}
		anthropicError(w, status, typ, message, "")
	}
	if r.Header.Get("x-api-key") == "" {
		bad(http.StatusUnauthorized, "authentication_error", "x-api-key header is required")
		return
	}
	if r.Header.Get("anthropic-version") == "" {
		bad(http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		bad(http.StatusRequestEntityTooLarge, "request_too_large", "Request exceeds the maximum allowed number of bytes.")
		return
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		bad(http.StatusBadRequest, "invalid_request_error", "The request body is not a JSON object.")
		return
	}
	stream := false
	if raw, ok := fields["stream"]; ok {
		if err := json.Unmarshal(raw, &stream); err != nil {
			bad(http.StatusBadRequest, "invalid_request_error", "stream: Input should be a valid boolean")
			return
		}
	}
	s.deliver(w, r, s.begin(EndpointMessages, body, stream), stream, false)
}

// beginMessages is Begin for Anthropic's Messages API: the prompt meets the
// cache, the call is charged its requests, its input but cache reads to ITPM
// and max_tokens to OTPM (all of its tokens to TPM, when the model has one),
// and billed its uncached input, cache writes, cache reads and output.
func (s *Server) beginMessages(body []byte, stream bool) *Exchange {
	x := &Exchange{s: s, header: http.Header{}, endpoint: EndpointMessages, anthropic: true}
	rq, bad := readMessagesRequest(body)
	if bad == nil && s.cfg.OnlyKnownModels {
		s.mu.Lock()
		_, ok := s.models[rq.model]
		s.mu.Unlock()
		if !ok {
			bad = &anthropicRefusal{http.StatusNotFound, "not_found_error", "model: " + rq.model}
		}
	}
	if bad != nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		return x.anthropicAnswer(bad.status, bad.typ, bad.message)
	}
	n := s.arrival.Add(1)
	x.n, x.model = n, rq.model
	now := s.cfg.Now()
	total, points := s.countPrompt(rq)
	use := s.prompts.lookup(total, points, now, s.cfg.CacheMinTokens)
	input := use.input + use.write5m + use.write1h
	v := s.admit(rq.model, charge{tokens: input + rq.maxTokens, input: input, output: rq.maxTokens}, now, s.draw(n, drawFault))
	s.count(func(st *Stats) { st.Messages++ })
	x.seq = v.seq
	s.setAnthropicHeaders(x.header, &v, n)
	switch v.outcome {
	case RateLimited, Spurious429:
		return x.anthropicAnswer(http.StatusTooManyRequests, "rate_limit_error", anthropicLimitMessage(&v))
	case Error500:
		return x.anthropicAnswer(http.StatusInternalServerError, "api_error", "Internal server error")
	case Overloaded:
		return x.anthropicAnswer(529, "overloaded_error", "Overloaded")
	case Hung:
		x.hang, x.hangFor = true, v.hangFor
		return x
	}

	// Admitted: the cache keeps what it read and wrote; draw the answer.
	s.prompts.commit(use, now)
	x.admitted, x.status = true, http.StatusOK
	output := rq.maxTokens
	if !s.worstCase.Load() {
		output = s.completionTokens(rq.maxTokens, s.draw(n, drawCompletion))
	}
	bill := Bill{Seq: x.seq, Endpoint: EndpointMessages, Model: rq.model, ServiceTier: "standard",
		InputTokens: use.input, CachedTokens: use.read, CacheWrite5mTokens: use.write5m, CacheWrite1hTokens: use.write1h,
		OutputTokens: output, RequestID: s.requestID(n), Stream: stream}
	x.body = s.messageResponse(rq, n, &bill)
	s.record(bill)
	x.completion = output
	x.unused = rq.maxTokens - output
	x.outputReturn = rq.maxTokens - output
	x.latency = s.latency(n, output)
	x.header.Set("Content-Type", "application/json")
	x.header.Set("Content-Length", strconv.Itoa(len(x.body)))
	return x
}

// anthropicLimitMessage is the message of a 429 on the Messages API.
func anthropicLimitMessage(v *verdict) string {
	if v.limit == "acceleration" {
		return "This request would exceed your organization's rate limit: its usage is increasing too quickly. " +
			"Please ramp up your traffic gradually and maintain consistent usage patterns."
	}
	return "This request would exceed the rate limit for your organization (org-llmqsim) of " + itoa(v.limitOf) + " " + v.limit +
		". For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. " +
		"Please reduce the prompt length or the maximum tokens requested, or try again later."
}

// messageResponse is the Message answering rq as request n, with bill's
// usage: its text ends at max_tokens, else at one of its stop sequences
// (drawn), else at the end of its turn.
func (s *Server) messageResponse(rq *messagesRequest, n uint64, bill *Bill) []byte {
	var b bytes.Buffer
	b.WriteString(`{"id":`)
	appendJSONString(&b, s.ident("msg_", identAnthropicMessage, n))
	b.WriteString(`,"type":"message","role":"assistant","model":`)
	appendJSONString(&b, rq.model)
	b.WriteString(`,"content":[{"type":"text","text":"`)
	s.writeText(&b, n, 0, bill.OutputTokens)
	b.WriteString(`"}],"stop_reason":`)
	switch {
	case bill.OutputTokens >= rq.maxTokens:
		b.WriteString(`"max_tokens","stop_sequence":null`)
	case len(rq.stops) > 0:
		b.WriteString(`"stop_sequence","stop_sequence":`)
		appendJSONString(&b, rq.stops[int(s.draw(n, drawNoise+5)*float64(len(rq.stops)))])
	default:
		b.WriteString(`"end_turn","stop_sequence":null`)
	}
	b.WriteString(`,"usage":`)
	writeAnthropicUsage(&b, bill, bill.OutputTokens)
	b.WriteString("}\n")
	return b.Bytes()
}

// writeAnthropicUsage writes bill's usage in Anthropic's shape, with output
// output tokens.
func writeAnthropicUsage(b *bytes.Buffer, bill *Bill, output int64) {
	fmt.Fprintf(b, `{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,`+
		`"cache_creation":{"ephemeral_5m_input_tokens":%d,"ephemeral_1h_input_tokens":%d},"output_tokens":%d,"service_tier":"standard"}`,
		bill.InputTokens, bill.CacheWrite5mTokens+bill.CacheWrite1hTokens, bill.CachedTokens,
		bill.CacheWrite5mTokens, bill.CacheWrite1hTokens, output)
}

// message is the part of a Message a stream is cut from.
type message struct {
	ID           string  `json:"id"`
	Model        string  `json:"model"`
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Content      []struct {
		Text string `json:"text"`
	} `json:"content"`
	Usage json.RawMessage `json:"usage"`
}

// messageEvents cuts a Message into the events Anthropic streams:
// message_start (the message without content, its usage with one output
// token), content_block_start, a ping, the text in up to streamParts
// content_block_delta events, content_block_stop, message_delta (the stop
// reason and the final usage), message_stop. A stream that fails midway
// ends with an error event, overloaded_error as Anthropic's example.
func messageEvents(body []byte) (*events, error) {
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	var usage struct {
		OutputTokens int64 `json:"output_tokens"`
	}
	if err := json.Unmarshal(m.Usage, &usage); err != nil {
		return nil, err
	}
	final := bytes.TrimSpace(m.Usage)
	start := bytes.Replace(final, []byte(`"output_tokens":`+itoa(usage.OutputTokens)), []byte(`"output_tokens":1`), 1)
	event := func(name, data string) []byte {
		return []byte("event: " + name + "\ndata: " + data + "\n\n")
	}
	id, _ := json.Marshal(m.ID)
	model, _ := json.Marshal(m.Model)
	stop, _ := json.Marshal(m.StopReason)
	stopSeq, _ := json.Marshal(m.StopSequence)
	ev := &events{}
	ev.head = append(ev.head,
		event("message_start", `{"type":"message_start","message":{"id":`+string(id)+`,"type":"message","role":"assistant","model":`+string(model)+
			`,"content":[],"stop_reason":null,"stop_sequence":null,"usage":`+string(start)+`}}`),
		event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		event("ping", `{"type":"ping"}`))
	text := ""
	if len(m.Content) > 0 {
		text = m.Content[0].Text
	}
	for k, part := range split(text, streamParts) {
		t, _ := json.Marshal(part)
		ev.parts[k] = append(ev.parts[k], event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`+string(t)+`}}`))
	}
	ev.tail = append(ev.tail,
		event("content_block_stop", `{"type":"content_block_stop","index":0}`),
		event("message_delta", `{"type":"message_delta","delta":{"stop_reason":`+string(stop)+`,"stop_sequence":`+string(stopSeq)+`},"usage":`+string(final)+`}`),
		event("message_stop", `{"type":"message_stop"}`))
	ev.failed = event("error", strings.TrimSpace(string(anthropicErrorBody("overloaded_error", "Overloaded", ""))))
	return ev, nil
}
