package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/store"
)

// The findings of an outside probe of the budget, each as it was found,
// against a provider that does the worst its documentation allows.

// findingsPolicy is gpt-4o at its list price, its default output limit
// (4,096 tokens, written into requests that state none), with small
// budgets.
const findingsPolicy = `
providers:
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, timeout: 20s}
models:
  - name: gpt-4o
    provider: sim
    limits: {rpm: 100000, tpm: 100000000}
    price:
      input_per_mtok: 2.5
      output_per_mtok: 10
      service_tier_prices:
        priority: {input_per_mtok: 4.25, output_per_mtok: 17}
      tool_prices:
        web_search: {per_call_usd: 0.01, result_tokens: 1000}
tiers:
  - {name: dime, daily_budget_usd: 0.10, on_exhausted: defer, api_rps: 1000}
  - {name: dollar, daily_budget_usd: 1, on_exhausted: reject, api_rps: 1000}
  - {name: five, daily_budget_usd: 5, on_exhausted: defer, api_rps: 1000, batch_offload: auto}
  - {name: big, daily_budget_usd: 1000, api_rps: 1000}
`

// billedOf sums what the provider billed, at the policy's prices.
func billedOf(t *testing.T, a *apptest.App, bills []sim.Bill) money.Micros {
	t.Helper()
	var sum money.Micros
	for _, b := range bills {
		sum += priced(t, a.Policy.Current(), b)
	}
	return sum
}

// spentOf is the tenant's spend today, as the budget (Redis) counts it.
func spentOf(t *testing.T, a *apptest.App, key string) money.Micros {
	t.Helper()
	u := settledUsage(t, a, key)
	return money.Micros(u["spent_usd"].(float64)*1e6 + 0.5)
}

// Finding 1: requests without max_tokens (the SDKs' default), 12 at once
// on a $0.10 day, against a provider whose default output is 16,000
// tokens: llmq wrote its own limit into each, so neither the day's spend
// nor the provider's bill passes the budget ($0.192 of $0.10 before). The
// same on a $1 rejecting tier ($1.47 before).
func TestNoOutputLimitNeverPassesTheBudget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tier   string
		budget money.Micros
	}{{"dime", 100_000}, {"dollar", money.PerDollar}} {
		t.Run(c.tier, func(t *testing.T) {
			t.Parallel()
			a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: findingsPolicy, Sim: worstSim()})
			_, key := a.Tenant(c.tier)
			var wg sync.WaitGroup
			statuses := make([]int, 12)
			for i := range 12 {
				wg.Go(func() {
					r := a.Do("POST", "/v1/chat/completions", key, map[string]any{"model": "gpt-4o",
						"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("Write an essay, number %d.", i)}}})
					statuses[i] = r.Status
				})
			}
			wg.Wait()
			bills := a.Sim.Bills()
			for _, b := range bills {
				if b.OutputTokens != 4096 {
					t.Fatalf("a call produced %d tokens: the limit llmq reserved (4,096) was not in the request", b.OutputTokens)
				}
			}
			billed, spent := billedOf(t, a, bills), spentOf(t, a, key)
			t.Logf("%s: answers %v; %d calls billed $%s, spent $%s of $%s", c.tier, statuses, len(bills), billed, spent, c.budget)
			if len(bills) == 0 || billed > c.budget || spent > c.budget || spent != billed {
				t.Fatalf("%d calls billed $%s, the day spent $%s: the budget is $%s", len(bills), billed, spent, c.budget)
			}
		})
	}
}

// Finding 2: keys that differ only in case: admitted as the one Go's
// decoder took, sent with both (charged 95 times the reservation). Now a
// 400 naming the member, and nothing sent.
func TestCaseVariantsNeverReachTheProvider(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: findingsPolicy, Sim: worstSim()})
	_, key := a.Tenant("big")
	for _, c := range []struct{ body, param string }{
		{`{"model":"gpt-4o","max_tokens":2000,"MAX_TOKENS":16,"messages":[{"role":"user","content":"hi"}]}`, "MAX_TOKENS"},
		{`{"model":"gpt-4o","max_tokens":16,"messages":[{"role":"user","Content":"` + strings.Repeat("word ", 50000) + `","content":"hi"}]}`, "messages[0].content"},
		{`{"model":"gpt-4o","MAX_TOKENS":16,"messages":[{"role":"user","content":"hi"}]}`, "MAX_TOKENS"},
	} {
		r := a.Do("POST", "/v1/chat/completions", key, c.body)
		var e struct {
			Error struct {
				Param, Message string
			} `json:"error"`
		}
		r.JSON(t, &e)
		if r.Status != 400 || e.Error.Param != c.param || !strings.Contains(e.Error.Message, "case") {
			t.Fatalf("%d %s, want a 400 naming %s", r.Status, r.Body, c.param)
		}
	}
	// The job's own members too: Go's decoder would take "BODY" for body.
	r := a.Do("POST", "/v1/jobs", key, `{"BODY":{"model":"gpt-4o","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}`)
	if m := r.Map(t)["error"].(map[string]any); r.Status != 400 || m["code"] != "case_variant" || m["param"] != "BODY" {
		t.Fatalf("%d %s, want a 400 case_variant naming BODY", r.Status, r.Body)
	}
	if st := a.Sim.Stats(); st.Requests != 0 {
		t.Fatalf("%d requests reached the provider", st.Requests)
	}
}

// Finding 3: follow-ups of responses made through a batch offloaded to the
// provider's Batch API were not remembered, each reserved as its own few
// tokens (12 at once: $5.94 spent of a $5 day). Now each reserves its
// conversation, and the day holds.
func TestOffloadedResponsesAreFollowedUp(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: findingsPolicy, Sim: worstSim(), Workers: 2,
		Offload: offload.Options{PollMin: 50 * time.Millisecond, PollMax: 200 * time.Millisecond, RetryAfter: time.Second}})
	ctx := context.Background()
	tenant, key := a.Tenant("five")
	var in bytes.Buffer
	long := strings.Repeat("river stone cloud light ", 6000) // about 24,000 tokens
	for i := range 12 {
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("c%d", i), "method": "POST", "url": llm.EndpointResponses,
			"body": map[string]any{"model": "gpt-4o", "input": fmt.Sprintf("%d %s", i, long), "max_output_tokens": 100}})
		in.Write(line)
		in.WriteByte('\n')
	}
	f, err := a.Store.FileInsert(ctx, &store.FileInsertParams{TenantID: tenant, Purpose: store.FilePurposeBatch, Filename: "in.jsonl", Content: &in})
	if err != nil {
		t.Fatal(err)
	}
	r := a.Do("POST", "/v1/batches", key, map[string]any{"input_file_id": f.ID, "endpoint": llm.EndpointResponses, "completion_window": "24h"})
	if r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	batchID := r.Map(t)["id"].(string)
	eventually(t, time.Minute, func() bool {
		_ = a.Offload.Sweep(ctx)
		_ = a.Batches.Sweep(ctx)
		b, err := a.Store.BatchGetByID(ctx, batchID)
		return err == nil && b.Status == store.BatchCompleted
	}, "the batch completed")
	var ids []string
	var batchBills int
	for _, b := range a.Sim.Bills() {
		if b.Batch {
			batchBills++
			ids = append(ids, b.ResponseID)
		}
	}
	if batchBills != 12 {
		t.Fatalf("%d lines ran on the provider's Batch API, want 12", batchBills)
	}
	before := spentOf(t, a, key)
	var wg sync.WaitGroup
	jobs := make([]string, len(ids))
	for i, id := range ids {
		wg.Go(func() {
			r := a.Do("POST", "/v1/responses", key, map[string]any{"model": "gpt-4o", "input": "And then?", "max_output_tokens": 50,
				"previous_response_id": id})
			jobs[i] = r.Header.Get("X-Llmq-Job-Id")
		})
	}
	wg.Wait()
	p := a.Policy.Current()
	bills := map[string]sim.Bill{}
	for _, b := range a.Sim.Bills() {
		bills[b.RequestID] = b
	}
	for i, id := range jobs {
		j := a.EndedJob(id)
		row, err := a.Store.StoredResponseGet(ctx, []string{ids[i]})
		if err != nil || row[ids[i]] == nil {
			t.Fatalf("the offloaded response %s was not recorded: %v", ids[i], err)
		}
		if j.EstPromptTokens < row[ids[i]].Tokens {
			t.Fatalf("follow-up %s reserved a prompt of %d tokens; its conversation holds %d", id, j.EstPromptTokens, row[ids[i]].Tokens)
		}
		if b, ok := bills[j.ProviderRequestID]; ok && priced(t, p, b) > j.EstCost {
			t.Fatalf("follow-up %s billed $%s, more than the $%s reserved", id, priced(t, p, b), j.EstCost)
		}
	}
	spent := spentOf(t, a, key)
	t.Logf("12 follow-ups of offloaded responses: the day spent $%s ($%s before them)", spent, before)
	if spent > 5*money.PerDollar {
		t.Fatalf("the day spent $%s of $5", spent)
	}
}

// Finding 4: a prompt the provider counts eight times llmq's estimate
// (another tokenizer) was called unbelievable and charged at llmq's own
// estimate. Usage up to what the request as sent could be billed is now
// believed, and charged as billed.
func TestLargerCountsAreChargedAsBilled(t *testing.T) {
	t.Parallel()
	cfg := worstSim()
	cfg.PromptFactor = 8
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: findingsPolicy, Sim: cfg})
	_, key := a.Tenant("big")
	r := a.Do("POST", "/v1/chat/completions", key, map[string]any{"model": "gpt-4o", "max_tokens": 20,
		"messages": []map[string]any{{"role": "user", "content": strings.Repeat("water light model ", 200)}}})
	if r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	j := a.EndedJob(r.Header.Get("X-Llmq-Job-Id"))
	bills := a.Sim.Bills()
	if len(bills) != 1 || bills[0].InputTokens < 7*j.EstPromptTokens {
		t.Fatalf("bills %+v for a prompt llmq counts %d", bills, j.EstPromptTokens)
	}
	if billed := priced(t, a.Policy.Current(), bills[0]); j.Cost != billed || j.UsageEstimated || j.Status != store.JobSucceeded {
		t.Fatalf("charged $%s (%s, estimated %v) for a call billed $%s", j.Cost, j.Status, j.UsageEstimated, billed)
	}
}

// Finding 5: a priority service tier was forwarded unpriced, and built-in
// tools were counted as their JSON text. Both are now reserved at their
// prices, charged as the answer reports them, and refused where the policy
// prices neither.
func TestServiceTiersAndToolsAreReservedAndCharged(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: findingsPolicy, Sim: worstSim()})
	_, key := a.Tenant("big")
	p := a.Policy.Current()
	for _, body := range []map[string]any{
		{"model": "gpt-4o", "max_tokens": 50, "service_tier": "priority", "messages": []map[string]any{{"role": "user", "content": "hi"}}},
		{"model": "gpt-4o", "max_output_tokens": 50, "input": "look it up", "tools": []any{map[string]any{"type": "web_search"}}},
	} {
		path := "/v1/chat/completions"
		if _, ok := body["input"]; ok {
			path = "/v1/responses"
		}
		before := len(a.Sim.Bills())
		r := a.Do("POST", path, key, body)
		if r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
		j := a.EndedJob(r.Header.Get("X-Llmq-Job-Id"))
		bills := a.Sim.Bills()[before:]
		billed := priced(t, p, bills[0])
		if len(bills) != 1 || j.Cost != billed || billed > j.EstCost {
			t.Fatalf("%s: charged $%s, billed $%s (%+v), reserved $%s", path, j.Cost, billed, bills, j.EstCost)
		}
		t.Logf("%s: billed $%s (tier %s, tools %v), reserved $%s", path, billed, bills[0].ServiceTier, bills[0].ToolCalls, j.EstCost)
	}
	for _, body := range []map[string]any{
		{"model": "gpt-4o", "service_tier": "flex", "messages": []map[string]any{{"role": "user", "content": "hi"}}},
		{"model": "gpt-4o", "input": "x", "tools": []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}}},
	} {
		path := "/v1/chat/completions"
		if _, ok := body["input"]; ok {
			path = "/v1/responses"
		}
		if r := a.Do("POST", path, key, body); r.Status != 400 {
			t.Fatalf("%s %v: %d %s, want 400", path, body, r.Status, r.Body)
		}
	}
}

// Finding 6: one tenant continued another's conversation: the provider
// answered tenant B with tenant A's context. Now B's follow-up of A's
// response (or item) is a 404, said as of an id nobody made, with no call;
// A's own follow-up works.
func TestAnotherTenantsConversationIsNotFound(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: findingsPolicy, Sim: worstSim()})
	_, keyA := a.Tenant("big")
	_, keyB := a.Tenant("big")
	r := a.Do("POST", "/v1/responses", keyA, map[string]any{"model": "gpt-4o", "input": "My secret is 42.", "max_output_tokens": 20})
	if r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	respID, items := storedIDs(t, r.Body)
	calls := a.Sim.Stats().Requests
	missing := func(id string) string {
		r := a.Do("POST", "/v1/responses", keyB, map[string]any{"model": "gpt-4o", "input": "What is my secret?", "previous_response_id": id})
		if r.Status != 404 {
			t.Fatalf("tenant B naming %s: %d %s, want 404", id, r.Status, r.Body)
		}
		return strings.ReplaceAll(string(r.Body), id, "ID")
	}
	if missing(respID) != missing("resp_nobody_made_this") {
		t.Fatal("another tenant's response is told apart from one nobody made")
	}
	r = a.Do("POST", "/v1/responses", keyB, map[string]any{"model": "gpt-4o",
		"input": []any{map[string]any{"type": "item_reference", "id": items[0]}, map[string]any{"role": "user", "content": "and?"}}})
	if r.Status != 404 {
		t.Fatalf("tenant B naming A's item: %d %s", r.Status, r.Body)
	}
	if n := a.Sim.Stats().Requests; n != calls {
		t.Fatalf("%d calls reached the provider for tenant B's follow-ups", n-calls)
	}
	r = a.Do("POST", "/v1/responses", keyA, map[string]any{"model": "gpt-4o", "input": "What is my secret?", "max_output_tokens": 20,
		"previous_response_id": respID})
	if r.Status != 200 {
		t.Fatalf("tenant A's own follow-up: %d %s", r.Status, r.Body)
	}
}
