package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// The Responses API (POST /v1/responses): a call is admitted, charged and
// refunded exactly as a chat completion (its prompt plus max_output_tokens,
// or the model's default max tokens), and answered with a response object
// holding one assistant message. A response is stored, unless the request
// says "store": false, so that GET /v1/responses/{id} finds it and a later
// request may name it as its previous_response_id: the provider then counts
// the earlier turns (the previous response's input and output tokens) in the
// follow-up's prompt, at admission and in its usage.

// responsesRequest is what the simulator reads of a Responses API body
// beyond what llm's parser counts: the fields a response echoes, and those
// that change how it is answered.
type responsesRequest struct {
	Background         json.RawMessage `json:"background"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Store              json.RawMessage `json:"store"`
	Instructions       json.RawMessage `json:"instructions"`
	MaxOutputTokens    json.RawMessage `json:"max_output_tokens"`
	MaxToolCalls       json.RawMessage `json:"max_tool_calls"`
	ParallelToolCalls  json.RawMessage `json:"parallel_tool_calls"`
	PromptCacheKey     json.RawMessage `json:"prompt_cache_key"`
	Reasoning          json.RawMessage `json:"reasoning"`
	SafetyIdentifier   json.RawMessage `json:"safety_identifier"`
	ServiceTier        json.RawMessage `json:"service_tier"`
	Temperature        json.RawMessage `json:"temperature"`
	Text               json.RawMessage `json:"text"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              json.RawMessage `json:"tools"`
	TopLogprobs        json.RawMessage `json:"top_logprobs"`
	TopP               json.RawMessage `json:"top_p"`
	Truncation         json.RawMessage `json:"truncation"`
	User               json.RawMessage `json:"user"`
	Metadata           json.RawMessage `json:"metadata"`

	// previous is the id the request continues, "" for none; store whether
	// its response is stored.
	previous string
	store    bool
}

// The JSON kinds of echoed fields.
const (
	kindNumber = 1 << iota
	kindString
	kindBool
	kindObject
	kindArray
)

// readResponsesRequest reads the fields of body a response echoes, checking
// their JSON kinds as OpenAI does; nil and no refusal for a body that is not
// a JSON object (the parser refuses it).
func readResponsesRequest(body []byte) (*responsesRequest, *refusal) {
	var rq responsesRequest
	if json.Unmarshal(body, &rq) != nil {
		return nil, nil
	}
	for _, f := range []struct {
		name  string
		raw   json.RawMessage
		kinds int
		want  string
	}{
		{"background", rq.Background, kindBool, "a boolean"},
		{"store", rq.Store, kindBool, "a boolean"},
		{"max_tool_calls", rq.MaxToolCalls, kindNumber, "an integer"},
		{"parallel_tool_calls", rq.ParallelToolCalls, kindBool, "a boolean"},
		{"prompt_cache_key", rq.PromptCacheKey, kindString, "a string"},
		{"reasoning", rq.Reasoning, kindObject, "an object"},
		{"safety_identifier", rq.SafetyIdentifier, kindString, "a string"},
		{"service_tier", rq.ServiceTier, kindString, "a string"},
		{"temperature", rq.Temperature, kindNumber, "a decimal"},
		{"text", rq.Text, kindObject, "an object"},
		{"tool_choice", rq.ToolChoice, kindString | kindObject, "a string or an object"},
		{"tools", rq.Tools, kindArray, "an array"},
		{"top_logprobs", rq.TopLogprobs, kindNumber, "an integer"},
		{"top_p", rq.TopP, kindNumber, "a decimal"},
		{"truncation", rq.Truncation, kindString, "a string"},
		{"user", rq.User, kindString, "a string"},
		{"metadata", rq.Metadata, kindObject, "an object"},
	} {
		if k := jsonKind(f.raw); k != 0 && k&f.kinds == 0 {
			return nil, &refusal{http.StatusBadRequest, "Invalid type for '" + f.name + "': expected " + f.want + ", but got " + kindName(k) + " instead.",
				"invalid_request_error", f.name, "invalid_type"}
		}
	}
	if string(rq.Background) == "true" {
		return nil, &refusal{http.StatusBadRequest, "The simulator does not run responses in the background: 'background' must be false.",
			"invalid_request_error", "background", "unsupported_value"}
	}
	_ = json.Unmarshal(rq.PreviousResponseID, &rq.previous)
	rq.store = string(rq.Store) != "false"
	return &rq, nil
}

// jsonKind is the kind of a JSON value; 0 for none or null.
func jsonKind(raw json.RawMessage) int {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	switch raw[0] {
	case 'n':
		return 0
	case '"':
		return kindString
	case 't', 'f':
		return kindBool
	case '{':
		return kindObject
	case '[':
		return kindArray
	}
	return kindNumber
}

func kindName(k int) string {
	switch k {
	case kindString:
		return "a string"
	case kindBool:
		return "a boolean"
	case kindObject:
		return "an object"
	case kindArray:
		return "an array"
	}
	return "a number"
}

// or is raw, or def when the request left it out or null.
func or(raw json.RawMessage, def string) json.RawMessage {
	if jsonKind(raw) == 0 {
		return json.RawMessage(def)
	}
	return raw
}

// responseObject is OpenAI's response object, its fields in OpenAI's order.
// Absent (nil) raw fields are null.
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Background         bool               `json:"background"`
	CompletedAt        *int64             `json:"completed_at"`
	Error              json.RawMessage    `json:"error"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       json.RawMessage    `json:"instructions"`
	MaxOutputTokens    json.RawMessage    `json:"max_output_tokens"`
	MaxToolCalls       json.RawMessage    `json:"max_tool_calls"`
	Model              string             `json:"model"`
	Output             []outputMessage    `json:"output"`
	ParallelToolCalls  json.RawMessage    `json:"parallel_tool_calls"`
	PreviousResponseID json.RawMessage    `json:"previous_response_id"`
	PromptCacheKey     json.RawMessage    `json:"prompt_cache_key"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	SafetyIdentifier   json.RawMessage    `json:"safety_identifier"`
	ServiceTier        json.RawMessage    `json:"service_tier"`
	Store              bool               `json:"store"`
	Temperature        json.RawMessage    `json:"temperature"`
	Text               json.RawMessage    `json:"text"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopLogprobs        json.RawMessage    `json:"top_logprobs"`
	TopP               json.RawMessage    `json:"top_p"`
	Truncation         json.RawMessage    `json:"truncation"`
	Usage              *responseUsage     `json:"usage"`
	User               json.RawMessage    `json:"user"`
	Metadata           json.RawMessage    `json:"metadata"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

// outputMessage is an output item of type message.
type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
}

// outputText is a message's content part of type output_text.
type outputText struct {
	Type        string     `json:"type"`
	Annotations []struct{} `json:"annotations"`
	Logprobs    []struct{} `json:"logprobs"`
	Text        string     `json:"text"`
}

// responseUsage is a response's usage, the Responses API's names.
type responseUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// responsesResponse is the response object answering c as request n at now,
// with completion output tokens; it stores it unless the request said
// "store": false.
func (s *Server) responsesResponse(c *call, n uint64, now time.Time, completion int64) []byte {
	rq := c.responses
	var text bytes.Buffer
	if echo := s.echo(c.body); echo != "" {
		text.WriteString(echo + " ")
	}
	s.writeText(&text, n, 0, completion)
	created := now.Unix()
	msg := outputMessage{ID: s.ident("msg_", identMessage, n), Type: "message", Status: "completed", Role: "assistant",
		Content: []outputText{{Type: "output_text", Annotations: []struct{}{}, Logprobs: []struct{}{}, Text: text.String()}}}
	o := responseObject{
		ID: s.ident("resp_", identResponse, n), Object: "response", CreatedAt: created, Status: "completed", CompletedAt: &created,
		Instructions: rq.Instructions, MaxOutputTokens: rq.MaxOutputTokens, MaxToolCalls: rq.MaxToolCalls, Model: c.p.Model,
		ParallelToolCalls: or(rq.ParallelToolCalls, "true"), PreviousResponseID: rq.PreviousResponseID, PromptCacheKey: rq.PromptCacheKey,
		Reasoning: or(rq.Reasoning, `{"effort":null,"summary":null}`), SafetyIdentifier: rq.SafetyIdentifier,
		ServiceTier: json.RawMessage(`"default"`), Store: rq.store, Temperature: or(rq.Temperature, "1.0"),
		Text: or(rq.Text, `{"format":{"type":"text"},"verbosity":"medium"}`), ToolChoice: or(rq.ToolChoice, `"auto"`),
		Tools: or(rq.Tools, "[]"), TopLogprobs: or(rq.TopLogprobs, "0"), TopP: or(rq.TopP, "1.0"),
		Truncation: or(rq.Truncation, `"disabled"`), User: rq.User, Metadata: or(rq.Metadata, "{}"),
		Usage: &responseUsage{InputTokens: c.prompt, OutputTokens: completion, TotalTokens: c.prompt + completion},
	}
	if tier := strings.Trim(string(rq.ServiceTier), `"`); jsonKind(rq.ServiceTier) != 0 && tier != "auto" {
		o.ServiceTier = rq.ServiceTier
	}
	if completion >= c.maxTokens {
		o.Status, o.CompletedAt, msg.Status = "incomplete", nil, "incomplete"
		o.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	o.Output = []outputMessage{msg}
	body, _ := json.Marshal(o)
	if rq.store {
		s.responses.put(o.ID, body, c.prompt, completion)
	}
	if s.omitsUsage(n) {
		o.Usage = nil
		body, _ = json.Marshal(o)
	}
	s.count(func(st *Stats) {
		st.PromptTokens += c.prompt
		st.CompletionTokens += completion
	})
	return append(body, '\n')
}

// responsesContext is OpenAI's 400 for a response whose prompt and output
// bound pass its model's context window.
func responsesContext() *refusal {
	return &refusal{http.StatusBadRequest, "Your input exceeds the context window of this model. Please adjust your input and try again.",
		"invalid_request_error", "input", "context_length_exceeded"}
}

// storedResponse is a response kept for GET /v1/responses/{id} and for
// requests that continue it.
type storedResponse struct {
	body          []byte // the response object, with its usage
	input, output int64
}

// responseStore keeps the last size stored responses.
type responseStore struct {
	mu   sync.Mutex
	size int
	byID map[string]*storedResponse
	ring []string // ids in the order stored; next is the oldest once full
	next int
}

func newResponseStore(size int) *responseStore {
	return &responseStore{size: size, byID: make(map[string]*storedResponse)}
}

func (rs *responseStore) put(id string, body []byte, input, output int64) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.size <= 0 {
		return
	}
	if len(rs.ring) < rs.size {
		rs.ring = append(rs.ring, id)
	} else {
		delete(rs.byID, rs.ring[rs.next])
		rs.ring[rs.next] = id
		rs.next = (rs.next + 1) % rs.size
	}
	rs.byID[id] = &storedResponse{body: body, input: input, output: output}
}

func (rs *responseStore) get(id string) *storedResponse {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.byID[id]
}

func (rs *responseStore) remove(id string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	_, ok := rs.byID[id]
	delete(rs.byID, id)
	return ok
}

// previousTokens is what the provider adds to the prompt of a request that
// continues the stored response id: its input and output; a 400 for an id
// it does not know.
func (s *Server) previousTokens(id string) (int64, *refusal) {
	prev := s.responses.get(id)
	if prev == nil {
		return 0, &refusal{http.StatusBadRequest, "Previous response with id '" + id + "' not found.",
			"invalid_request_error", "previous_response_id", "previous_response_not_found"}
	}
	return prev.input + prev.output, nil
}

// handleResponses adds the Responses API's calls on stored responses to mux:
// GET and DELETE /v1/responses/{id} and POST /v1/responses/{id}/cancel,
// OpenAI's under /v1, Azure OpenAI's under /openai/v1 and /openai (with
// api-version).
func (s *Server) handleResponses(mux *http.ServeMux) {
	for _, p := range []struct {
		prefix string
		d      dialect
	}{{"/v1", dialect{}}, {"/openai/v1", dialect{azure: true}}, {"/openai", dialect{azure: true, needVersion: true}}} {
		for _, route := range []struct {
			pattern string
			h       func(http.ResponseWriter, *http.Request, *storedResponse)
		}{
			{"GET " + p.prefix + "/responses/{id}", s.serveResponseGet},
			{"DELETE " + p.prefix + "/responses/{id}", s.serveResponseDelete},
			{"POST " + p.prefix + "/responses/{id}/cancel", s.serveResponseCancel},
		} {
			mux.HandleFunc(route.pattern, s.batchAPI(p.d, func(w http.ResponseWriter, r *http.Request, _ dialect) {
				id := r.PathValue("id")
				stored := s.responses.get(id)
				if stored == nil {
					apiError(w, http.StatusNotFound, "Response with id '"+id+"' not found.", "invalid_request_error", "", "")
					return
				}
				route.h(w, r, stored)
			}))
		}
	}
	mux.HandleFunc("POST /openai/responses", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("api-version") == "" {
			apiError(w, http.StatusNotFound, "Resource not found", "", "", "404")
			return
		}
		r = r.Clone(r.Context())
		r.URL.Path = llm.EndpointResponses
		s.serveCompletion(w, r)
	})
}

// serveResponseGet serves GET /v1/responses/{id}: the stored response.
func (s *Server) serveResponseGet(w http.ResponseWriter, _ *http.Request, stored *storedResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(stored.body)
	_, _ = w.Write([]byte("\n"))
}

// serveResponseDelete serves DELETE /v1/responses/{id}.
func (s *Server) serveResponseDelete(w http.ResponseWriter, r *http.Request, _ *storedResponse) {
	id := r.PathValue("id")
	s.responses.remove(id)
	writeJSON(w, http.StatusOK, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "response.deleted", true})
}

// serveResponseCancel serves POST /v1/responses/{id}/cancel: only a
// response created in the background can be cancelled, and the simulator
// runs none, so OpenAI's 400 for a synchronous one.
func (s *Server) serveResponseCancel(w http.ResponseWriter, _ *http.Request, _ *storedResponse) {
	apiError(w, http.StatusBadRequest, "Cannot cancel a synchronous response.", "invalid_request_error", "", "")
}

// responseEvent is one event of a streamed response, its fields in OpenAI's
// order; those an event type lacks are left out.
type responseEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *responseObject `json:"response,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	Item           *outputMessage  `json:"item,omitempty"`
	Part           *outputText     `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
	Logprobs       *[]struct{}     `json:"logprobs,omitempty"`
}

// responsesEvents cuts a response object into the events OpenAI streams it
// in, each as "event: <type>" and "data: <JSON>": response.created and
// response.in_progress (the response in progress, no output, no usage),
// response.output_item.added and response.content_part.added (the message
// and its output_text part, empty), the text in up to streamParts
// response.output_text.delta events, then response.output_text.done,
// response.content_part.done, response.output_item.done and
// response.completed (or response.incomplete) with the whole response and
// its usage. There is no [DONE]. A stream that fails after its first delta
// ends with an error event when errorEvent is set, else response.failed.
func responsesEvents(body []byte, errorEvent bool) (*events, error) {
	var o responseObject
	if err := json.Unmarshal(body, &o); err != nil {
		return nil, err
	}
	if len(o.Output) != 1 || len(o.Output[0].Content) != 1 {
		return nil, errors.New("a response of one message of one part")
	}
	seq := 0
	event := func(e responseEvent) []byte {
		e.SequenceNumber = seq
		seq++
		data, _ := json.Marshal(e)
		var b bytes.Buffer
		b.WriteString("event: ")
		b.WriteString(e.Type)
		b.WriteString("\ndata: ")
		b.Write(data)
		b.WriteString("\n\n")
		return b.Bytes()
	}
	zero := 0
	noLogprobs := []struct{}{}
	msg, part := o.Output[0], o.Output[0].Content[0]
	started := o
	started.Status, started.CompletedAt, started.IncompleteDetails, started.Output, started.Usage = "in_progress", nil, nil, []outputMessage{}, nil
	added := msg
	added.Status, added.Content = "in_progress", []outputText{}
	empty := part
	empty.Text = ""
	ev := &events{}
	ev.head = [][]byte{
		event(responseEvent{Type: "response.created", Response: &started}),
		event(responseEvent{Type: "response.in_progress", Response: &started}),
		event(responseEvent{Type: "response.output_item.added", OutputIndex: &zero, Item: &added}),
		event(responseEvent{Type: "response.content_part.added", ItemID: msg.ID, OutputIndex: &zero, ContentIndex: &zero, Part: &empty}),
	}
	for k, delta := range split(part.Text, streamParts) {
		ev.parts[k] = [][]byte{event(responseEvent{Type: "response.output_text.delta", ItemID: msg.ID, OutputIndex: &zero, ContentIndex: &zero,
			Delta: &delta, Logprobs: &noLogprobs})}
	}
	end := "response.completed"
	if o.Status == "incomplete" {
		end = "response.incomplete"
	}
	ev.tail = [][]byte{
		event(responseEvent{Type: "response.output_text.done", ItemID: msg.ID, OutputIndex: &zero, ContentIndex: &zero, Text: &part.Text, Logprobs: &noLogprobs}),
		event(responseEvent{Type: "response.content_part.done", ItemID: msg.ID, OutputIndex: &zero, ContentIndex: &zero, Part: &part}),
		event(responseEvent{Type: "response.output_item.done", OutputIndex: &zero, Item: &msg}),
		event(responseEvent{Type: end, Response: &o}),
	}
	// A stream that fails midway ends with an error event, or with
	// response.failed: the response failed, its error, no usage.
	seq = len(ev.head) + 1
	if errorEvent {
		ev.failed = fmt.Appendf(nil, "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":%q,\"param\":null,\"sequence_number\":%d}\n\n",
			streamErrorMessage, seq)
	} else {
		failed := started
		failed.Status = "failed"
		failed.Error = json.RawMessage(`{"code":"server_error","message":"` + streamErrorMessage + `"}`)
		ev.failed = event(responseEvent{Type: "response.failed", Response: &failed})
	}
	return ev, nil
}
