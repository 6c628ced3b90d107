package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// ParsedRequest is what llmq needs to know about a client's request body to
// admit, reserve and price it.
type ParsedRequest struct {
	// Model is body.model: the name the client asked for.
	Model string
	// MaxTokens is max_tokens or max_completion_tokens (the larger, if both are
	// given); 0 when absent, and the caller substitutes the model's default.
	MaxTokens int64
	// N is the number of choices; 1 when absent. Each choice may use MaxTokens.
	N int64
	// PromptTokens is llmq's estimate of the prompt tokens the provider will
	// count: the content, the per-message overhead, tool definitions, and the
	// safety margin for unknown models. See Estimator.
	PromptTokens int64
	// ContentTokens is the content alone (message text, image allowances,
	// embedding inputs), with no overhead or margin. PromptTokens ≥ ContentTokens.
	ContentTokens int64
	// Inputs is, for embeddings, the number of inputs (one embedding each); 0
	// for chat.
	Inputs int64
	// Encoding is the tokenizer encoding the counts used.
	Encoding string
	// KnownModel is false when Model matched no known tokenizer, so the counts
	// are of the fallback encoding and PromptTokens carries the safety margin.
	KnownModel bool
}

// InvalidRequestError is a request body that can never be sent. Its message
// is for the client and names the offending parameter.
type InvalidRequestError struct {
	// Param is the JSON path of the offending value, e.g. "model",
	// "messages[2].content", "max_tokens", "input".
	Param string
	// Message says what is wrong, naming Param.
	Message string
}

func (e *InvalidRequestError) Error() string { return e.Message }

func invalid(param, format string, args ...any) *InvalidRequestError {
	return &InvalidRequestError{Param: param, Message: fmt.Sprintf(format, args...)}
}

// Limits of the OpenAI API that a request must respect everywhere.
const (
	maxChoices         = 128
	maxEmbeddingInputs = 2048
	maxTokensParam     = math.MaxInt32
)

var validRoles = map[string]bool{
	"system": true, "user": true, "assistant": true, "tool": true, "developer": true, "function": true,
}

// ParseRequest validates a client's request body for endpoint and estimates its
// prompt tokens with the model's tokenizer. Errors are *InvalidRequestError,
// naming the parameter: the body must be a JSON object with a string model;
// chat needs a non-empty messages array of {role, content} with a known role
// and content that is a string or a non-empty array of parts (assistant
// messages may have null content, as when they carry tool calls); max_tokens,
// max_completion_tokens and n must be integers ≥ 1 when present; stream true is
// refused, since llmq stores whole responses; embeddings need input as a
// non-empty string, array of strings, array of token ids or array of arrays of
// token ids. Unknown endpoints are refused. Other fields are left for the
// provider to judge.
func ParseRequest(endpoint string, body []byte) (*ParsedRequest, error) {
	return defaultEstimator.Parse(endpoint, "", "", body)
}

// rawBody holds the fields llmq reads; the rest of the body goes to the
// provider untouched.
type rawBody struct {
	Model               json.RawMessage `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	N                   json.RawMessage `json:"n"`
	Stream              json.RawMessage `json:"stream"`
	Tools               json.RawMessage `json:"tools"`
	Functions           json.RawMessage `json:"functions"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	Input               json.RawMessage `json:"input"`
}

type rawMessage struct {
	Role         json.RawMessage `json:"role"`
	Content      json.RawMessage `json:"content"`
	Name         json.RawMessage `json:"name"`
	ToolCallID   json.RawMessage `json:"tool_call_id"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	FunctionCall json.RawMessage `json:"function_call"`
}

type rawPart struct {
	Type     json.RawMessage `json:"type"`
	Text     json.RawMessage `json:"text"`
	Refusal  json.RawMessage `json:"refusal"`
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

// request is a validated body reduced to what is counted.
type request struct {
	endpoint  string
	model     string
	maxTokens int64
	n         int64
	messages  []message
	tools     json.RawMessage // tools or functions, as sent
	toolsKey  string
	schema    json.RawMessage // response_format of type json_schema
	inputs    []string        // embedding inputs as text
	tokenIDs  int64           // embedding inputs given as token ids
	nInputs   int64
	// previousResponseID is a Responses API body's previous_response_id.
	previousResponseID string
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// jsonInt reads an integer parameter; integral numbers written as 1e3 or
// 100.0 are accepted, fractions are not.
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
	var rb rawBody
	if err := json.Unmarshal(body, &rb); err != nil {
		return nil, invalid("body", "'body' is not valid JSON: %v", err)
	}
	r := &request{endpoint: endpoint, n: 1}
	if isNull(rb.Model) {
		return nil, invalid("model", "'model' is required")
	}
	model, ok := jsonString(rb.Model)
	if !ok || model == "" {
		return nil, invalid("model", "'model' must be a non-empty string")
	}
	r.model = model
	if !isNull(rb.Stream) {
		switch string(rb.Stream) {
		case "false":
		case "true":
			return nil, invalid("stream", "'stream' is not supported: llmq runs requests in the background and stores whole responses")
		default:
			return nil, invalid("stream", "'stream' must be a boolean")
		}
	}
	switch endpoint {
	case EndpointEmbeddings:
		return r, parseInput(r, rb.Input)
	case EndpointResponses:
		var rr rawResponsesBody
		if err := json.Unmarshal(body, &rr); err != nil {
			return nil, invalid("body", "'body' is not valid JSON: %v", err)
		}
		return r, parseResponses(r, &rr)
	}

	mt, hasMT, err := intParam(rb.MaxTokens, "max_tokens", 1, maxTokensParam)
	if err != nil {
		return nil, err
	}
	mct, hasMCT, err := intParam(rb.MaxCompletionTokens, "max_completion_tokens", 1, maxTokensParam)
	if err != nil {
		return nil, err
	}
	if hasMT || hasMCT {
		r.maxTokens = max(mt, mct)
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
		if json.Unmarshal(rb.ResponseFormat, &rf) == nil && rf.Type == "json_schema" {
			r.schema = rf.JSONSchema
		}
	}
	return r, nil
}

func parseMessages(r *request, raw json.RawMessage) error {
	if isNull(raw) {
		return invalid("messages", "'messages' is required")
	}
	var msgs []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &msgs) != nil {
		return invalid("messages", "'messages' must be an array of message objects")
	}
	if len(msgs) == 0 {
		return invalid("messages", "'messages' must not be empty")
	}
	r.messages = make([]message, len(msgs))
	for i, mraw := range msgs {
		p := "messages[" + strconv.Itoa(i) + "]"
		var rm rawMessage
		if len(mraw) == 0 || mraw[0] != '{' || json.Unmarshal(mraw, &rm) != nil {
			return invalid(p, "'%s' must be an object", p)
		}
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
		if err := parseContent(m, rm.Content, p+".content"); err != nil {
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
				Function struct{ Name, Arguments string } `json:"function"`
			}
			if json.Unmarshal(rm.ToolCalls, &calls) == nil {
				for _, c := range calls {
					m.extra = append(m.extra, c.Function.Name, c.Function.Arguments)
				}
			}
		}
		if !isNull(rm.FunctionCall) {
			var fc struct{ Name, Arguments string }
			if json.Unmarshal(rm.FunctionCall, &fc) == nil {
				m.extra = append(m.extra, fc.Name, fc.Arguments)
			}
		}
	}
	return nil
}

func parseContent(m *message, raw json.RawMessage, p string) error {
	switch {
	case isNull(raw):
		// An assistant turn that only called tools has no content.
		if m.role == "assistant" {
			return nil
		}
		return invalid(p, "'%s' is required for %s messages", p, m.role)
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
	var parts []rawPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return invalid(p, "'%s' must be a string or an array of content part objects", p)
	}
	if len(parts) == 0 {
		return invalid(p, "'%s' must not be an empty array", p)
	}
	for j, part := range parts {
		pp := p + "[" + strconv.Itoa(j) + "]"
		typ, ok := jsonString(part.Type)
		if !ok || typ == "" {
			return invalid(pp+".type", "'%s.type' must be a non-empty string", pp)
		}
		switch typ {
		case "text":
			s, ok := jsonString(part.Text)
			if !ok {
				return invalid(pp+".text", "'%s.text' must be a string", pp)
			}
			m.texts = append(m.texts, s)
		case "refusal":
			s, ok := jsonString(part.Refusal)
			if !ok {
				return invalid(pp+".refusal", "'%s.refusal' must be a string", pp)
			}
			m.texts = append(m.texts, s)
		case "image_url":
			var img struct {
				URL    string `json:"url"`
				Detail string `json:"detail"`
			}
			if isNull(part.ImageURL) || json.Unmarshal(part.ImageURL, &img) != nil || img.URL == "" {
				return invalid(pp+".image_url", "'%s.image_url' must be an object with a url", pp)
			}
			m.media = append(m.media, img.Detail)
		default:
			// Audio, files and whatever comes next: counted with the flat
			// media allowance, judged by the provider.
			m.media = append(m.media, "")
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
	if err := json.Unmarshal(raw, &strs); err == nil {
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
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return invalid("input", "'input' must not be an empty array")
		}
		for i, id := range ids {
			if id < 0 {
				return invalid(fmt.Sprintf("input[%d]", i), "'input[%d]' must be a token id (a non-negative integer)", i)
			}
		}
		r.tokenIDs, r.nInputs = int64(len(ids)), 1
		return nil
	}
	var lists [][]int64
	if err := json.Unmarshal(raw, &lists); err == nil {
		if len(lists) == 0 {
			return invalid("input", "'input' must not be an empty array")
		}
		if len(lists) > maxEmbeddingInputs {
			return invalid("input", "'input' must have at most %d items, got %d", maxEmbeddingInputs, len(lists))
		}
		for i, l := range lists {
			if len(l) == 0 {
				return invalid(fmt.Sprintf("input[%d]", i), "'input[%d]' must be a non-empty array of token ids", i)
			}
			for j, id := range l {
				if id < 0 {
					return invalid(fmt.Sprintf("input[%d][%d]", i, j), "'input[%d][%d]' must be a token id (a non-negative integer)", i, j)
				}
			}
			r.tokenIDs += int64(len(l))
		}
		r.nInputs = int64(len(lists))
		return nil
	}
	return invalid("input", what)
}
