package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
)

// anthropicPolicy serves claude on the simulator's Messages API (its base
// URL ends in /v1, which an anthropic provider drops) beside an OpenAI
// model, at Claude Sonnet's price with Anthropic's cache prices.
const anthropicPolicy = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 10s
  - name: claude-sim
    kind: anthropic
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 10s
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 3000, tpm: 300000}
  - name: claude
    provider: claude-sim
    upstream: claude-sonnet-4-5
    price: {input_per_mtok: 3, output_per_mtok: 15}
    limits: {rpm: 3000, tpm: 1000000}
tiers:
  - name: standard
    daily_budget_usd: 50
    api_rps: 1000
`

func startAnthropic(t *testing.T, workers int) *apptest.App {
	t.Helper()
	return apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: anthropicPolicy, Workers: workers, Sim: &sim.Config{
		Seed: 11, CacheMinTokens: 100, CompletionMin: 0.3, CompletionMax: 0.9,
		Models: map[string]sim.Model{
			"claude-sonnet-4-5": {Limits: sim.Limits{RPM: 3000, ITPM: 1_000_000, OTPM: 400_000},
				Price: money.Price{InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000}},
			"gpt-4o-mini": {Limits: sim.Limits{RPM: 3000, TPM: 300_000}},
		}}})
}

// chargedAsBilled checks that the job of a call was charged, to the
// micro-dollar, what the simulator billed the call it made.
func chargedAsBilled(t *testing.T, a *apptest.App, jobID string) *store.Job {
	t.Helper()
	j := a.EndedJob(jobID)
	if j.Status != store.JobSucceeded {
		t.Fatalf("job %s: %s %+v", jobID, j.Status, j.Error)
	}
	e, err := a.Store.UsageGetByJob(t.Context(), jobID)
	if err != nil {
		t.Fatal(err)
	}
	var bill *sim.Bill
	for _, b := range a.Sim.Bills() {
		if b.RequestID == j.ProviderRequestID {
			bill = &b
		}
	}
	if bill == nil || bill.Cost == 0 || j.Cost != bill.Cost || e.Cost != bill.Cost {
		t.Fatalf("job %s charged %s (ledger %s), the provider billed %+v", jobID, j.Cost, e.Cost, bill)
	}
	if want := bill.InputTokens + bill.CachedTokens + bill.CacheWrite5mTokens + bill.CacheWrite1hTokens; j.PromptTokens != want ||
		j.CachedTokens != bill.CachedTokens || j.CompletionTokens != bill.OutputTokens {
		t.Fatalf("job %s: %d prompt (%d cached), %d completion tokens; billed %+v", jobID, j.PromptTokens, j.CachedTokens, j.CompletionTokens, bill)
	}
	return j
}

// TestAnthropicGoSDK drives POST /v1/messages with Anthropic's official Go
// SDK, changing nothing but its base URL: a message whole, written to the
// cache and then read from it, a stream accumulated by the SDK, the key
// as x-api-key or a bearer token, each call a job charged what the
// provider billed; refusals as the SDK's errors, in Anthropic's shape.
func TestAnthropicGoSDK(t *testing.T) {
	t.Parallel()
	a := startAnthropic(t, 0)
	_, key := a.Tenant("standard")
	c := anthropic.NewClient(option.WithBaseURL(a.URL), option.WithAPIKey(key), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	params := anthropic.MessageNewParams{
		Model:     "claude",
		MaxTokens: 60,
		System: []anthropic.TextBlockParam{{Text: strings.Repeat("You answer briefly and well. ", 100),
			CacheControl: anthropic.NewCacheControlEphemeralParam()}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
	}
	for i, want := range []struct{ write, read bool }{{write: true}, {read: true}} {
		var raw *http.Response
		m, err := c.Messages.New(ctx, params, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		if m.Type != "message" || m.Model != "claude-sonnet-4-5" || len(m.Content) != 1 || m.Content[0].Text == "" || m.Usage.OutputTokens == 0 ||
			(m.Usage.CacheCreationInputTokens > 0) != want.write || (m.Usage.CacheReadInputTokens > 0) != want.read {
			t.Fatalf("message %d: %+v", i, m)
		}
		j := chargedAsBilled(t, a, raw.Header.Get("X-Llmq-Job-Id"))
		if j.Endpoint != "/v1/messages" || j.Model != "claude" {
			t.Fatalf("job %+v", j)
		}
	}

	var raw *http.Response
	s := c.Messages.NewStreaming(ctx, params, option.WithResponseInto(&raw))
	var acc anthropic.Message
	events := 0
	for s.Next() {
		if err := acc.Accumulate(s.Current()); err != nil {
			t.Fatal(err)
		}
		events++
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if events < 6 || len(acc.Content) != 1 || acc.Content[0].Text == "" || acc.Usage.OutputTokens == 0 || acc.Usage.CacheReadInputTokens == 0 {
		t.Fatalf("stream: %d events, %+v", events, acc)
	}
	chargedAsBilled(t, a, raw.Header.Get("X-Llmq-Job-Id"))

	bearer := anthropic.NewClient(option.WithBaseURL(a.URL), option.WithAuthToken(key), option.WithMaxRetries(0))
	if _, err := bearer.Messages.New(ctx, params); err != nil {
		t.Fatalf("key as a bearer token: %v", err)
	}

	// Refusals: Anthropic's error shape, as the SDK's *anthropic.Error.
	refused := func(c anthropic.Client, p anthropic.MessageNewParams, status int, typ string) *anthropic.Error {
		t.Helper()
		_, err := c.Messages.New(ctx, p)
		var e *anthropic.Error
		if !errors.As(err, &e) || e.StatusCode != status || string(e.Type()) != typ {
			t.Fatalf("got %v, want a %d %s", err, status, typ)
		}
		return e
	}
	wrong := anthropic.NewClient(option.WithBaseURL(a.URL), option.WithAPIKey("llmq-wrong-key"), option.WithMaxRetries(0))
	refused(wrong, params, 401, "authentication_error")
	openAIModel := params
	openAIModel.Model = "gpt-4o-mini"
	if e := refused(c, openAIModel, 400, "invalid_request_error"); !strings.Contains(e.Message, "'gpt-4o-mini'") {
		t.Errorf("message %q does not name the model", e.Message)
	}
	noTokens := params
	noTokens.MaxTokens = 0
	refused(c, noTokens, 400, "invalid_request_error")

	// The Claude model by OpenAI's API: refused naming it, in OpenAI's shape.
	r := a.Do("POST", "/v1/chat/completions", key, map[string]any{"model": "claude", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	var oe struct {
		Error struct{ Message, Param string } `json:"error"`
	}
	r.JSON(t, &oe)
	if r.Status != 400 || oe.Error.Param != "model" || !strings.Contains(oe.Error.Message, "'claude'") || !strings.Contains(oe.Error.Message, "/v1/messages") {
		t.Errorf("chat for claude: %d %s", r.Status, r.Body)
	}

	// The platform overloaded: retried in place with backoff, then a 529
	// overloaded_error once the request's wait is over.
	if err := a.Sim.SetFaults(sim.Faults{Rate529: 1}); err != nil {
		t.Fatal(err)
	}
	soon := anthropic.NewClient(option.WithBaseURL(a.URL), option.WithAPIKey(key), option.WithMaxRetries(0), option.WithHeader("X-Llmq-Max-Wait", "2s"))
	refused(soon, params, 529, "overloaded_error")
	// The 529s were the platform's, not the account's: its limits are not
	// paused (a 429 penalizes the scope; these must not).
	before := a.Sim.Stats()
	if before.Overloaded == 0 {
		t.Fatalf("the simulator answered no 529: %+v", before)
	}
	m, _ := a.Policy.Current().Model("claude")
	res, err := a.Limiter.Reserve(context.Background(), admission.Scope(m.Routes()[0]), limiter.Cost{Requests: 1, Tokens: 1})
	if err != nil || !res.Allowed || res.Penalized {
		t.Fatalf("reserve after the 529s = %+v, %v; want allowed, no penalty", res, err)
	}
}

// A job of POST /v1/jobs on /v1/messages runs as every job does: its
// answer is the provider's message, charged what the provider billed.
func TestAnthropicMessagesJob(t *testing.T) {
	t.Parallel()
	a := startAnthropic(t, 1)
	_, key := a.Tenant("standard")
	r := a.Do("POST", "/v1/jobs", key, map[string]any{"endpoint": "/v1/messages",
		"body": map[string]any{"model": "claude", "max_tokens": 40, "messages": []map[string]string{{"role": "user", "content": "Count to three."}}}})
	var created struct{ ID string }
	r.JSON(t, &created)
	if r.Status != 201 && r.Status != 202 && r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	j := chargedAsBilled(t, a, created.ID)
	var m struct {
		Type  string `json:"type"`
		Model string `json:"model"`
	}
	if err := json.Unmarshal(j.ResponseBody, &m); err != nil || m.Type != "message" || m.Model != "claude-sonnet-4-5" {
		t.Fatalf("response %s", j.ResponseBody)
	}
	// An OpenAI endpoint for it is refused at admission, naming the model.
	r = a.Do("POST", "/v1/jobs", key, map[string]any{"endpoint": "/v1/responses", "body": map[string]any{"model": "claude", "input": "hi"}})
	if r.Status != 400 || !strings.Contains(string(r.Body), "'claude'") {
		t.Fatalf("responses job for claude: %d %s", r.Status, r.Body)
	}
}
