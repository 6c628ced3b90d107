package llm

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// rawMessagesBody holds the members of an Anthropic Messages API body llmq
// reads; parseMessagesAPI reduces it to messages: the system prompt as a
// system message, then each turn.
type rawMessagesBody struct {
	bodyHead
	MaxTokens json.RawMessage `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  json.RawMessage `json:"messages"`
	Tools     json.RawMessage `json:"tools"`
}

// rawTurn is one of a Messages API body's messages.
type rawTurn struct {
	Role    json.RawMessage `json:"role"`
	Content json.RawMessage `json:"content"`
	Other   otherMembers    `json:",unknown"`
}

// rawBlock is a content block of the Messages API: text, an image, a
// document, a tool's use or result, thinking.
type rawBlock struct {
	Type     json.RawMessage `json:"type"`
	Text     json.RawMessage `json:"text"`
	Name     json.RawMessage `json:"name"`
	Input    json.RawMessage `json:"input"`
	Content  json.RawMessage `json:"content"`
	Thinking json.RawMessage `json:"thinking"`
	Other    otherMembers    `json:",unknown"`
}

// anthropicServerTools are the prefixes of the tool types Anthropic runs
// itself, each use billed beside the tokens.
var anthropicServerTools = []string{"web_search", "web_fetch", "code_execution", "tool_search"}

// maxTurns bounds a Messages API body's messages.
const maxTurns = 100_000

// parseMessagesAPI reads a Messages API body: max_tokens required (the
// output limit of its one answer), system a string or text blocks,
// messages of user and assistant turns, tools counted as their JSON text
// (Anthropic's server tools, billed per use, refused).
func parseMessagesAPI(r *request, rb *rawMessagesBody) error {
	if isNull(rb.MaxTokens) {
		return invalid("max_tokens", "'max_tokens' is required")
	}
	mt, _, err := intParam(rb.MaxTokens, "max_tokens", 1, maxTokensParam)
	if err != nil {
		return err
	}
	r.maxTokens, r.outputParam = mt, "max_tokens"
	if !isNull(rb.System) {
		m := message{role: "system"}
		if err := r.parseBlocks(&m, rb.System, "system"); err != nil {
			return err
		}
		r.messages = append(r.messages, m)
	}
	if isNull(rb.Messages) {
		return invalid("messages", "'messages' is required")
	}
	var turns []json.RawMessage
	if rb.Messages[0] != '[' || unmarshal(rb.Messages, &turns) != nil {
		return invalid("messages", "'messages' must be an array of message objects")
	}
	if len(turns) == 0 {
		return invalid("messages", "'messages' must not be empty")
	}
	if len(turns) > maxTurns {
		return invalid("messages", "'messages' must have at most %d items, got %d", maxTurns, len(turns))
	}
	for i, traw := range turns {
		p := "messages[" + strconv.Itoa(i) + "]"
		var t rawTurn
		if len(traw) == 0 || traw[0] != '{' || unmarshal(traw, &t) != nil {
			return invalid(p, "'%s' must be an object", p)
		}
		r.checkCase(&t, t.Other, p)
		role, ok := jsonString(t.Role)
		if !ok || role != "user" && role != "assistant" {
			return invalid(p+".role", "'%s.role' must be 'user' or 'assistant'", p)
		}
		m := message{role: role}
		if isNull(t.Content) {
			return invalid(p+".content", "'%s.content' is required", p)
		}
		if err := r.parseBlocks(&m, t.Content, p+".content"); err != nil {
			return err
		}
		r.messages = append(r.messages, m)
	}
	if !isNull(rb.Tools) {
		var tools []struct {
			Type json.RawMessage `json:"type"`
		}
		if rb.Tools[0] != '[' || unmarshal(rb.Tools, &tools) != nil {
			return invalid("tools", "'tools' must be an array of tool objects")
		}
		for i, t := range tools {
			typ, _ := jsonString(t.Type)
			for _, prefix := range anthropicServerTools {
				if strings.HasPrefix(typ, prefix) {
					p := fmt.Sprintf("tools[%d].type", i)
					return invalid(p, "'%s': llmq does not serve Anthropic's server tools (%s), whose every use is billed beside the tokens", p, typ)
				}
			}
		}
		r.tools, r.toolsKey = rb.Tools, "tools"
	}
	return nil
}

// parseBlocks reads content at p, a string or an array of content blocks,
// into m: text and thinking as text, images as media, a tool's use by its
// name and input, a tool's result by its content, documents as what llmq
// cannot count, any other block as its JSON text.
func (r *request) parseBlocks(m *message, raw json.RawMessage, p string) error {
	if raw[0] == '"' {
		s, ok := jsonString(raw)
		if !ok {
			return invalid(p, "'%s' must be a string or an array of content blocks", p)
		}
		m.texts = append(m.texts, s)
		return nil
	}
	var blocks []json.RawMessage
	if raw[0] != '[' || unmarshal(raw, &blocks) != nil {
		return invalid(p, "'%s' must be a string or an array of content blocks", p)
	}
	for j, braw := range blocks {
		bp := p + "[" + strconv.Itoa(j) + "]"
		var b rawBlock
		if len(braw) == 0 || braw[0] != '{' || unmarshal(braw, &b) != nil {
			return invalid(bp, "'%s' must be a content block object", bp)
		}
		r.checkCase(&b, b.Other, bp)
		typ, ok := jsonString(b.Type)
		if !ok || typ == "" {
			return invalid(bp+".type", "'%s.type' must be a non-empty string", bp)
		}
		switch typ {
		case "text", "thinking":
			member, v := "text", b.Text
			if typ == "thinking" {
				member, v = "thinking", b.Thinking
			}
			s, ok := jsonString(v)
			if !ok {
				return invalid(bp+"."+member, "'%s.%s' must be a string", bp, member)
			}
			m.texts = append(m.texts, s)
		case "image":
			m.media = append(m.media, "")
		case "document":
			m.media = append(m.media, "")
			r.uncounted = cmp.Or(r.uncounted, bp)
		case "tool_use":
			name, _ := jsonString(b.Name)
			m.extra = append(m.extra, name, string(b.Input))
		case "tool_result":
			if !isNull(b.Content) {
				if err := r.parseBlocks(m, b.Content, bp+".content"); err != nil {
					return err
				}
			}
		default: // redacted thinking, search results, what comes next: their text
			m.extra = append(m.extra, string(braw))
		}
	}
	return nil
}
