package llm_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"

	"github.com/llmq/llmq/internal/jsontext"
	"github.com/llmq/llmq/internal/llm"
)

// exactRead is a request as a provider that reads member names exactly
// sees it: every chat message's or Responses item's role and content (a
// string, or parts' text and refusals, images), the instructions, the
// output limit and the number of choices, rebuilt as a canonical body with
// none of the members it does not read.
func exactRead(endpoint string, body []byte) []byte {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	out := map[string]any{"model": m["model"]}
	for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "n", "instructions"} {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	content := func(c any) any {
		parts, ok := c.([]any)
		if !ok {
			return c
		}
		var kept []any
		for _, p := range parts {
			pm, _ := p.(map[string]any)
			part := map[string]any{"type": pm["type"]}
			for _, k := range []string{"text", "refusal", "image_url", "detail"} {
				if v, ok := pm[k]; ok {
					part[k] = v
				}
			}
			kept = append(kept, part)
		}
		return kept
	}
	messages := func(list []any) []any {
		var kept []any
		for _, it := range list {
			im, _ := it.(map[string]any)
			msg := map[string]any{"role": im["role"], "content": content(im["content"])}
			kept = append(kept, msg)
		}
		return kept
	}
	switch endpoint {
	case llm.EndpointChat:
		list, _ := m["messages"].([]any)
		out["messages"] = messages(list)
	case llm.EndpointResponses:
		if list, ok := m["input"].([]any); ok {
			out["input"] = messages(list)
		} else {
			out["input"] = m["input"]
		}
	}
	b, _ := json.Marshal(out)
	return b
}

// plainBody is a random chat or Responses body whose messages hold only
// what exactRead reads (roles, content of text, refusal and image parts).
func plainBody(r *rand.Rand) (string, map[string]any) {
	text := func() string { return strings.Repeat("light water ", 1+r.IntN(20)) }
	var list []any
	for range 1 + r.IntN(4) {
		var content any = text()
		if r.IntN(2) == 0 {
			content = []any{map[string]any{"type": "text", "text": text()},
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://x/y.png", "detail": "low"}}}
		}
		list = append(list, map[string]any{"role": []string{"user", "system", "assistant"}[r.IntN(3)], "content": content})
	}
	if r.IntN(2) == 0 {
		b := map[string]any{"model": "gpt-4o", "messages": list, "max_tokens": 10 + r.IntN(100), "n": 1 + r.IntN(3), "temperature": 0.5}
		return llm.EndpointChat, b
	}
	for _, it := range list {
		if parts, ok := it.(map[string]any)["content"].([]any); ok {
			parts[0].(map[string]any)["type"] = "input_text"
			parts[1] = map[string]any{"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}
		}
	}
	return llm.EndpointResponses, map[string]any{"model": "gpt-4o", "input": list, "max_output_tokens": 16 + r.IntN(100),
		"instructions": text(), "temperature": 0.5}
}

// objects are the JSON objects of v, at any depth.
func objects(v any, out *[]map[string]any) {
	switch t := v.(type) {
	case map[string]any:
		*out = append(*out, t)
		for _, c := range t {
			objects(c, out)
		}
	case []any:
		for _, c := range t {
			objects(c, out)
		}
	}
}

// caseVariant is name with the case of one of its letters changed.
func caseVariant(r *rand.Rand, name string) string {
	runes := []rune(name)
	for range 10 {
		i := r.IntN(len(runes))
		if unicode.IsLetter(runes[i]) {
			if unicode.IsUpper(runes[i]) {
				runes[i] = unicode.ToLower(runes[i])
			} else {
				runes[i] = unicode.ToUpper(runes[i])
			}
			return string(runes)
		}
	}
	return strings.ToUpper(name)
}

// Admission reads exactly the bytes that are sent: over bodies with a
// member renamed to a case variant, or a case variant added beside it, at
// any depth, a body llmq admits is counted as a provider reading names
// exactly counts it (the same output limit, choices and content tokens as
// the canonical body such a provider sees), and as one matching names
// without case (encoding/json) counts it; a body whose readers would part
// is refused, naming the member.
func TestAdmissionReadsWhatAProviderReads(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(46, 7))
	est := llm.NewEstimator()
	var admitted, refused, unchanged int
	for range 600 {
		endpoint, b := plainBody(r)
		var objs []map[string]any
		objects(b, &objs)
		obj := objs[r.IntN(len(objs))]
		var keys []string
		for k := range obj {
			keys = append(keys, k)
		}
		key := keys[r.IntN(len(keys))]
		variant := caseVariant(r, key)
		switch r.IntN(3) {
		case 0: // renamed
			obj[variant] = obj[key]
			delete(obj, key)
		case 1: // beside it, with its own value
			obj[variant] = "999"
			if n, ok := obj[key].(int); ok {
				obj[variant] = n * 7
			}
		default:
			unchanged++
		}
		body, _ := json.Marshal(b)
		if p := jsontext.Structure(body); p != nil {
			refused++ // two names that fold equal: refused before admission
			continue
		}
		decoded, err := llm.Decode(endpoint, body)
		if err == nil {
			err = decoded.CaseVariant()
		}
		if err != nil {
			refused++
			continue
		}
		got, err := est.Count(decoded, "gpt-4o", "")
		if err != nil {
			t.Fatal(err)
		}
		canonical := exactRead(endpoint, body)
		want, err := est.Parse(endpoint, "gpt-4o", "", canonical)
		if err != nil {
			t.Fatalf("llmq admitted %s, which a provider reading names exactly refuses: %v", body, err)
		}
		if got.MaxTokens != want.MaxTokens || got.N != want.N || got.ContentTokens != want.ContentTokens {
			t.Fatalf("llmq counts %+v of %s; a provider reading names exactly sees %+v (%s)", got, body, want, canonical)
		}
		// A reader matching names without case (encoding/json) takes the
		// same members.
		if loose := looseRead(endpoint, body); !bytes.Equal(loose, canonical) {
			t.Fatalf("a reader matching names without case reads %s as\n%s\nand one reading them exactly as\n%s", body, loose, canonical)
		}
		admitted++
	}
	t.Logf("600 bodies (%d unchanged): %d admitted and counted alike, %d refused", unchanged, admitted, refused)
	if refused < 300 || admitted <= unchanged {
		t.Fatalf("admitted %d (%d unchanged), refused %d: the bodies did not cover both", admitted, unchanged, refused)
	}
}

// looseRead is exactRead by a reader that matches member names without
// case, as encoding/json does.
func looseRead(endpoint string, body []byte) []byte {
	type part struct {
		Type     any `json:"type"`
		Text     any `json:"text"`
		Refusal  any `json:"refusal"`
		ImageURL any `json:"image_url"`
		Detail   any `json:"detail"`
	}
	type message struct {
		Role    any             `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	var b struct {
		Model               any             `json:"model"`
		MaxTokens           any             `json:"max_tokens"`
		MaxCompletionTokens any             `json:"max_completion_tokens"`
		MaxOutputTokens     any             `json:"max_output_tokens"`
		N                   any             `json:"n"`
		Instructions        any             `json:"instructions"`
		Messages            []message       `json:"messages"`
		Input               json.RawMessage `json:"input"`
	}
	if json.Unmarshal(body, &b) != nil {
		return nil
	}
	out := map[string]any{"model": b.Model}
	for k, v := range map[string]any{"max_tokens": b.MaxTokens, "max_completion_tokens": b.MaxCompletionTokens,
		"max_output_tokens": b.MaxOutputTokens, "n": b.N, "instructions": b.Instructions} {
		if v != nil {
			out[k] = v
		}
	}
	messages := func(list []message) []any {
		var kept []any
		for _, m := range list {
			var content any
			var parts []part
			if json.Unmarshal(m.Content, &parts) == nil {
				var kp []any
				for _, p := range parts {
					pm := map[string]any{"type": p.Type}
					for k, v := range map[string]any{"text": p.Text, "refusal": p.Refusal, "image_url": p.ImageURL, "detail": p.Detail} {
						if v != nil {
							pm[k] = v
						}
					}
					kp = append(kp, pm)
				}
				content = kp
			} else {
				_ = json.Unmarshal(m.Content, &content)
			}
			kept = append(kept, map[string]any{"role": m.Role, "content": content})
		}
		return kept
	}
	switch endpoint {
	case llm.EndpointChat:
		out["messages"] = messages(b.Messages)
	case llm.EndpointResponses:
		var items []message
		if json.Unmarshal(b.Input, &items) == nil {
			out["input"] = messages(items)
		} else {
			var in any
			_ = json.Unmarshal(b.Input, &in)
			out["input"] = in
		}
	}
	data, _ := json.Marshal(out)
	return data
}
