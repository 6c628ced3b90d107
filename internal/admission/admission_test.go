package admission

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

const policyYAML = `
providers:
  - {name: openai, base_url: https://api.openai.com/v1, api_key_env: OPENAI_API_KEY}
models:
  - name: gpt-4o-mini
    provider: openai
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 500, tpm: 10000, tpd: 20000}
    max_output_tokens: 1000
  - name: text-embedding-3-small
    provider: openai
    limits: {rpm: 500, tpm: 100000}
tiers:
  - {name: standard, daily_budget_usd: 1, priority: default, on_exhausted: defer, api_rps: 10}
  - {name: internal, unlimited: true, priority: critical, api_exempt: true}
global_daily_budget_usd: 5
`

func policy(t *testing.T) *config.Policy {
	t.Helper()
	p, err := config.ParsePolicy([]byte(policyYAML))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEstimate(t *testing.T) {
	t.Parallel()
	e, p := New(nil, nil), policy(t)
	est, err := e.Estimate(context.Background(), p, nil, "", "/v1/chat/completions",
		[]byte(`{"model":"gpt-4o-mini","n":2,"messages":[{"role":"user","content":"Say hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// No max_tokens: the model's max_output_tokens, for each of the 2 choices.
	if est.MaxTokens != 2000 || est.PromptTokens < 5 || est.Cost.Requests != 1 || est.Cost.Tokens != est.PromptTokens+2000 {
		t.Fatalf("estimate = %+v", est)
	}
	m, _ := p.Model("gpt-4o-mini")
	if est.WorstCase != m.Deployments[0].Price.WorstCase(est.PromptTokens, 2000) || est.WorstCase == 0 {
		t.Fatalf("worst case %d", est.WorstCase)
	}
	emb, err := e.Estimate(context.Background(), p, nil, "", "/v1/embeddings", []byte(`{"model":"text-embedding-3-small","input":["a b c","d"]}`))
	if err != nil || emb.MaxTokens != 0 || emb.Cost.Tokens != emb.PromptTokens || emb.PromptTokens < 2 {
		t.Fatalf("embedding estimate = %+v, %v", emb, err)
	}
}

func TestEstimateRefusesWhatCanNeverRun(t *testing.T) {
	t.Parallel()
	e, p := New(nil, nil), policy(t)
	for _, c := range []struct {
		name, endpoint, body, param string
		code                        client.Code
	}{
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, "model", client.CodeModelNotFound},
		{"chat model on embeddings", "/v1/embeddings", `{"model":"gpt-4o-mini","input":"x"}`, "model", client.CodeModelNotSupported},
		{"embedding model on chat", "/v1/chat/completions", `{"model":"text-embedding-3-small","messages":[{"role":"user","content":"x"}]}`, "model", client.CodeModelNotSupported},
		{"max_tokens over the TPM bucket", "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":10001,"messages":[{"role":"user","content":"x"}]}`, "max_tokens", client.CodeTokensExceedCapacity},
		{"prompt over the TPM bucket", "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 12000) + `"}]}`, "messages", client.CodeTokensExceedCapacity},
		{"no messages", "/v1/chat/completions", `{"model":"gpt-4o-mini"}`, "messages", client.CodeInvalidRequest},
		{"not JSON", "/v1/chat/completions", `{"model":`, "", client.CodeInvalidRequest},
	} {
		_, err := e.Estimate(context.Background(), p, nil, "", c.endpoint, []byte(c.body))
		var ae *wire.Error
		if !errors.As(err, &ae) || ae.Code != c.code || (c.param != "" && ae.Param != c.param) || ae.Message == "" {
			t.Errorf("%s: err = %#v, want code %s param %s", c.name, err, c.code, c.param)
		}
	}
}

func TestAccountAndCheckBudget(t *testing.T) {
	t.Parallel()
	p := policy(t)
	acct, tier, err := Account(p, &store.Tenant{ID: "ten_a", Tier: "standard"})
	if err != nil || tier.Name != "standard" || acct.Budget != money.PerDollar || acct.Unlimited || acct.Global != 5*money.PerDollar {
		t.Fatalf("account = %+v, %v", acct, err)
	}
	override := 3 * money.PerDollar
	acct, _, _ = Account(p, &store.Tenant{ID: "ten_b", Tier: "internal", BudgetOverride: &override})
	if acct.Unlimited || acct.Budget != override {
		t.Fatalf("a tenant's override must replace even an unlimited tier's budget: %+v", acct)
	}
	if _, _, err := Account(p, &store.Tenant{ID: "ten_c", Tier: "gold"}); err == nil {
		t.Fatal("a tier missing from the policy was accepted")
	}
	std, _, _ := Account(p, &store.Tenant{ID: "ten_a", Tier: "standard"})
	if err := CheckBudget(std, money.PerDollar, llm.EndpointChat); err != nil {
		t.Fatalf("a worst case equal to the budget was refused: %v", err)
	}
	var ae *wire.Error
	if err := CheckBudget(std, money.PerDollar+1, llm.EndpointChat); !errors.As(err, &ae) || ae.Code != client.CodeBudgetTooSmall {
		t.Fatalf("a worst case above the budget: %v", err)
	}
	unl, _, _ := Account(p, &store.Tenant{ID: "ten_d", Tier: "internal"})
	if err := CheckBudget(unl, 4*money.PerDollar, llm.EndpointChat); err != nil {
		t.Fatalf("unlimited tier under the global cap: %v", err)
	}
	if err := CheckBudget(unl, 6*money.PerDollar, llm.EndpointChat); !errors.As(err, &ae) || !strings.Contains(ae.Message, "global") {
		t.Fatalf("unlimited tier above the global cap: %v", err)
	}
}

// fixedCalibration corrects every scope's prompts by one factor.
type fixedCalibration float64

func (f fixedCalibration) Calibration(context.Context, string) limiter.Calibration {
	return limiter.Calibration{Factor: float64(f), Samples: 31}
}

// A calibrated estimate counts the prompt as the provider was seen to:
// the permit, the worst case and the capacity check alike; the raw
// estimate stays what is stored.
func TestEstimateAppliesTheCalibration(t *testing.T) {
	t.Parallel()
	p := policy(t)
	body := `{"model":"gpt-4o-mini","max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 4000) + `"}]}`
	raw, err := New(nil, nil).Estimate(context.Background(), p, nil, "", "/v1/chat/completions", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	est, err := New(fixedCalibration(1.5), nil).Estimate(context.Background(), p, nil, "", "/v1/chat/completions", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	prompt := (raw.PromptTokens*3 + 1) / 2
	if est.PromptTokens != raw.PromptTokens || est.Cost.Tokens != prompt+100 || est.WorstCase != est.Model.Deployments[0].Price.WorstCase(prompt, 100) {
		t.Errorf("calibrated %+v, raw %+v: want the prompt counted 1.5x in Cost and WorstCase only", est, raw)
	}
	// Counted half, the permit is smaller but the dollars held are not.
	low, err := New(fixedCalibration(0.5), nil).Estimate(context.Background(), p, nil, "", "/v1/chat/completions", []byte(body))
	if err != nil || low.Cost.Tokens != (raw.PromptTokens+1)/2+100 || low.WorstCase != raw.WorstCase {
		t.Errorf("calibrated 0.5: %+v, %v; want half the prompt in Cost and the raw WorstCase %s", low, err, raw.WorstCase)
	}
	// Counted 2.5x, the same prompt no longer fits the 10,000-token bucket.
	_, err = New(fixedCalibration(2.5), nil).Estimate(context.Background(), p, nil, "", "/v1/chat/completions", []byte(body))
	var ae *wire.Error
	if !errors.As(err, &ae) || ae.Code != client.CodeTokensExceedCapacity || ae.Param != "messages" || !strings.Contains(ae.Message, "as the provider counts: 2.50×") {
		t.Errorf("err = %v, want tokens_exceed_capacity naming the calibration", err)
	}
}

// A request is refused when one dimension of the limits can never hold it:
// its prompt over the input tokens per minute, its output limit over the
// output tokens per minute, each named with its parameter. The permit
// counts each kind apart.
func TestEstimateRefusesPerDimension(t *testing.T) {
	t.Parallel()
	p, err := config.ParsePolicy([]byte(strings.Replace(policyYAML, "limits: {rpm: 500, tpm: 10000, tpd: 20000}",
		"limits: {rpm: 500, itpm: 3000, otpm: 2000}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	e := New(nil, nil)
	est, err := e.Estimate(context.Background(), p, nil, "", "/v1/chat/completions",
		[]byte(`{"model":"gpt-4o-mini","max_tokens":1500,"messages":[{"role":"user","content":"Say hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c := est.Cost; c.Input != est.PromptTokens || c.Output != 1500 || c.Tokens != c.Input+c.Output || c.Requests != 1 {
		t.Fatalf("permit %+v of prompt %d", c, est.PromptTokens)
	}
	for _, c := range []struct{ name, body, param, msg string }{
		{"output over otpm", `{"model":"gpt-4o-mini","max_tokens":2001,"messages":[{"role":"user","content":"x"}]}`, "max_tokens",
			"up to 2001 output tokens, more than the 2000 output tokens per minute"},
		{"prompt over itpm", `{"model":"gpt-4o-mini","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 3500) + `"}]}`, "messages",
			"input tokens (its prompt), more than the 3000 input tokens per minute"},
	} {
		_, err := e.Estimate(context.Background(), p, nil, "", "/v1/chat/completions", []byte(c.body))
		var ae *wire.Error
		if !errors.As(err, &ae) || ae.Code != client.CodeTokensExceedCapacity || ae.Param != c.param || !strings.Contains(ae.Message, c.msg) {
			t.Errorf("%s: err = %v, want param %s and %q", c.name, err, c.param, c.msg)
		}
	}
}
