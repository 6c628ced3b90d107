package llm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// randomBody builds a random valid request: mixed roles, names, text parts,
// images, tool turns, unicode, code, numbers; or embeddings of strings or ids.
func randomBody(r *rand.Rand) (endpoint string, body []byte) {
	models := []string{"gpt-4o-mini", "gpt-4o", "gpt-4", "gpt-3.5-turbo", "o3-mini", "text-embedding-3-small", "llama-3.1-8b", "my-custom-model"}
	snippets := []string{"Hello there.", "Résumé naïve café — “quotes”.", "func main() { fmt.Println(42) }", "1234567890 3.14159",
		"日本語のテキストです。", "emoji 🚀🔥 test", "   spaces   and\ttabs\n\nnewlines", "<|endoftext|>", "a", "supercalifragilistic", "JSON: {\"a\": [1, 2]}"}
	text := func() string {
		var b strings.Builder
		for range 1 + r.IntN(6) {
			b.WriteString(snippets[r.IntN(len(snippets))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	model := models[r.IntN(len(models))]
	m := map[string]any{"model": model}
	if r.IntN(4) == 0 {
		var input any
		switch r.IntN(3) {
		case 0:
			input = text()
		case 1:
			in := make([]string, 1+r.IntN(4))
			for i := range in {
				in[i] = text()
			}
			input = in
		default:
			ids := make([]int, 1+r.IntN(20))
			for i := range ids {
				ids[i] = r.IntN(100000)
			}
			input = ids
		}
		m["input"] = input
		b, _ := json.Marshal(m)
		return llm.EndpointEmbeddings, b
	}
	roles := []string{"system", "user", "assistant", "developer", "tool"}
	var msgs []map[string]any
	for range 1 + r.IntN(5) {
		msg := map[string]any{"role": roles[r.IntN(len(roles))]}
		switch r.IntN(4) {
		case 0:
			parts := []map[string]any{{"type": "text", "text": text()}}
			if r.IntN(2) == 0 {
				detail := []string{"low", "high", "auto"}[r.IntN(3)]
				parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/a.png", "detail": detail}})
			}
			msg["content"] = parts
		default:
			msg["content"] = text()
		}
		if r.IntN(3) == 0 {
			msg["name"] = "user_" + fmt.Sprint(r.IntN(100))
		}
		msgs = append(msgs, msg)
	}
	m["messages"] = msgs
	if r.IntN(2) == 0 {
		// Reasoning models take only max_completion_tokens (go-openai refuses
		// max_tokens for them, as OpenAI does).
		if strings.HasPrefix(model, "o") || r.IntN(2) == 0 {
			m["max_completion_tokens"] = 1 + r.IntN(300)
		} else {
			m["max_tokens"] = 1 + r.IntN(300)
		}
	}
	if r.IntN(4) == 0 {
		m["n"] = 1 + r.IntN(3)
	}
	b, _ := json.Marshal(m)
	return llm.EndpointChat, b
}

// TestEstimateNotBelowSimulatorAdmission checks the property the limiter
// relies on: for every request, llmq's reservation (prompt estimate plus
// max_tokens for each choice) is at least what the simulated provider charges
// its buckets at admission.
func TestEstimateNotBelowSimulatorAdmission(t *testing.T) {
	t.Parallel()
	const defaultMax = 256
	ts := startSim(t, sim.Config{DefaultMaxTokens: defaultMax})
	p := newProvider(t, ts.BaseURL, 10*time.Second)
	r := rand.New(rand.NewPCG(1, 2))
	e := llm.NewEstimator()
	const n = 300
	reserved := make([]int64, 0, n)
	for range n {
		endpoint, body := randomBody(r)
		pr, err := e.Parse(endpoint, "", "", body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		res := pr.PromptTokens
		if endpoint == llm.EndpointChat {
			maxTokens := pr.MaxTokens
			if maxTokens == 0 {
				maxTokens = defaultMax
			}
			res += maxTokens * pr.N
		}
		reserved = append(reserved, res)
		if _, err := p.Call(context.Background(), llm.Request{Endpoint: endpoint, Body: body}); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
	}
	adm := ts.Admissions(0)
	if len(adm) != n {
		t.Fatalf("%d admissions, want %d", len(adm), n)
	}
	for i, a := range adm {
		if reserved[i] < a.Tokens {
			t.Errorf("request %d: llmq reserves %d tokens, the provider charged %d", i, reserved[i], a.Tokens)
		}
	}
}
