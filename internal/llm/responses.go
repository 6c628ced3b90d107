package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/llmq/llmq/client"
)

// rawResponsesBody holds the members of a Responses API body llmq reads;
// parseResponses reduces it to messages: instructions as a system message,
// then the input (items llmq does not model counted as their JSON text).
type rawResponsesBody struct {
	bodyHead
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions"`
	MaxOutputTokens    json.RawMessage `json:"max_output_tokens"`
	Background         json.RawMessage `json:"background"`
	Tools              json.RawMessage `json:"tools"`
	Text               json.RawMessage `json:"text"`
	Prompt             json.RawMessage `json:"prompt"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Conversation       json.RawMessage `json:"conversation"`
	Store              json.RawMessage `json:"store"`
	ServiceTier        json.RawMessage `json:"service_tier"`
	MaxToolCalls       json.RawMessage `json:"max_tool_calls"`
}

type rawItem struct {
	Type      json.RawMessage `json:"type"`
	Role      json.RawMessage `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      json.RawMessage `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	CallID    json.RawMessage `json:"call_id"`
	Output    json.RawMessage `json:"output"`
	Summary   json.RawMessage `json:"summary"`
	ID        json.RawMessage `json:"id"`
	Other     otherMembers    `json:",unknown"`
}

type rawInputPart struct {
	partHead
	ImageURL json.RawMessage `json:"image_url"`
	FileID   json.RawMessage `json:"file_id"`
	Detail   json.RawMessage `json:"detail"`
}

var responsesRoles = map[string]bool{"user": true, "assistant": true, "system": true, "developer": true}

const (
	maxResponsesItems  = 10000
	maxResponseIDBytes = 256 // of a response id llmq keeps or looks up
	minOutputTokens    = 16
)

func parseResponses(r *request, rb *rawResponsesBody) error {
	if err := refuseTrue(rb.Background, "background", "'background' is not supported in a job: llmq runs every job in the background; follow it with GET /v1/jobs/{id}"); err != nil {
		return err
	}
	switch string(bytes.TrimSpace(rb.Store)) {
	case "", "null", "true":
		r.stores = true
	case "false":
	default:
		return invalid("store", "'store' must be a boolean")
	}
	if !isNull(rb.PreviousResponseID) {
		id, ok := jsonString(rb.PreviousResponseID)
		if !ok || id == "" {
			return invalid("previous_response_id", "'previous_response_id' must be a non-empty string")
		}
		if len(id) > maxResponseIDBytes {
			return invalid("previous_response_id", "'previous_response_id' must be at most %d bytes, got %d", maxResponseIDBytes, len(id))
		}
		r.previousResponseID = id
	}
	mot, has, err := intParam(rb.MaxOutputTokens, "max_output_tokens", minOutputTokens, maxTokensParam)
	if err != nil {
		return err
	}
	if has {
		r.maxTokens, r.outputParam = mot, "max_output_tokens"
	}
	if r.maxToolCalls, _, err = intParam(rb.MaxToolCalls, "max_tool_calls", 1, maxTokensParam); err != nil {
		return err
	}
	if err := parseServiceTier(r, rb.ServiceTier); err != nil {
		return err
	}
	switch {
	case !isNull(rb.Conversation):
		r.unseen = "conversation"
	case !isNull(rb.Prompt):
		r.unseen = "prompt"
	}
	if !isNull(rb.Instructions) {
		s, ok := jsonString(rb.Instructions)
		if !ok {
			return invalid("instructions", "'instructions' must be a string")
		}
		r.messages = append(r.messages, message{role: "system", texts: []string{s}})
	}
	switch {
	case isNull(rb.Input) && isNull(rb.Prompt) && isNull(rb.PreviousResponseID) && isNull(rb.Conversation):
		return invalid("input", "'input' is required")
	case isNull(rb.Input):
	case rb.Input[0] == '"':
		s, ok := jsonString(rb.Input)
		if !ok {
			return invalid("input", "'input' must be a string or an array of input items")
		}
		r.messages = append(r.messages, message{role: "user", texts: []string{s}})
	default:
		if err := parseItems(r, rb.Input); err != nil {
			return err
		}
	}
	if !isNull(rb.Tools) {
		r.tools, r.toolsKey = responsesTools(rb.Tools), "tools"
		if r.builtinTools, err = builtinTools(rb.Tools); err != nil {
			return err
		}
	}
	if !isNull(rb.Text) {
		var t struct {
			Format struct {
				Type   string          `json:"type"`
				Schema json.RawMessage `json:"schema"`
			} `json:"format"`
		}
		if unmarshal(rb.Text, &t) == nil && t.Format.Type == "json_schema" {
			r.schema = t.Format.Schema
		}
	}
	if len(r.messages) == 0 && len(r.itemRefs) == 0 && isNull(rb.Prompt) && isNull(rb.PreviousResponseID) && isNull(rb.Conversation) {
		return invalid("input", "'input' must not be empty")
	}
	return nil
}

func parseItems(r *request, raw json.RawMessage) error {
	var items []json.RawMessage
	if raw[0] != '[' || unmarshal(raw, &items) != nil {
		return invalid("input", "'input' must be a string or an array of input items")
	}
	if len(items) > maxResponsesItems {
		return invalid("input", "'input' must have at most %d items, got %d", maxResponsesItems, len(items))
	}
	for i, iraw := range items {
		p := "input[" + strconv.Itoa(i) + "]"
		var it rawItem
		if len(iraw) == 0 || iraw[0] != '{' || unmarshal(iraw, &it) != nil {
			return invalid(p, "'%s' must be an object", p)
		}
		r.checkCase(&it, it.Other, p)
		typ := "message"
		if !isNull(it.Type) {
			s, ok := jsonString(it.Type)
			if !ok || s == "" {
				return invalid(p+".type", "'%s.type' must be a non-empty string", p)
			}
			typ = s
		}
		switch typ {
		case "message":
			m, err := r.parseItemMessage(it, p)
			if err != nil {
				return err
			}
			r.messages = append(r.messages, m)
		case "function_call":
			name, _ := jsonString(it.Name)
			args, _ := jsonString(it.Arguments)
			r.messages = append(r.messages, message{role: "assistant", extra: []string{name, args}})
		case "function_call_output":
			m := message{role: "tool"}
			if out, ok := jsonString(it.Output); ok {
				m.texts = []string{out}
			} else if !isNull(it.Output) {
				m.extra = []string{string(it.Output)}
			}
			r.messages = append(r.messages, m)
		case "reasoning":
			var summary []struct {
				Text string `json:"text"`
			}
			m := message{role: "assistant"}
			if unmarshal(it.Summary, &summary) == nil {
				for _, s := range summary {
					m.texts = append(m.texts, s.Text)
				}
			}
			r.messages = append(r.messages, m)
		case "item_reference":
			id, ok := jsonString(it.ID)
			if !ok || id == "" || len(id) > maxResponseIDBytes {
				return invalid(p+".id", "'%s.id' must be a non-empty string of at most %d bytes", p, maxResponseIDBytes)
			}
			r.itemRefs = append(r.itemRefs, id)
		default:
			r.messages = append(r.messages, message{role: "assistant", extra: []string{string(iraw)}})
		}
	}
	return nil
}

func (r *request) parseItemMessage(it rawItem, p string) (message, error) {
	role, ok := jsonString(it.Role)
	if !ok {
		return message{}, invalid(p+".role", "'%s.role' must be a string", p)
	}
	if !responsesRoles[role] {
		return message{}, invalid(p+".role", "'%s.role' must be one of user, assistant, system, developer; got %q", p, role)
	}
	m := message{role: role}
	pc := p + ".content"
	if isNull(it.Content) {
		return m, invalid(pc, "'%s' is required", pc)
	}
	textTypes := []string{"input_text", "output_text", "text"}
	err := parseParts(r, &m, it.Content, pc, textTypes, "input_image", func(part *rawInputPart, pp string) (string, error) {
		url, _ := jsonString(part.ImageURL)
		file, _ := jsonString(part.FileID)
		if url == "" && file == "" {
			return "", invalid(pp+".image_url", "'%s.image_url' (or '%s.file_id') is required", pp, pp)
		}
		detail, _ := jsonString(part.Detail)
		return detail, nil
	})
	return m, err
}

// responsesTools turns the Responses API's function tools into chat's shape
// ({type, function}), counted by the same formula; others are kept.
func responsesTools(raw json.RawMessage) json.RawMessage {
	var specs []json.RawMessage
	if unmarshal(raw, &specs) != nil {
		return raw
	}
	out := make([]json.RawMessage, len(specs))
	for i, s := range specs {
		out[i] = s
		var t struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		}
		if unmarshal(s, &t) != nil || t.Type != "function" || t.Name == "" {
			continue
		}
		fn := map[string]any{"name": t.Name, "description": t.Description}
		if len(t.Parameters) > 0 {
			fn["parameters"] = t.Parameters
		}
		if b, err := json.Marshal(map[string]any{"type": "function", "function": fn}); err == nil {
			out[i] = b
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return raw
	}
	return b
}

// PreviousResponseID is a Responses API body's previous_response_id.
func (b *Body) PreviousResponseID() string { return b.r.previousResponseID }

// respond sends a Responses API request over plain HTTP (go-openai has no
// Responses API) and reads its answer, a response object.
func (p *openAIProvider) respond(ctx context.Context, wire []byte) (*Response, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, p.timeout, errTimeout)
	defer cancel()
	resp, err := p.send(ctx, http.MethodPost, "/responses", nil, jsonHeader(), bytes.NewReader(wire))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	e := p.answered(resp)
	body, err := p.readAnswer(ctx, resp, e)
	if err != nil {
		return nil, err
	}
	var shape struct {
		Object string `json:"object"`
	}
	if err := unmarshal(body, &shape); err != nil || shape.Object != "response" {
		return nil, e.serverError(ClassPermanent, client.CodeProviderResponseInvalid, "The provider's answer is not a response object.")
	}
	u, err := UsageOf(body)
	if err != nil {
		return nil, p.notOpenAIShape(e, err)
	}
	return &Response{StatusCode: resp.StatusCode, Body: body, RequestID: e.RequestID, RateLimit: e.RateLimit, Usage: u}, nil
}

// StoredIDs are the ids of a Responses API answer's body a follow-up may
// name: the response's ("" when the body is not a response) and its output
// items'.
func StoredIDs(body []byte) (id string, items []string) {
	var b struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Output []struct {
			ID string `json:"id"`
		} `json:"output"`
	}
	if unmarshal(body, &b) != nil || b.Object != "response" || b.ID == "" || len(b.ID) > maxResponseIDBytes {
		return "", nil
	}
	for _, it := range b.Output {
		if it.ID != "" && len(it.ID) <= maxResponseIDBytes {
			items = append(items, it.ID)
		}
	}
	return b.ID, items
}
