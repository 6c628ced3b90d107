package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// budgetPolicy adds to the test policy an expensive model, a rejecting tier
// whose day is New York's, and a $5 global cap.
var budgetPolicy = strings.Replace(apptest.PolicyYAML, "tiers:\n", `  - name: gpt-pricey
    provider: sim
    upstream: gpt-4o
    price: {input_per_mtok: 60, output_per_mtok: 600}
    limits: {rpm: 3000, tpm: 300000}
tiers:
  - {name: nyc, daily_budget_usd: 1, priority: default, on_exhausted: reject, api_rps: 1000, timezone: America/New_York}
`, 1) + "global_daily_budget_usd: 5\n"

func startBudget(t *testing.T, now time.Time) *apptest.App {
	t.Helper()
	clk := testutil.NewClock(now)
	return apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: budgetPolicy, Clock: clk.Now})
}

// reserveFor holds amount of tenantID's budget under another job's id.
func reserveFor(t *testing.T, a *apptest.App, tenantID, id string, amount money.Micros) *budget.Reservation {
	t.Helper()
	acct := a.Account(tenantID)
	res, d, err := a.Budgets.Reserve(context.Background(), acct, id, amount)
	if err != nil || !d.Allowed {
		t.Fatalf("reserve %s for %s: %v %+v", amount, tenantID, err, d)
	}
	return res
}

// A rejecting tier answers 429 at enqueue with the budget that ran out, its
// own numbers, and Retry-After to its own reset: the tenant's day ends at
// midnight in New York, the global cap's at midnight UTC.
func TestRejectTierNamesTheBudgetThatRanOut(t *testing.T) {
	t.Parallel()
	// 18:00 in New York: the tenant's day ends in 6 h, the UTC day in 2 h.
	a := startBudget(t, time.Date(2026, 6, 1, 22, 0, 0, 0, time.UTC))
	tenant, key := a.Tenant("nyc")
	body := map[string]any{"body": apptest.ChatBody("hello", "", 50)}
	r := a.Do("POST", "/v1/jobs", key, body)
	if r.Status != 202 {
		t.Fatalf("a job that fits: %d %s", r.Status, r.Body)
	}
	j, err := a.Store.JobGetByID(context.Background(), r.Map(t)["id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	worst := j.EstCost
	// check posts the job and wants code, the budget's name and numbers,
	// said (its reset, or that running jobs hold it), and Retry-After.
	check := func(code client.Code, name, retryAfter, said, numbers string) {
		t.Helper()
		r := a.Do("POST", "/v1/jobs", key, body)
		e := checkError(t, r, 429, code, "")
		if e.Error.Type != "budget_exceeded_error" {
			t.Fatalf("type %q", e.Error.Type)
		}
		for _, want := range []string{name, numbers, said} {
			if !strings.Contains(e.Error.Message, want) {
				t.Fatalf("message %q does not say %q", e.Error.Message, want)
			}
		}
		if got := r.Header.Get("Retry-After"); got != retryAfter {
			t.Fatalf("Retry-After = %s, want %s", got, retryAfter)
		}
		if r.Header.Get("X-Budget-Remaining") == "" {
			t.Fatalf("429 without X-Budget-Remaining: %v", r.Header)
		}
	}

	ctx := context.Background()
	// The tenant's own budget: another of its jobs holds all but a
	// micro-dollar too little for this one. Held, not spent: it comes back
	// as that job settles, so the refusal says so and asks for a retry in
	// a second.
	hold := money.PerDollar - worst + 1
	other := reserveFor(t, a, tenant, "job_other", hold)
	check(client.CodeBudgetHeld, "tenant's daily budget", "1", "held by running jobs",
		"$0.000000 spent and $"+hold.String()+" reserved of $1.000000")
	// Spent: it cannot fit before the tenant's day resets.
	if err := a.Budgets.Settle(ctx, other, hold, true); err != nil {
		t.Fatal(err)
	}
	check(client.CodeBudgetExhausted, "tenant's daily budget", "21600", "2026-06-02T04:00:00Z",
		"$"+hold.String()+" spent and $0.000000 reserved of $1.000000")

	// The global cap: another tenant spent all but what this job needs.
	ny2, key2 := a.Tenant("nyc")
	big, _ := a.Tenant("premium")
	spent := 5*money.PerDollar - hold - worst + 1
	if err := a.Budgets.Settle(ctx, reserveFor(t, a, big, "job_big", spent), spent, true); err != nil {
		t.Fatal(err)
	}
	key = key2
	check(client.CodeBudgetExhausted, "global daily budget (all tenants)", "7200", "2026-06-02T00:00:00Z",
		"$"+(hold+spent).String()+" spent and $0.000000 reserved of $5.000000")

	for ten, want := range map[string]int{tenant: 1, ny2: 0} {
		jobs, _, err := a.Store.JobList(ctx, &store.JobListParams{TenantID: ten, Limit: 10})
		if err != nil || len(jobs) != want {
			t.Fatalf("jobs stored of %s: %d %v; want %d, the one that fitted", ten, len(jobs), err, want)
		}
	}
}

// A job whose worst case exceeds the whole daily budget, or the global cap,
// can never run: 400 at once, nothing stored, nothing enqueued.
func TestJobOverTheWholeBudgetIsRefused(t *testing.T) {
	t.Parallel()
	a := startBudget(t, time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	pricey := func(maxTokens int) map[string]any {
		return map[string]any{"body": map[string]any{"model": "gpt-pricey", "max_tokens": maxTokens,
			"messages": []map[string]any{{"role": "user", "content": "hi"}}}}
	}
	tenant, key := a.Tenant("free") // $1: 2,000 output tokens cost $1.20
	e := checkError(t, a.Do("POST", "/v1/jobs", key, pricey(2000)), 400, client.CodeBudgetTooSmall, "body.max_tokens")
	if !strings.Contains(e.Error.Message, "$1.000000") {
		t.Fatalf("message %q does not name the $1.00 budget", e.Error.Message)
	}
	nothingQueued(t, a, tenant)

	unlimited, ukey := a.Tenant("internal") // no budget of its own; the $5 cap
	e = checkError(t, a.Do("POST", "/v1/jobs", ukey, pricey(9000)), 400, client.CodeBudgetTooSmall, "body.max_tokens")
	if !strings.Contains(e.Error.Message, "global") {
		t.Fatalf("message %q does not name the global cap", e.Error.Message)
	}
	nothingQueued(t, a, unlimited)
}

// A tenant exempt from the API limit (api_exempt on the tenant, in a tier
// that has a limit) is never rate-limited; its tier's other tenants are.
func TestTenantAPIExempt(t *testing.T) {
	t.Parallel()
	a := start(t)
	r := a.Do("POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": "internal-service", "tier": "free", "api_exempt": true})
	if r.Status != http.StatusCreated || r.Map(t)["api_exempt"] != true {
		t.Fatalf("create exempt tenant: %d %s", r.Status, r.Body)
	}
	r = a.Do("POST", "/admin/v1/tenants/"+r.Map(t)["id"].(string)+"/keys", apptest.AdminToken, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("create key: %d %s", r.Status, r.Body)
	}
	exempt := r.Map(t)["key"].(string)
	_, limited := a.Tenant("free") // api_rps 5
	got429 := false
	for i := 0; i < 20; i++ {
		if r := a.Do("GET", "/v1/jobs", exempt, nil); r.Status != 200 || r.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("exempt tenant, request %d: %d %v", i, r.Status, r.Header)
		}
		if a.Do("GET", "/v1/jobs", limited, nil).Status == 429 {
			got429 = true
		}
	}
	if !got429 {
		t.Fatal("the tier's other tenant was never limited at 5 rps")
	}
}
