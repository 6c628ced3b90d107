package admission

import (
	"context"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
)

const anthropicPolicyYAML = `
providers:
  - {name: openai, base_url: https://api.openai.com/v1, api_key_env: OPENAI_API_KEY}
  - {name: anthropic, kind: anthropic, api_key_env: ANTHROPIC_API_KEY}
models:
  - name: gpt-4o-mini
    provider: openai
    limits: {rpm: 500}
  - name: claude
    provider: anthropic
    upstream: claude-sonnet-4-5
    limits: {rpm: 50}
tiers:
  - {name: standard, daily_budget_usd: 10, api_rps: 10}
`

// A Claude model serves the Messages API alone, and an OpenAI model not
// it: each is refused at admission naming the model. A Messages request's
// worst case is its prompt at the dearest prompt price (a write to the
// hour's cache, 2 times the input) and its max_tokens of output.
func TestAnthropicModelsServeMessagesOnly(t *testing.T) {
	t.Parallel()
	p, err := config.ParsePolicy([]byte(anthropicPolicyYAML))
	if err != nil {
		t.Fatal(err)
	}
	e := New(nil, nil)
	ctx := context.Background()
	_, err = e.Estimate(ctx, p, nil, "", llm.EndpointChat, []byte(`{"model":"claude","messages":[{"role":"user","content":"hi"}]}`))
	if w := wantRefusal(t, err, 400, "model", client.CodeModelNotSupported); w != nil && !contains(w.Message, "'claude'", "/v1/messages") {
		t.Errorf("message %q", w.Message)
	}
	_, err = e.Estimate(ctx, p, nil, "", llm.EndpointMessages, []byte(`{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	if w := wantRefusal(t, err, 400, "model", client.CodeModelNotSupported); w != nil && !contains(w.Message, "'gpt-4o-mini'", "Messages API") {
		t.Errorf("message %q", w.Message)
	}
	est, err := e.Estimate(ctx, p, nil, "", llm.EndpointMessages, []byte(`{"model":"claude","max_tokens":700,"messages":[{"role":"user","content":"Say hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	price := money.DefaultPrices["claude-sonnet-4-5"]
	if est.MaxTokens != 700 || est.Shape.OutputLimit != 0 || est.Cost.Tokens != est.PromptTokens+700 {
		t.Errorf("estimate %+v", est)
	}
	if want := price.Cost(money.Tokens{Prompt: est.PromptTokens, CacheWrite1h: est.PromptTokens, Completion: 700}); est.WorstCase != want {
		t.Errorf("worst case %s, want %s", est.WorstCase, want)
	}
	// The bill of an answer: each part of the prompt at its price.
	m, _ := p.Model("claude")
	u := llm.Usage{PromptTokens: 10_000, CachedTokens: 6000, CacheWrite5mTokens: 1000, CacheWrite1hTokens: 2000, CompletionTokens: 100}
	// 1000×3 + 6000×0.3 + 1000×3.75 + 2000×6 + 100×15 micros.
	if got := Bill(m.Deployments[0].Price, &est.Shape, u); got != 3000+1800+3750+12000+1500 {
		t.Errorf("bill %d, want 22050", got)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
