package worker_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

// heldPolicy has a model every job here reserves $0.005 of (50 output
// tokens at $100 per 1M; prompts are free) and costs $0.002 of (the
// simulator answers 20 tokens: heldSim), and two $0.02 tiers, one that
// defers when its budget is spent and one that rejects.
var heldPolicy = strings.Replace(apptest.PolicyYAML, "tiers:\n", `  - name: gpt-held
    provider: sim
    price: {input_per_mtok: 0, output_per_mtok: 100}
    limits: {rpm: 3000, tpm: 300000}
tiers:
  - {name: tight, daily_budget_usd: 0.02, priority: default, on_exhausted: defer, api_rps: 1000}
  - {name: tight-reject, daily_budget_usd: 0.02, priority: default, on_exhausted: reject, api_rps: 1000}
`, 1)

// heldSim answers 40% of max_tokens, after a second: the jobs beside a
// job hold their worst case for that long.
var heldSim = sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Echo: true,
	CompletionMin: 0.4, CompletionMax: 0.4, Latency: time.Second}

var heldBody = map[string]any{"body": map[string]any{"model": "gpt-held", "max_tokens": 50,
	"messages": []map[string]any{{"role": "user", "content": "hi"}}}}

// startHeld is a test app of heldPolicy without workers yet.
func startHeld(t *testing.T) *apptest.App {
	t.Helper()
	sc := heldSim
	return apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: heldPolicy, Sim: &sc})
}

// allEnded waits up to 60 s for every job to end, and returns them with
// how many jobs were seen in each status on the way (read every 10 ms: a
// wait for room lasts a second or more).
func allEnded(t *testing.T, a *apptest.App, ids []string) ([]*store.Job, map[store.JobStatus]int) {
	t.Helper()
	var jobs []*store.Job
	seen := map[string]map[store.JobStatus]bool{}
	testutil.Eventually(t, 60*time.Second, func() bool {
		jobs = jobs[:0]
		for _, id := range ids {
			j := job(t, a, id)
			if seen[id] == nil {
				seen[id] = map[store.JobStatus]bool{}
			}
			seen[id][j.Status] = true
			if j.Status.Terminal() {
				jobs = append(jobs, j)
			}
		}
		return len(jobs) == len(ids)
	})
	counts := map[store.JobStatus]int{}
	for _, ss := range seen {
		for st := range ss {
			counts[st]++
		}
	}
	return jobs, counts
}

// Eight jobs of a $0.02 day that defers, each reserving $0.005 and costing
// $0.002 ($0.016 in all), run at once: four hold the day and the other four
// are refused by their holds alone, so they wait (status waiting, a second
// or two) instead of being deferred to the reset, and all eight succeed.
// Two more then find $0.016 spent: $0.005 more would pass the budget, so
// they are deferred to the reset.
func TestHeldBudgetWaitsForRoomOnDeferTier(t *testing.T) {
	t.Parallel()
	a := startHeld(t)
	tenant, key := a.Tenant("tight")
	var ids []string
	for range 8 {
		ids = append(ids, submit(t, a, key, heldBody))
	}
	began := time.Now()
	a.StartWorker(worker.Options{})
	var charged money.Micros
	jobs, seen := allEnded(t, a, ids)
	for _, j := range jobs {
		if j.Status != store.JobSucceeded || j.Cost != 2_000 || j.EstCost != 5_000 {
			t.Fatalf("job %s: %s, cost %s of %s worst case, error %+v", j.ID, j.Status, j.Cost, j.EstCost, j.Error)
		}
		charged += j.Cost
	}
	t.Logf("8 jobs succeeded %v after the worker started", time.Since(began).Round(100*time.Millisecond))
	if seen[store.JobWaiting] < 4 || seen[store.JobDeferred] != 0 {
		t.Fatalf("jobs seen waiting %d, deferred %d; want the four the holds refused waiting, none deferred",
			seen[store.JobWaiting], seen[store.JobDeferred])
	}
	st := status(t, a, a.Account(tenant))
	if st.Spent != charged || charged != 16_000 || st.Reserved != 0 {
		t.Fatalf("spent %s, reserved %s; the jobs cost %s, want $0.016", st.Spent, st.Reserved, charged)
	}

	// $0.016 spent: a $0.005 worst case cannot fit before the reset.
	late := []string{submit(t, a, key, heldBody), submit(t, a, key, heldBody)}
	for _, id := range late {
		testutil.Eventually(t, 60*time.Second, func() bool { return job(t, a, id).Status == store.JobDeferred })
		if j := job(t, a, id); j.NextRunAt == nil || j.NextRunAt.Before(st.ResetsAt) {
			t.Fatalf("job %s deferred until %v, want the reset %v", id, j.NextRunAt, st.ResetsAt)
		}
	}
}

// The same eight jobs on a tier that rejects: queued while nothing is
// held, refused in the worker only by holds, they wait as a deferring
// tier's do and all succeed. A job posted while running jobs hold the day
// is refused with budget_held and a Retry-After of a second, never
// budget_exhausted; once $0.016 is spent, one is budget_exhausted until
// the reset.
func TestHeldBudgetWaitsForRoomOnRejectTier(t *testing.T) {
	t.Parallel()
	a := startHeld(t)
	tenant, key := a.Tenant("tight-reject")
	acct := a.Account(tenant)
	var ids []string
	for range 8 {
		ids = append(ids, submit(t, a, key, heldBody))
	}
	a.StartWorker(worker.Options{})
	// While four jobs hold the day: held, not exhausted.
	testutil.Eventually(t, 30*time.Second, func() bool { return status(t, a, acct).Reserved == 20_000 })
	r := a.Do("POST", "/v1/jobs", key, heldBody)
	if r.Status != 429 || r.Header.Get("Retry-After") != "1" || !strings.Contains(string(r.Body), `"code":"budget_held"`) {
		t.Fatalf("a job posted while the day is held: %d, Retry-After %q, %s", r.Status, r.Header.Get("Retry-After"), r.Body)
	}
	jobs, seen := allEnded(t, a, ids)
	for _, j := range jobs {
		if j.Status != store.JobSucceeded {
			t.Fatalf("job %s: %s, error %+v", j.ID, j.Status, j.Error)
		}
	}
	if seen[store.JobWaiting] < 4 {
		t.Fatalf("jobs seen waiting %d; want the four the holds refused", seen[store.JobWaiting])
	}
	if st := status(t, a, acct); st.Spent != 16_000 || st.Reserved != 0 {
		t.Fatalf("spent %s, reserved %s; want $0.016", st.Spent, st.Reserved)
	}
	r = a.Do("POST", "/v1/jobs", key, heldBody)
	if r.Status != 429 || !strings.Contains(string(r.Body), `"code":"budget_exhausted"`) {
		t.Fatalf("a job past what the spend leaves: %d %s", r.Status, r.Body)
	}
	if ra := r.Header.Get("Retry-After"); ra == "1" || ra == "" {
		t.Fatalf("budget_exhausted with Retry-After %q, want until the reset", ra)
	}
}

// A synchronous request refused only by what running jobs hold waits for
// the room inside the request, and is answered once they settle; one
// whose wait ends first is a 429 insufficient_quota with a Retry-After of a
// second, nothing charged.
func TestHeldBudgetSyncWaitsInsideTheRequest(t *testing.T) {
	t.Parallel()
	a := startHeld(t)
	tenant, key := a.Tenant("tight")
	acct := a.Account(tenant)
	ctx := t.Context()
	hold, d, err := a.Budgets.Reserve(ctx, acct, "job_hold", 20_000)
	if err != nil || !d.Allowed {
		t.Fatalf("hold the day: %v %+v", err, d)
	}
	body := `{"model":"gpt-held","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`

	r := apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key, body, http.Header{"X-Llmq-Max-Wait": {"300ms"}})
	if r.Status != 429 || r.Header.Get("Retry-After") != "1" || !strings.Contains(string(r.Body), `"code":"insufficient_quota"`) ||
		!strings.Contains(string(r.Body), "held by running jobs") {
		t.Fatalf("held past the request's wait: %d, Retry-After %q, %s", r.Status, r.Header.Get("Retry-After"), r.Body)
	}
	if j := job(t, a, r.Header.Get("X-Llmq-Job-Id")); j.Status != store.JobFailed || j.Cost != 0 {
		t.Fatalf("refused job: %s, cost %s", j.Status, j.Cost)
	}

	answered := make(chan *apptest.Response, 1)
	began := time.Now()
	go func() {
		answered <- apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key, body, http.Header{"X-Llmq-Max-Wait": {"20s"}})
	}()
	// The request waits among the day's waiters.
	waiters := a.Keys.BudgetTenantWaiters(status(t, a, acct).Day, tenant)
	testutil.Eventually(t, 10*time.Second, func() bool { return a.Redis.ZCard(ctx, waiters).Val() == 1 })
	settled := time.Now()
	if err := a.Budgets.Settle(ctx, hold, 2_000, true); err != nil {
		t.Fatal(err)
	}
	r = <-answered
	if r.Status != 200 {
		t.Fatalf("after the hold settled: %d %s", r.Status, r.Body)
	}
	t.Logf("answered %v after the request, %v after the hold settled", time.Since(began).Round(time.Millisecond), time.Since(settled).Round(time.Millisecond))
	if j := a.EndedJob(r.Header.Get("X-Llmq-Job-Id")); j.Status != store.JobSucceeded || j.Cost != 2_000 {
		t.Fatalf("answered job: %s, cost %s", j.Status, j.Cost)
	}
	if n := a.Redis.ZCard(ctx, waiters).Val(); n != 0 {
		t.Fatalf("%d waiters left after the request ran", n)
	}
}
