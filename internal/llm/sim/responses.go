package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// The Responses API (POST /v1/responses): a call is admitted, charged and
// refunded exactly as a chat completion (its prompt plus max_output_tokens,
// or the model's default max tokens), and answered with a response object
// holding one assistant message (after the built-in tool calls it made, in
// worst-case mode). A response is stored, unless the request
// says "store": false, so that GET /v1/responses/{id} finds it and a later
// request may name it as its previous_response_id: the provider then counts
// the earlier turns (the previous response's input and output tokens) in the
// follow-up's prompt, at admission and in its usage; an input item of type
// item_reference naming one of its output items adds its whole output.

// responsesRequest is what the simulator reads of a Responses API body
// beyond what llm's parser counts and what decides its bill (terms): the
// fields a response echoes, and those that change how it is answered, read
// by their exact names.
type responsesRequest struct {
	Background         json.RawMessage
	PreviousResponseID json.RawMessage
	Store              json.RawMessage
	Instructions       json.RawMessage
	MaxOutputTokens    json.RawMessage
	MaxToolCalls       json.RawMessage
	ParallelToolCalls  json.RawMessage
	PromptCacheKey     json.RawMessage
	Reasoning          json.RawMessage
	SafetyIdentifier   json.RawMessage
	ServiceTier        json.RawMessage
	Temperature        json.RawMessage
	Text               json.RawMessage
	ToolChoice         json.RawMessage
	Tools              json.RawMessage
	TopLogprobs        json.RawMessage
	TopP               json.RawMessage
	Truncation         json.RawMessage
	User               json.RawMessage
	Metadata           json.RawMessage

	// store is whether its response is stored.
	store bool
}

// The JSON kinds of echoed fields.
const (
	kindNumber = 1 << iota
	kindString
	kindBool
	kindObject
	kindArray
)

// readResponsesRequest reads the members of a body a response echoes,
// checking their JSON kinds as OpenAI does; nil and no refusal for a body
// that is not a JSON object (the parser refuses it).
func readResponsesRequest(m members) (*responsesRequest, *refusal) {
	if m == nil {
		return nil, nil
	}
	var rq responsesRequest
	for _, f := range []struct {
		name  string
		to    *json.RawMessage
		kinds int // 0: echoed as it is
		want  string
	}{
		{"background", &rq.Background, kindBool, "a boolean"},
		{"previous_response_id", &rq.PreviousResponseID, 0, ""},
		{"store", &rq.Store, kindBool, "a boolean"},
		{"instructions", &rq.Instructions, 0, ""},
		{"max_output_tokens", &rq.MaxOutputTokens, 0, ""},
		{"max_tool_calls", &rq.MaxToolCalls, kindNumber, "an integer"},
		{"parallel_tool_calls", &rq.ParallelToolCalls, kindBool, "a boolean"},
		{"prompt_cache_key", &rq.PromptCacheKey, kindString, "a string"},
		{"reasoning", &rq.Reasoning, kindObject, "an object"},
		{"safety_identifier", &rq.SafetyIdentifier, kindString, "a string"},
		{"service_tier", &rq.ServiceTier, kindString, "a string"},
		{"temperature", &rq.Temperature, kindNumber, "a decimal"},
		{"text", &rq.Text, kindObject, "an object"},
		{"tool_choice", &rq.ToolChoice, kindString | kindObject, "a string or an object"},
		{"tools", &rq.Tools, kindArray, "an array"},
		{"top_logprobs", &rq.TopLogprobs, kindNumber, "an integer"},
		{"top_p", &rq.TopP, kindNumber, "a decimal"},
		{"truncation", &rq.Truncation, kindString, "a string"},
		{"user", &rq.User, kindString, "a string"},
		{"metadata", &rq.Metadata, kindObject, "an object"},
	} {
		*f.to = m[f.name]
		if k := jsonKind(*f.to); f.kinds != 0 && k != 0 && k&f.kinds == 0 {
			return nil, invalidType(f.name, f.want, k)
		}
	}
	if string(rq.Background) == "true" {
		return nil, &refusal{http.StatusBadRequest, "The simulator does not run responses in the background: 'background' must be false.",
			"invalid_request_error", "background", "unsupported_value"}
	}
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
	Output             []json.RawMessage  `json:"output"`
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

// toolCallItem is an output item of a built-in tool's call, in the shape of
// its type (web_search_call, file_search_call, code_interpreter_call,
// image_generation_call); the members another type lacks are left out.
type toolCallItem struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	Status      string          `json:"status"`
	Action      json.RawMessage `json:"action,omitempty"`
	Code        *string         `json:"code,omitempty"`
	ContainerID string          `json:"container_id,omitempty"`
	Outputs     json.RawMessage `json:"outputs,omitempty"`
	Queries     []string        `json:"queries,omitempty"`
	Results     json.RawMessage `json:"results,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
}

// toolCallPrefixes are the id prefixes of the built-in tools' calls.
var toolCallPrefixes = map[string]string{ToolWebSearch: "ws_", ToolFileSearch: "fs_", ToolCodeInterpreter: "ci_", ToolImageGeneration: "ig_"}

// toolCall is the j-th built-in tool call of request n, to a tool of kind.
func (s *Server) toolCall(kind string, n uint64, j int) toolCallItem {
	id := s.ident(toolCallPrefixes[kind], identToolCall, mix64(n)+uint64(j))
	item := toolCallItem{ID: id, Type: kind + "_call", Status: "completed"}
	null := json.RawMessage("null")
	switch kind {
	case ToolWebSearch:
		item.Action = json.RawMessage(`{"type":"search","query":"search ` + strconv.Itoa(j+1) + `"}`)
	case ToolFileSearch:
		item.Queries, item.Results = []string{"search " + strconv.Itoa(j+1)}, null
	case ToolCodeInterpreter:
		code := "print(" + strconv.Itoa(j+1) + ")"
		item.Code, item.ContainerID, item.Outputs = &code, "cntr_"+id[len("ci_"):], null
	case ToolImageGeneration:
		item.Result = null
	}
	return item
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

// responsesResponse is the response object answering c as request n at
// now with b's usage (b gets its id): the built-in tool calls of calls, in
// order, then a message of b.OutputTokens. It stores it unless the request
// said "store": false.
func (s *Server) responsesResponse(c *call, n uint64, now time.Time, b *Bill, calls []string) []byte {
	rq := c.responses
	var text bytes.Buffer
	if echo := s.echo(c.body); echo != "" {
		text.WriteString(echo + " ")
	}
	s.writeText(&text, n, 0, b.OutputTokens)
	created := now.Unix()
	msg := outputMessage{ID: s.ident("msg_", identMessage, n), Type: "message", Status: "completed", Role: "assistant",
		Content: []outputText{{Type: "output_text", Annotations: []struct{}{}, Logprobs: []struct{}{}, Text: text.String()}}}
	tier, _ := json.Marshal(b.ServiceTier)
	o := responseObject{
		ID: s.ident("resp_", identResponse, n), Object: "response", CreatedAt: created, Status: "completed", CompletedAt: &created,
		Instructions: rq.Instructions, MaxOutputTokens: rq.MaxOutputTokens, MaxToolCalls: rq.MaxToolCalls, Model: c.p.Model,
		ParallelToolCalls: or(rq.ParallelToolCalls, "true"), PreviousResponseID: rq.PreviousResponseID, PromptCacheKey: rq.PromptCacheKey,
		Reasoning: or(rq.Reasoning, `{"effort":null,"summary":null}`), SafetyIdentifier: rq.SafetyIdentifier,
		ServiceTier: tier, Store: rq.store, Temperature: or(rq.Temperature, "1.0"),
		Text: or(rq.Text, `{"format":{"type":"text"},"verbosity":"medium"}`), ToolChoice: or(rq.ToolChoice, `"auto"`),
		Tools: or(rq.Tools, "[]"), TopLogprobs: or(rq.TopLogprobs, "0"), TopP: or(rq.TopP, "1.0"),
		Truncation: or(rq.Truncation, `"disabled"`), User: rq.User, Metadata: or(rq.Metadata, "{}"),
		Usage: &responseUsage{InputTokens: b.InputTokens, OutputTokens: b.OutputTokens, TotalTokens: b.InputTokens + b.OutputTokens},
	}
	b.ResponseID = o.ID
	if b.OutputTokens >= c.maxTokens {
		o.Status, o.CompletedAt, msg.Status = "incomplete", nil, "incomplete"
		o.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	items := make([]string, 0, len(calls)+1)
	for j, kind := range calls {
		item := s.toolCall(kind, n, j)
		raw, _ := json.Marshal(item)
		o.Output = append(o.Output, raw)
		items = append(items, item.ID)
	}
	raw, _ := json.Marshal(msg)
	o.Output = append(o.Output, raw)
	items = append(items, msg.ID)
	body, _ := json.Marshal(o)
	if rq.store {
		// The conversation a follow-up continues: the prompt, each tool
		// call's result, and the output.
		s.responses.put(o.ID, body, c.prompt+int64(len(calls))*s.cfg.ToolResultTokens, b.OutputTokens, items)
	}
	if s.omitsUsage(n) {
		o.Usage = nil
		body, _ = json.Marshal(o)
	}
	return append(body, '\n')
}

// responsesContext is OpenAI's 400 for a response whose prompt and output
// bound pass its model's context window.
func responsesContext() *refusal {
	return &refusal{http.StatusBadRequest, "Your input exceeds the context window of this model. Please adjust your input and try again.",
		"invalid_request_error", "input", "context_length_exceeded"}
}

// storedResponse is a response kept for GET /v1/responses/{id} and for
// requests that continue it or name its items.
type storedResponse struct {
	body          []byte // the response object, with its usage
	input, output int64
	items         []string // the ids of its output items
}

// responseStore keeps the last size stored responses.
type responseStore struct {
	mu     sync.Mutex
	size   int
	byID   map[string]*storedResponse
	byItem map[string]string // output item id → response id
	ring   []string          // ids in the order stored; next is the oldest once full
	next   int
}

func newResponseStore(size int) *responseStore {
	return &responseStore{size: size, byID: make(map[string]*storedResponse), byItem: make(map[string]string)}
}

func (rs *responseStore) put(id string, body []byte, input, output int64, items []string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.size <= 0 {
		return
	}
	if len(rs.ring) < rs.size {
		rs.ring = append(rs.ring, id)
	} else {
		rs.removeLocked(rs.ring[rs.next])
		rs.ring[rs.next] = id
		rs.next = (rs.next + 1) % rs.size
	}
	rs.byID[id] = &storedResponse{body: body, input: input, output: output, items: items}
	for _, item := range items {
		rs.byItem[item] = id
	}
}

func (rs *responseStore) get(id string) *storedResponse {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.byID[id]
}

// item returns the stored response that output item id belongs to.
func (rs *responseStore) item(id string) *storedResponse {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.byID[rs.byItem[id]]
}

func (rs *responseStore) remove(id string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.removeLocked(id)
}

func (rs *responseStore) removeLocked(id string) bool {
	stored, ok := rs.byID[id]
	if !ok {
		return false
	}
	for _, item := range stored.items {
		delete(rs.byItem, item)
	}
	delete(rs.byID, id)
	return true
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

// referencedTokens is what the provider adds to the prompt of a request
// whose input names the stored output item id (an item_reference): the
// whole output of the response it belongs to, at worst; OpenAI's 400 for an
// item it does not know.
func (s *Server) referencedTokens(id string) (int64, *refusal) {
	stored := s.responses.item(id)
	if stored == nil {
		return 0, &refusal{http.StatusBadRequest, "Item with id '" + id + "' not found. Items are not persisted when `store` is set to false. " +
			"Try again with `store` set to true, or remove this item from your input.", "invalid_request_error", "input", ""}
	}
	return stored.output, nil
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
	Item           any             `json:"item,omitempty"`
	Part           *outputText     `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
	Logprobs       *[]struct{}     `json:"logprobs,omitempty"`
}

// responsesEvents cuts a response object into the events OpenAI streams it
// in, each as "event: <type>" and "data: <JSON>": response.created and
// response.in_progress (the response in progress, no output, no usage);
// for each built-in tool call, response.output_item.added (the call in
// progress), response.<type>.completed and response.output_item.done;
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
	last := len(o.Output) - 1
	var msg outputMessage
	if last < 0 || json.Unmarshal(o.Output[last], &msg) != nil || msg.Type != "message" || len(msg.Content) != 1 {
		return nil, errors.New("a response that ends with a message of one part")
	}
	calls := make([]toolCallItem, last)
	for j := range calls {
		if err := json.Unmarshal(o.Output[j], &calls[j]); err != nil {
			return nil, err
		}
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
	part := msg.Content[0]
	started := o
	started.Status, started.CompletedAt, started.IncompleteDetails, started.Output, started.Usage = "in_progress", nil, nil, []json.RawMessage{}, nil
	added := msg
	added.Status, added.Content = "in_progress", []outputText{}
	empty := part
	empty.Text = ""
	ev := &events{}
	ev.head = [][]byte{
		event(responseEvent{Type: "response.created", Response: &started}),
		event(responseEvent{Type: "response.in_progress", Response: &started}),
	}
	for j, item := range calls {
		running := item
		running.Status = "in_progress"
		ev.head = append(ev.head,
			event(responseEvent{Type: "response.output_item.added", OutputIndex: &j, Item: running}),
			event(responseEvent{Type: "response." + item.Type + ".completed", ItemID: item.ID, OutputIndex: &j}),
			event(responseEvent{Type: "response.output_item.done", OutputIndex: &j, Item: item}))
	}
	ev.head = append(ev.head,
		event(responseEvent{Type: "response.output_item.added", OutputIndex: &last, Item: &added}),
		event(responseEvent{Type: "response.content_part.added", ItemID: msg.ID, OutputIndex: &last, ContentIndex: &zero, Part: &empty}),
	)
	for k, delta := range split(part.Text, streamParts) {
		ev.parts[k] = [][]byte{event(responseEvent{Type: "response.output_text.delta", ItemID: msg.ID, OutputIndex: &last, ContentIndex: &zero,
			Delta: &delta, Logprobs: &noLogprobs})}
	}
	end := "response.completed"
	if o.Status == "incomplete" {
		end = "response.incomplete"
	}
	ev.tail = [][]byte{
		event(responseEvent{Type: "response.output_text.done", ItemID: msg.ID, OutputIndex: &last, ContentIndex: &zero, Text: &part.Text, Logprobs: &noLogprobs}),
		event(responseEvent{Type: "response.content_part.done", ItemID: msg.ID, OutputIndex: &last, ContentIndex: &zero, Part: &part}),
		event(responseEvent{Type: "response.output_item.done", OutputIndex: &last, Item: &msg}),
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
