package admission

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/wire"
)

const billPolicy = `
providers:
  - {name: openai, base_url: https://api.openai.com/v1, api_key_env: OPENAI_API_KEY}
  - {name: openai-b, base_url: https://api.openai.com/v1, api_key_env: OPENAI_API_KEY}
models:
  - name: gpt-4o
    price:
      input_per_mtok: 2.50
      output_per_mtok: 10.00
      service_tier_prices:
        priority: {input_per_mtok: 4.25, output_per_mtok: 17.00}
        flex: {input_per_mtok: 1.25, output_per_mtok: 5.00}
      tool_prices:
        web_search: {per_call_usd: 0.01, result_tokens: 2000}
        file_search: {per_call_usd: 0.0025}
    max_output_tokens: 1000
    max_tool_calls: 3
    deployments:
      - {provider: openai, upstream: gpt-4o, limits: {rpm: 500, tpm: 1000000}}
      - {provider: openai-b, upstream: gpt-4o, limits: {rpm: 500, tpm: 1000000}}
  - name: o3-mini
    provider: openai
    limits: {rpm: 500, tpm: 1000000}
  - name: local
    provider: openai
    upstream: llama-3-8b
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
    limits: {rpm: 500, tpm: 1000000}
tiers:
  - {name: standard, daily_budget_usd: 100, api_rps: 10}
  - {name: strict, daily_budget_usd: 100, api_rps: 10, require_output_limit: true}
  - {name: open, daily_budget_usd: 100, api_rps: 10, allow_foreign_responses: true}
`

type billEnv struct {
	e    *Estimator
	p    *config.Policy
	db   *store.DB
	a, b string // two tenants
}

func newBillEnv(t *testing.T) *billEnv {
	t.Helper()
	p, err := config.ParsePolicy([]byte(billPolicy))
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.OpenMigrated(t.Context(), testutil.Postgres(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	env := &billEnv{e: New(nil, db), p: p, db: db}
	for _, id := range []*string{&env.a, &env.b} {
		ten, err := db.TenantInsert(t.Context(), &store.TenantInsertParams{Name: "t", Tier: "standard"})
		if err != nil {
			t.Fatal(err)
		}
		*id = ten.ID
	}
	return env
}

func (env *billEnv) estimate(t *testing.T, tier, tenant, endpoint, body string) (*Estimate, error) {
	t.Helper()
	tr, ok := env.p.Tier(tier)
	if !ok {
		t.Fatalf("tier %s", tier)
	}
	return env.e.Estimate(context.Background(), env.p, tr, tenant, endpoint, []byte(body))
}

func (env *billEnv) mustEstimate(t *testing.T, tier, tenant, endpoint, body string) *Estimate {
	t.Helper()
	est, err := env.estimate(t, tier, tenant, endpoint, body)
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return est
}

func wantRefusal(t *testing.T, err error, status int, param string, code client.Code) *wire.Error {
	t.Helper()
	var ae *wire.Error
	if !errors.As(err, &ae) || ae.Param != param || ae.Code != code || cmpStatus(ae.Status) != status {
		t.Fatalf("got %#v, want a %d %s naming %s", err, status, code, param)
	}
	return ae
}

func cmpStatus(s int) int {
	if s == 0 {
		return http.StatusBadRequest
	}
	return s
}

// A body without an output limit gets the model's written in (the right
// member for the model), reserved; a tier may refuse it instead; a body
// naming one is sent as it is.
func TestOutputLimitIsWrittenIn(t *testing.T) {
	t.Parallel()
	env := newBillEnv(t)
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	est := env.mustEstimate(t, "standard", env.a, llm.EndpointChat, `{"model":"gpt-4o","n":2,`+msgs+`}`)
	if est.Shape.OutputLimit != 1000 || est.MaxTokens != 2000 {
		t.Fatalf("shape %+v, max tokens %d: want 1000 written in, 2 choices reserved", est.Shape, est.MaxTokens)
	}
	route := est.Model.Routes()[0]
	req := est.Shape.Request(route, []byte(`{"model":"gpt-4o","n":2,`+msgs+`}`))
	if req.OutputLimit != 1000 || llm.OutputField(llm.EndpointChat, "gpt-4o") != "max_tokens" ||
		llm.OutputField(llm.EndpointChat, "o3-mini") != "max_completion_tokens" || llm.OutputField(llm.EndpointResponses, "gpt-4o") != "max_output_tokens" {
		t.Fatalf("request %+v", req)
	}
	stated := env.mustEstimate(t, "standard", env.a, llm.EndpointChat, `{"model":"gpt-4o","max_completion_tokens":30,`+msgs+`}`)
	if stated.Shape.OutputLimit != 0 || stated.MaxTokens != 30 {
		t.Fatalf("a stated limit: shape %+v, max %d", stated.Shape, stated.MaxTokens)
	}
	_, err := env.estimate(t, "strict", env.a, llm.EndpointChat, `{"model":"gpt-4o",`+msgs+`}`)
	wantRefusal(t, err, 400, "max_tokens", client.CodeOutputLimitRequired)
	_, err = env.estimate(t, "strict", env.a, llm.EndpointResponses, `{"model":"gpt-4o","input":"hi"}`)
	wantRefusal(t, err, 400, "max_output_tokens", client.CodeOutputLimitRequired)
	if _, err := env.estimate(t, "strict", env.a, llm.EndpointResponses, `{"model":"gpt-4o","input":"hi","max_output_tokens":20}`); err != nil {
		t.Fatal(err)
	}
	// A prediction's tokens may be billed as output beyond the limit.
	pred := env.mustEstimate(t, "standard", env.a, llm.EndpointChat,
		`{"model":"gpt-4o","max_tokens":30,"prediction":{"type":"content","content":"one two three four five"},`+msgs+`}`)
	if pred.MaxTokens != 35 {
		t.Fatalf("with a prediction: max %d, want 30 + 5", pred.MaxTokens)
	}
}

// A member named as one llmq reads but for case is refused at any depth,
// naming it; llmq never reads it as the member it resembles.
func TestCaseVariantsAreRefused(t *testing.T) {
	t.Parallel()
	env := newBillEnv(t)
	for _, c := range []struct{ endpoint, body, param string }{
		{llm.EndpointChat, `{"model":"gpt-4o","MAX_TOKENS":16,"messages":[{"role":"user","content":"hi"}]}`, "MAX_TOKENS"},
		{llm.EndpointChat, `{"model":"gpt-4o","max_tokens":16,"messages":[{"role":"user","content":"hi"},{"role":"assistant","Content":"x"}]}`, "messages[1].Content"},
		{llm.EndpointChat, `{"model":"gpt-4o","max_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"a","Text":"b"}]}]}`, "messages[0].content[0].Text"},
		{llm.EndpointChat, `{"model":"gpt-4o","max_tokens":16,"Service_Tier":"priority","messages":[{"role":"user","content":"hi"}]}`, "Service_Tier"},
		{llm.EndpointResponses, `{"model":"gpt-4o","Max_Output_Tokens":16,"input":"hi"}`, "Max_Output_Tokens"},
		{llm.EndpointResponses, `{"model":"gpt-4o","input":[{"role":"user","content":"a","CONTENT":"b"}]}`, "input[0].CONTENT"},
		{llm.EndpointResponses, `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_text","text":"a","TEXT":"b"}]}]}`, "input[0].content[0].TEXT"},
		{llm.EndpointEmbeddings, `{"model":"gpt-4o","INPUT":["x"],"input":"y"}`, "INPUT"},
	} {
		_, err := env.estimate(t, "standard", env.a, c.endpoint, c.body)
		ae := wantRefusal(t, err, 400, c.param, client.CodeCaseVariant)
		if !strings.Contains(ae.Message, "only in case") {
			t.Errorf("%s: %q", c.body, ae.Message)
		}
	}
}

// Service tiers are reserved at their price (the dearest the call may be
// billed at: a priority call may be served at the standard tier, a call
// naming none at any tier the deployment sells); a tier without a price
// is refused.
func TestServiceTiersArePriced(t *testing.T) {
	t.Parallel()
	env := newBillEnv(t)
	body := func(tier string) string {
		return `{"model":"gpt-4o","max_tokens":100,` + tier + `"messages":[{"role":"user","content":"hi"}]}`
	}
	m, _ := env.p.Model("gpt-4o")
	std := env.mustEstimate(t, "standard", env.a, llm.EndpointChat, body(`"service_tier":"default",`))
	prio := env.mustEstimate(t, "standard", env.a, llm.EndpointChat, body(`"service_tier":"priority",`))
	flex := env.mustEstimate(t, "standard", env.a, llm.EndpointChat, body(`"service_tier":"flex",`))
	auto := env.mustEstimate(t, "standard", env.a, llm.EndpointChat, body(`"service_tier":"auto",`))
	priority, _ := m.Deployments[0].Price.Tier("priority")
	if std.WorstCase != m.Deployments[0].Price.WorstCase(std.PromptTokens, 100) || prio.WorstCase != priority.WorstCase(prio.PromptTokens, 100) ||
		flex.WorstCase != std.WorstCase || auto.WorstCase != std.WorstCase {
		t.Fatalf("worst cases: default %s, priority %s, flex %s (a flex call may be served at standard), auto %s (the account's default tier)",
			std.WorstCase, prio.WorstCase, flex.WorstCase, auto.WorstCase)
	}
	// An account whose project serves auto at priority (auto_service_tier).
	d := m.Deployments[0]
	d.Price.AutoTier = "priority"
	route := config.Route{Model: m, Deployment: &d}
	if _, w := Charge(route, &auto.Shape, auto.Calibration, auto.PromptTokens, 100); w != prio.WorstCase {
		t.Fatalf("auto on a priority project: %s, want %s", w, prio.WorstCase)
	}
	if got, want := Bill(route.Price, &auto.Shape, llm.Usage{PromptTokens: 10, CompletionTokens: 5}), priority.Cost(money.Tokens{Prompt: 10, Completion: 5}); got != want {
		t.Fatalf("auto on a priority project, the answer naming no tier: %s, want %s", got, want)
	}
	_, err := env.estimate(t, "standard", env.a, llm.EndpointChat, body(`"service_tier":"scale",`))
	wantRefusal(t, err, 400, "service_tier", client.CodeUnsupportedValue)
	_, err = env.estimate(t, "standard", env.a, llm.EndpointChat, `{"model":"local","service_tier":"priority","messages":[{"role":"user","content":"hi"}]}`)
	wantRefusal(t, err, 400, "service_tier", client.CodeUnsupportedValue)

	// Charged at the tier the answer says served it.
	s := &prio.Shape
	u := llm.Usage{PromptTokens: 1000, CompletionTokens: 100, TotalTokens: 1100}
	if got, want := Bill(m.Deployments[0].Price, s, u), priority.Cost(money.Tokens{Prompt: 1000, Completion: 100}); got != want {
		t.Fatalf("served as asked: %s, want %s", got, want)
	}
	u.ServiceTier = "default"
	if got, want := Bill(m.Deployments[0].Price, s, u), m.Deployments[0].Price.Cost(money.Tokens{Prompt: 1000, Completion: 100}); got != want {
		t.Fatalf("served at standard: %s, want %s", got, want)
	}
	u.ServiceTier = "scale" // a tier without a price: the dearest it could be
	if got, want := Bill(m.Deployments[0].Price, s, u), priority.Cost(money.Tokens{Prompt: 1000, Completion: 100}); got != want {
		t.Fatalf("served at an unpriced tier: %s, want %s", got, want)
	}
}

// Built-in tools are priced per call and their results bound the input of
// every turn; max_tool_calls is written in when the body names none; a
// tool without a price is refused, as audio is.
func TestBuiltinToolsArePriced(t *testing.T) {
	t.Parallel()
	env := newBillEnv(t)
	m, _ := env.p.Model("gpt-4o")
	route := m.Routes()[0]
	est := env.mustEstimate(t, "standard", env.a, llm.EndpointResponses,
		`{"model":"gpt-4o","input":"find it","max_output_tokens":100,"tools":[{"type":"web_search_preview"},{"type":"function","name":"f"}]}`)
	s := est.Shape
	if !s.WriteToolCalls || s.ToolCalls != 3 || len(s.Tools) != 1 || s.Tools[0] != llm.ToolWebSearch {
		t.Fatalf("shape %+v: want web_search, 3 calls written in", s)
	}
	// Four turns, each reading the prompt, three results of 2,000 tokens
	// and the output: at most 4 × (P + 6,000 + 100) input tokens.
	bound := 4 * (est.PromptTokens + 6000 + 100)
	want := m.Deployments[0].Price.WorstCase(bound, 100) + 3*10_000
	if s.PromptBound(route, est.PromptTokens, 100) != bound || est.WorstCase != want {
		t.Fatalf("worst case %s (bound %d), want %s (bound %d)", est.WorstCase, s.PromptBound(route, est.PromptTokens, 100), want, bound)
	}
	if req := s.Request(route, nil); req.MaxToolCalls != 3 {
		t.Fatalf("request %+v: max_tool_calls not written", req)
	}
	// file_search has no result_tokens: the 128,000-token window bounds a
	// turn.
	fs := env.mustEstimate(t, "standard", env.a, llm.EndpointResponses,
		`{"model":"gpt-4o","input":"find it","max_output_tokens":100,"max_tool_calls":1,"tools":[{"type":"file_search","vector_store_ids":["vs_1"]}]}`)
	if fs.Shape.WriteToolCalls || fs.Shape.PromptBound(route, fs.PromptTokens, 100) != 2*128_000 {
		t.Fatalf("file search: %+v, bound %d", fs.Shape, fs.Shape.PromptBound(route, fs.PromptTokens, 100))
	}
	_, err := env.estimate(t, "standard", env.a, llm.EndpointResponses,
		`{"model":"gpt-4o","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`)
	wantRefusal(t, err, 400, "tools", client.CodeUnsupportedValue)
	_, err = env.estimate(t, "standard", env.a, llm.EndpointResponses, `{"model":"gpt-4o","input":"x","max_tool_calls":5000,"tools":[{"type":"web_search"}]}`)
	wantRefusal(t, err, 400, "max_tool_calls", client.CodeInvalidValue)
	_, err = env.estimate(t, "standard", env.a, llm.EndpointChat, `{"model":"gpt-4o","modalities":["text","audio"],"messages":[{"role":"user","content":"x"}]}`)
	wantRefusal(t, err, 400, "modalities", client.CodeUnsupportedValue)
	_, err = env.estimate(t, "standard", env.a, llm.EndpointChat,
		`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA","format":"wav"}}]}]}`)
	wantRefusal(t, err, 400, "messages[0].content[0]", client.CodeUnsupportedValue)

	// A chat search model's web search: one call, billed when it answered.
	chat := env.mustEstimate(t, "standard", env.a, llm.EndpointChat,
		`{"model":"gpt-4o","max_tokens":50,"web_search_options":{},"messages":[{"role":"user","content":"x"}]}`)
	if chat.Shape.ToolCalls != 1 || chat.Shape.WriteToolCalls {
		t.Fatalf("chat web search: %+v", chat.Shape)
	}
	u := llm.Usage{PromptTokens: 500, CompletionTokens: 50, TotalTokens: 550}
	if got, want := Bill(m.Deployments[0].Price, &chat.Shape, u), m.Deployments[0].Price.Cost(money.Tokens{Prompt: 500, Completion: 50})+10_000; got != want {
		t.Fatalf("chat web search billed %s, want %s", got, want)
	}
	// Tool calls as the answer reports them, each at its price.
	u.ToolCalls = map[string]int64{llm.ToolWebSearch: 2}
	if got, want := Bill(m.Deployments[0].Price, &s, u), m.Deployments[0].Price.Cost(money.Tokens{Prompt: 500, Completion: 50})+20_000; got != want {
		t.Fatalf("two searches billed %s, want %s", got, want)
	}
	if why := Unbelievable(route, &s, est.PromptTokens, 100, llm.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15,
		ToolCalls: map[string]int64{llm.ToolWebSearch: 4}}); !strings.Contains(why, "4 built-in tool calls") {
		t.Fatalf("four calls of three allowed: %q", why)
	}
	if why := Unbelievable(route, &s, est.PromptTokens, 100, llm.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15,
		ToolCalls: map[string]int64{llm.ToolFileSearch: 1}}); !strings.Contains(why, "did not name") {
		t.Fatalf("a tool it did not name: %q", why)
	}
}

// Prompt content llmq cannot count is bounded by the context window, and
// refused where the policy gives none.
func TestUncountedContentIsBoundedByTheWindow(t *testing.T) {
	t.Parallel()
	env := newBillEnv(t)
	m, _ := env.p.Model("gpt-4o")
	est := env.mustEstimate(t, "standard", env.a, llm.EndpointResponses,
		`{"model":"gpt-4o","max_output_tokens":50,"service_tier":"default","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-1"},{"type":"input_text","text":"sum up"}]}]}`)
	if est.Shape.Unbounded != "input[0].content[0]" || est.WorstCase != m.Deployments[0].Price.WorstCase(128_000, 50) {
		t.Fatalf("a file: %+v, worst %s", est.Shape, est.WorstCase)
	}
	_, err := env.estimate(t, "standard", env.a, llm.EndpointChat,
		`{"model":"local","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}}]}]}`)
	wantRefusal(t, err, 400, "messages[0].content[0]", client.CodeUnsupportedValue)
}

// A follow-up continues only its own tenant's stored responses: they
// bring their tokens and pin the deployment that holds them; another
// tenant's reads as one llmq does not know (a 404, the same words); one
// made elsewhere is refused, or with allow_foreign_responses bounded by
// the window, as a conversation or prompt template is.
func TestFollowUpsBelongToTheirTenant(t *testing.T) {
	t.Parallel()
	env := newBillEnv(t)
	ctx := t.Context()
	if err := env.db.StoredResponseInsert(ctx, []store.StoredResponse{
		{ID: "resp_a", ResponseID: "resp_a", TenantID: env.a, Deployment: "openai-b/gpt-4o", Tokens: 3000},
		{ID: "msg_a", ResponseID: "resp_a", TenantID: env.a, Deployment: "openai-b/gpt-4o", Tokens: 400},
		{ID: "resp_x", ResponseID: "resp_x", TenantID: env.a, Deployment: "openai/gpt-4o", Tokens: 10},
	}); err != nil {
		t.Fatal(err)
	}
	follow := func(extra string) string {
		return `{"model":"gpt-4o","max_output_tokens":20,` + extra + `}`
	}
	base := env.mustEstimate(t, "standard", env.a, llm.EndpointResponses, follow(`"input":"and then?"`))
	more := env.mustEstimate(t, "standard", env.a, llm.EndpointResponses, follow(`"input":[{"role":"user","content":"more"}]`))
	own := env.mustEstimate(t, "standard", env.a, llm.EndpointResponses, follow(`"input":"and then?","previous_response_id":"resp_a"`))
	if own.PromptTokens != base.PromptTokens+3000 || !own.Shape.Follows || own.Shape.Pinned != "openai-b/gpt-4o" || own.Shape.Unbounded != "" {
		t.Fatalf("own follow-up: prompt %d (alone %d), shape %+v", own.PromptTokens, base.PromptTokens, own.Shape)
	}
	m, _ := env.p.Model("gpt-4o")
	routes := m.Routes()
	if Serves(routes[0], &own.Shape) == nil || Serves(routes[1], &own.Shape) != nil {
		t.Fatal("the follow-up may go to a deployment that does not hold its conversation")
	}
	item := env.mustEstimate(t, "standard", env.a, llm.EndpointResponses,
		follow(`"input":[{"type":"item_reference","id":"msg_a"},{"type":"item_reference","id":"msg_a"},{"role":"user","content":"more"}]`))
	if item.PromptTokens != more.PromptTokens+800 || item.Shape.Pinned != "openai-b/gpt-4o" {
		t.Fatalf("item references: prompt %d, shape %+v", item.PromptTokens, item.Shape)
	}
	_, err := env.estimate(t, "standard", env.a, llm.EndpointResponses,
		follow(`"previous_response_id":"resp_a","input":[{"type":"item_reference","id":"resp_x"}]`))
	wantRefusal(t, err, 400, "input[0].id", client.CodeInvalidValue)

	// Tenant b: a's response, and one nobody made, answer alike.
	_, errA := env.estimate(t, "standard", env.b, llm.EndpointResponses, follow(`"input":"x","previous_response_id":"resp_a"`))
	_, errN := env.estimate(t, "standard", env.b, llm.EndpointResponses, follow(`"input":"x","previous_response_id":"resp_nobody"`))
	a := wantRefusal(t, errA, 404, "previous_response_id", client.CodeNotFound)
	n := wantRefusal(t, errN, 404, "previous_response_id", client.CodeNotFound)
	if strings.ReplaceAll(a.Message, "resp_a", "ID") != strings.ReplaceAll(n.Message, "resp_nobody", "ID") {
		t.Fatalf("another tenant's response is told apart from an unknown one:\n%s\n%s", a.Message, n.Message)
	}
	_, err = env.estimate(t, "standard", env.b, llm.EndpointResponses, follow(`"input":[{"type":"item_reference","id":"msg_a"}]`))
	wantRefusal(t, err, 404, "input[0].id", client.CodeNotFound)

	// A tier allowing foreign responses: one made elsewhere is the window.
	foreign := env.mustEstimate(t, "open", env.b, llm.EndpointResponses, follow(`"input":"x","service_tier":"default","previous_response_id":"resp_elsewhere"`))
	if foreign.Shape.Unbounded != "previous_response_id" || foreign.WorstCase != m.Deployments[0].Price.WorstCase(128_000, 20) {
		t.Fatalf("a foreign follow-up: %+v, worst %s", foreign.Shape, foreign.WorstCase)
	}
	// ... but never another tenant's.
	_, err = env.estimate(t, "open", env.b, llm.EndpointResponses, follow(`"input":"x","previous_response_id":"resp_a"`))
	wantRefusal(t, err, 404, "previous_response_id", client.CodeNotFound)
	for _, unseen := range []string{`"conversation":"conv_1","input":"x","service_tier":"default"`, `"prompt":{"id":"pmpt_1"},"service_tier":"default"`} {
		_, err := env.estimate(t, "standard", env.a, llm.EndpointResponses, follow(unseen))
		var ae *wire.Error
		if !errors.As(err, &ae) || ae.Code != client.CodeUnsupportedParameter {
			t.Fatalf("%s: %v", unseen, err)
		}
		est := env.mustEstimate(t, "open", env.a, llm.EndpointResponses, follow(unseen))
		if est.Shape.Unbounded == "" || est.WorstCase != m.Deployments[0].Price.WorstCase(max(128_000, est.PromptTokens), 20) {
			t.Fatalf("%s allowed: %+v, worst %s", unseen, est.Shape, est.WorstCase)
		}
	}
}

// Usage up to what the request as sent could be billed is believed,
// whatever llmq estimated; past it, it is the bound that is charged.
func TestUsageIsBelievedUpToTheBound(t *testing.T) {
	t.Parallel()
	env := newBillEnv(t)
	m, _ := env.p.Model("gpt-4o")
	route := m.Routes()[0]
	est := env.mustEstimate(t, "standard", env.a, llm.EndpointChat, `{"model":"gpt-4o","max_tokens":50,"service_tier":"default","messages":[{"role":"user","content":"hi"}]}`)
	s := &est.Shape
	eightfold := llm.Usage{PromptTokens: 8 * est.PromptTokens, CompletionTokens: 50, TotalTokens: 8*est.PromptTokens + 50}
	if why := Unbelievable(route, s, est.PromptTokens, 50, eightfold); why != "" {
		t.Fatalf("a prompt eight times llmq's count was not believed: %s", why)
	}
	if got, want := Bill(route.Price, s, eightfold), route.Price.Cost(money.Tokens{Prompt: eightfold.PromptTokens, Completion: 50}); got != want {
		t.Fatalf("charged %s, want the provider's count at the price, %s", got, want)
	}
	for _, u := range []llm.Usage{
		{PromptTokens: 128_001, CompletionTokens: 5, TotalTokens: 128_006},
		{PromptTokens: 10, CompletionTokens: 60, TotalTokens: 70},
		{PromptTokens: -1, CompletionTokens: 5},
	} {
		if why := Unbelievable(route, s, est.PromptTokens, 50, u); why == "" {
			t.Fatalf("%+v believed", u)
		}
	}
	b := Disbelieved(route, s, route.Price, est.PromptTokens, 50)
	if b.PromptTokens != 128_000 || b.Cost != route.Price.WorstCase(128_000, 50) {
		t.Fatalf("the bound charged: %+v", b)
	}
	// With no context window in the policy, the bound is far past any
	// model's, never the estimate.
	local, _ := env.p.Model("local")
	if why := Unbelievable(local.Routes()[0], s, 10, 50, llm.Usage{PromptTokens: 900_000, CompletionTokens: 5, TotalTokens: 900_005}); why != "" {
		t.Fatalf("a large prompt on a model of unknown window was not believed: %s", why)
	}
}
