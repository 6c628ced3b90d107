package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

// budgetPolicy has an expensive model, so that cents of budget go in a few
// hundred small jobs, and tiers with a $1.00 daily budget.
const budgetPolicy = `
providers:
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, timeout: 10s}
models:
  - name: gpt-expensive
    provider: sim
    upstream: gpt-4o
    price: {input_per_mtok: 60, output_per_mtok: 600}
    limits: {rpm: 60000, tpm: 6000000}
    max_output_tokens: 100
tiers:
  - {name: capped, daily_budget_usd: 1, priority: default, on_exhausted: defer, api_rps: 1000}
  - {name: strict, daily_budget_usd: 1, priority: default, on_exhausted: reject, api_rps: 1000}
  - {name: big, daily_budget_usd: 1000, priority: default, on_exhausted: defer, api_rps: 1000}
%s
`

// expensiveJob is a job of gpt-expensive: a chat completion, or every
// other one a call of the Responses API, so the budget's claims are shown
// for both.
func expensiveJob(i int) map[string]any {
	if i%2 == 1 {
		return map[string]any{"custom_id": fmt.Sprintf("e%03d", i), "endpoint": "/v1/responses", "body": map[string]any{
			"model": "gpt-expensive", "max_output_tokens": 25, "input": fmt.Sprintf("Say %d.", i),
		}}
	}
	return map[string]any{"custom_id": fmt.Sprintf("e%03d", i), "body": map[string]any{
		"model": "gpt-expensive", "max_tokens": 25,
		"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("Say %d.", i)}},
	}}
}

func submitEach(t *testing.T, a *apptest.App, key string, n int, body func(int) map[string]any) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := p; i < n; i += 8 {
				r := apptest.Do(t, a.URL, "POST", "/v1/jobs", key, body(i), nil)
				if r.Status != 202 {
					t.Errorf("job %d: %d %s", i, r.Status, r.Body)
					return
				}
				ids[i] = r.Map(t)["id"].(string)
			}
		}(p)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return ids
}

// settled waits until no job of ids is queued, running or waiting: each has
// finished or is deferred to the next budget day.
func settled(t *testing.T, a *apptest.App, ids []string) map[store.JobStatus][]*store.Job {
	t.Helper()
	var by map[store.JobStatus][]*store.Job
	eventually(t, 2*time.Minute, func() bool {
		by = map[store.JobStatus][]*store.Job{}
		for _, id := range ids {
			j, err := a.Store.JobGetByID(context.Background(), id)
			if err != nil {
				return false
			}
			if j.Status != store.JobDeferred && !j.Status.Terminal() {
				return false
			}
			by[j.Status] = append(by[j.Status], j)
		}
		return true
	}, "every job finished or deferred")
	return by
}

// runDeferredNow moves the tasks of deferred jobs, scheduled for the
// budget's reset, to run now (the time asynq would otherwise wait for),
// and waits until the workers have taken them all.
func runDeferredNow(t *testing.T, a *apptest.App) {
	t.Helper()
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	q := a.Queue.Namespace().Queue(queue.Jobs)
	if _, err := in.RunAllRetryTasks(q); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() bool {
		info, err := in.GetQueueInfo(q)
		return err == nil && info.Pending == 0 && info.Active == 0
	}, "the deferred jobs ran again")
}

// shiftedClock is real time moved on by whole days: the budgets' and the
// in-process workers' clock, agreeing with Redis's (which worker processes
// use) until a test simulates a daily reset.
type shiftedClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *shiftedClock) Now() time.Time { return time.Now().Add(c.Offset()) }
func (c *shiftedClock) Offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset
}
func (c *shiftedClock) Add(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// checkDeferred asserts that each deferred job waits for its budget's reset
// by itself: no attempt counted, next_run_at at a midnight UTC (the tier's
// reset), and its task scheduled in asynq for that time (plus the spread of
// at most 5 s; asynq keeps whole seconds). offset is how far the deferring
// worker's clock was ahead of real time, which asynq's schedule is in.
func checkDeferred(t *testing.T, a *apptest.App, deferred []*store.Job, offset time.Duration) {
	t.Helper()
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	tasks, err := in.ListRetryTasks(a.Queue.Namespace().Queue(queue.Jobs), asynq.PageSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]time.Time{}
	for _, ti := range tasks {
		at[ti.ID] = ti.NextProcessAt
	}
	for _, j := range deferred {
		if j.Attempts != 0 || j.NextRunAt == nil {
			t.Fatalf("deferred job %s: attempts %d, next_run_at %v", j.ID, j.Attempts, j.NextRunAt)
		}
		reset := j.NextRunAt.UTC().Round(24 * time.Hour)
		if d := j.NextRunAt.Sub(reset).Abs(); d > time.Second {
			t.Fatalf("deferred job %s: next_run_at %v is not the reset at midnight UTC", j.ID, j.NextRunAt)
		}
		sched, ok := at[j.ID]
		if !ok {
			t.Fatalf("deferred job %s has no scheduled task (%d retry tasks)", j.ID, len(tasks))
		}
		if s := sched.Add(offset); s.Before(reset.Add(-time.Second)) || s.After(reset.Add(6*time.Second)) {
			t.Fatalf("deferred job %s: task scheduled for %v, want the reset %v (+5s)", j.ID, s.UTC(), reset)
		}
	}
}

// TestBudgetIsNeverOverspent: 200 concurrent jobs of one tenant whose
// worst cases add up to $3.12 against a $1.00 budget, through two worker
// processes: no day is charged more than $1.00, the rest is deferred, each
// job scheduled for the reset; after each simulated reset (in-process
// workers on a clock a day ahead) the deferred jobs run, until all have.
// The same holds when the provider leaves the usage out of a fifth of its
// answers: those jobs are charged their worst case, and say so.
func TestBudgetIsNeverOverspent(t *testing.T) {
	t.Parallel()
	for _, omit := range []float64{0, 0.2} {
		t.Run(fmt.Sprintf("usage omitted from %.0f%% of answers", 100*omit), func(t *testing.T) {
			t.Parallel()
			budgetNeverOverspent(t, omit, false)
		})
	}
	// A provider billing every call its whole output limit.
	t.Run("worst-case provider", func(t *testing.T) {
		t.Parallel()
		budgetNeverOverspent(t, 0, true)
	})
}

func budgetNeverOverspent(t *testing.T, omitUsage float64, worstCase bool) {
	clock := &shiftedClock{}
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fmt.Sprintf(budgetPolicy, ""), Clock: clock.Now,
		Sim: &sim.Config{DefaultMaxTokens: 16000, WorstCase: worstCase, Seed: 3, Latency: 5 * time.Millisecond, Faults: sim.Faults{OmitUsage: omitUsage}}})
	procs := []*process{
		startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=10"),
		startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=10"),
	}
	for _, p := range procs {
		p.waitForOutput(t, "worker running")
	}
	_, key := a.Tenant("capped")
	ids := submitEach(t, a, key, 200, expensiveJob)
	ctx := context.Background()

	var worst money.Micros
	for _, id := range ids {
		j, _ := a.Store.JobGetByID(ctx, id)
		worst += j.EstCost
	}
	if worst < 3*money.PerDollar {
		t.Fatalf("the jobs' worst cases add up to $%s; the test wants $3 or more", worst)
	}
	p := a.Policy.Current()
	m, _ := p.Model("gpt-expensive")
	done := 0
	for day := 0; day < 6 && done < len(ids); day++ {
		by := settled(t, a, ids)
		// The charges of each budget day, as the ledger rows carry it.
		perDay := map[string]money.Micros{}
		for _, j := range by[store.JobSucceeded] {
			e, err := a.Store.UsageGetByJob(ctx, j.ID)
			if err != nil {
				t.Fatal(err)
			}
			perDay[e.Day] += e.Cost
		}
		for d, spent := range perDay {
			if spent > money.PerDollar {
				t.Fatalf("%s: charged $%s against a $1.00 budget", d, spent)
			}
		}
		done = len(by[store.JobSucceeded])
		t.Logf("day %d: charged %v; %d jobs done, %d deferred", day, perDay, done, len(by[store.JobDeferred]))
		if len(by[store.JobFailed]) > 0 {
			t.Fatalf("jobs failed: %+v", by[store.JobFailed][0].Error)
		}
		if day == 0 && len(by[store.JobDeferred]) == 0 {
			t.Fatal("nothing was deferred on the first day")
		}
		checkDeferred(t, a, by[store.JobDeferred], clock.Offset())
		// Redis's spend of the day is the ledger's.
		u := settledUsage(t, a, key)
		if got := money.Micros(math.Round(u["spent_usd"].(float64) * 1e6)); got != perDay[u["day"].(string)] || u["reserved_usd"].(float64) != 0 {
			t.Fatalf("usage of %v: spent $%s reserved %v, ledger $%s", u["day"], got, u["reserved_usd"], perDay[u["day"].(string)])
		}
		if day == 0 {
			// The processes keep Redis's day; the days after run on this
			// process's clock.
			for _, p := range procs {
				p.signal(syscall.SIGTERM)
				<-p.done
			}
			a.StartWorker(worker.Options{})
			a.StartWorker(worker.Options{})
		}
		clock.Add(24 * time.Hour)
		runDeferredNow(t, a)
	}
	if done != len(ids) {
		t.Fatalf("after the resets %d of %d jobs ran", done, len(ids))
	}
	// Each job's ledger row is exactly its usage at the model's price; a
	// job whose answer had no usage is charged its worst case, and says so.
	estimated := 0
	endpoints := map[string]int{}
	for _, id := range ids {
		j, _ := a.Store.JobGetByID(ctx, id)
		endpoints[j.Endpoint]++
		e, err := a.Store.UsageGetByJob(ctx, id)
		if want := m.Deployments[0].Price.Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens}); err != nil || e.Cost != want || j.Cost != want {
			t.Fatalf("job %s: ledger %+v (%v), job cost %d; want %d", id, e, err, j.Cost, want)
		}
		if j.UsageEstimated {
			estimated++
			if j.Cost != j.EstCost {
				t.Fatalf("job %s without usage charged %d, want its worst case %d", id, j.Cost, j.EstCost)
			}
		}
	}
	if endpoints["/v1/responses"] != 100 || endpoints["/v1/chat/completions"] != 100 {
		t.Fatalf("jobs by endpoint: %v", endpoints)
	}
	if lo, hi := int(omitUsage*150), int(omitUsage*250); estimated < lo || estimated > hi {
		t.Fatalf("%d of 200 jobs charged as estimated, want about %.0f", estimated, omitUsage*200)
	}
}

// TestRejectTierAndGlobalCap: a tier that rejects answers 429 at enqueue,
// with Retry-After and an error naming the budget, once its day is spent;
// the global cap stops two tenants at once.
func TestRejectTierAndGlobalCap(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock(time.Date(2026, 6, 1, 22, 0, 0, 0, time.UTC))
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fmt.Sprintf(budgetPolicy, "global_daily_budget_usd: 0.5"),
		Clock: clock.Now, Workers: 2, Sim: &sim.Config{DefaultMaxTokens: 100, Seed: 4, CompletionMin: 1, CompletionMax: 1}})
	ctx := context.Background()

	// Two tenants of a big tier: the $0.50 global cap stops both.
	t1, k1 := a.Tenant("big")
	t2, k2 := a.Tenant("big")
	ids := append(submitEach(t, a, k1, 40, expensiveJob), submitEach(t, a, k2, 40, expensiveJob)...)
	by := settled(t, a, ids)
	day := clock.Now().Format(time.DateOnly)
	s1, _ := a.Store.UsageSumByTenantDay(ctx, t1, day)
	s2, _ := a.Store.UsageSumByTenantDay(ctx, t2, day)
	if s1+s2 > money.PerDollar/2 || s1+s2 < money.PerDollar/2-20_000 {
		t.Fatalf("global cap $0.50: tenants charged $%s and $%s; want together just under $0.50", s1, s2)
	}
	deferredOf := map[string]int{}
	for _, j := range by[store.JobDeferred] {
		deferredOf[j.TenantID]++
	}
	if deferredOf[t1] == 0 || deferredOf[t2] == 0 {
		t.Fatalf("deferred per tenant = %v; the global cap should stop both", deferredOf)
	}

	// A rejecting tier: once the global day is spent, enqueue answers 429
	// with the time to the reset (2 h away on the fake clock).
	_, ks := a.Tenant("strict")
	r := apptest.Do(t, a.URL, "POST", "/v1/jobs", ks, expensiveJob(0), nil)
	if r.Status != 429 || r.Header.Get("Retry-After") == "" || !strings.Contains(string(r.Body), "global daily budget") {
		t.Fatalf("reject tier past the cap: %d %v %s", r.Status, r.Header, r.Body)
	}
	if ra := r.Header.Get("Retry-After"); ra != "7200" {
		t.Fatalf("Retry-After = %s, want 7200 (seconds to midnight UTC)", ra)
	}
	if r.Header.Get("X-Budget-Remaining") == "" {
		t.Fatal("no X-Budget-Remaining header")
	}
}

// TestSoftLimitHeaders: X-Budget-Remaining is on every tenant answer, and
// X-Budget-Warning appears once spend passes the tier's soft limit.
func TestSoftLimitHeaders(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fmt.Sprintf(budgetPolicy, ""), Clock: clock.Now, Workers: 1,
		Sim: &sim.Config{DefaultMaxTokens: 100, Seed: 5, CompletionMin: 1, CompletionMax: 1}})
	_, key := a.Tenant("capped")
	r := a.Do("GET", "/v1/usage", key, nil)
	if r.Header.Get("X-Budget-Remaining") != "1.000000" || r.Header.Get("X-Budget-Warning") != "" {
		t.Fatalf("fresh tenant: remaining %q warning %q", r.Header.Get("X-Budget-Remaining"), r.Header.Get("X-Budget-Warning"))
	}
	// Each job costs about $0.0156: 60 of them pass 80% of $1.
	settled(t, a, submitEach(t, a, key, 60, expensiveJob))
	r = a.Do("GET", "/v1/jobs?limit=1", key, nil)
	if w := r.Header.Get("X-Budget-Warning"); !strings.Contains(w, "soft limit") {
		t.Fatalf("past the soft limit: warning %q, remaining %q", w, r.Header.Get("X-Budget-Remaining"))
	}
}

// TestSpendSurvivesFlushAll: the day's spend is rebuilt from the ledger
// when Redis loses it.
func TestSpendSurvivesFlushAll(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/0", Workers: 1})
	_, key := a.Tenant("standard")
	ids := submitAll(t, a, key, 30, 3, 50)
	allEnd(t, a, ids, time.Minute)
	before := settledUsage(t, a, key)
	if before["spent_usd"].(float64) <= 0 {
		t.Fatalf("nothing spent: %v", before)
	}
	if err := a.Redis.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	after := a.Do("GET", "/v1/usage", key, nil).Map(t)
	if after["spent_usd"] != before["spent_usd"] {
		t.Fatalf("spent after FLUSHALL = %v, before = %v", after["spent_usd"], before["spent_usd"])
	}
}

// TestPremiumFlowsPastAFreeBacklog: with 10,000 jobs of a low-priority
// tenant queued, a premium tenant's jobs still run at once.
func TestPremiumFlowsPastAFreeBacklog(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 1_000_000, TPM: 100_000_000}, DefaultMaxTokens: 1024, Latency: 50 * time.Millisecond}})
	ctx := context.Background()
	free, _ := a.Tenant("free") // priority low
	// The backlog goes straight to the store and the model's fair queue, as
	// a POST would put it: 10,000 POSTs would only slow the test.
	const backlog = 10000
	params := make([]*store.JobInsertParams, backlog)
	body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}],"max_tokens":5}`)
	for i := range params {
		params[i] = &store.JobInsertParams{TenantID: free, CustomID: fmt.Sprintf("f%d", i),
			Endpoint: "/v1/chat/completions", Model: "gpt-4o-mini", Request: body, Queue: queue.Low,
			EstPromptTokens: 10, EstMaxTokens: 5, EstCost: 1}
	}
	jobIDs, err := a.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: params})
	if err != nil {
		t.Fatal(err)
	}
	refs := make([]queue.JobRef, len(jobIDs))
	for i, id := range jobIDs {
		refs[i] = admission.Ref(a.Policy.Current(), id, queue.Low, free, "gpt-4o-mini", 15, 0)
	}
	if _, err := a.Queue.EnqueueJobs(ctx, refs); err != nil {
		t.Fatal(err)
	}
	a.StartWorker(worker.Options{})
	_, premium := a.Tenant("premium") // priority critical
	ids := submitAll(t, a, premium, 50, 5, 5)
	start := time.Now()
	allEnd(t, a, ids, time.Minute)
	took := time.Since(start)
	done, err := countStatus(ctx, a, free, store.JobSucceeded)
	if err != nil {
		t.Fatal(err)
	}
	// Without priority the premium jobs would run after all 10,000. While
	// their 50 POSTs go in, the workers keep running free jobs (the fair
	// queue is work-conserving), more of them on a loaded machine: 248 on
	// a quiet one, 1,048 once under a full test suite.
	if done > backlog/5 {
		t.Fatalf("the free backlog ran first: %d of its %d jobs ran before the 50 premium jobs finished", done, backlog)
	}
	t.Logf("50 premium jobs finished in %v while %d of the %d free jobs had run", took.Round(time.Millisecond), done, backlog)
}

// TestPolicyReloadInRunningWorker: a lower budget and a lower model limit
// written to the policy file apply in a running worker process without a
// restart; an invalid edit is refused with a log line and changes nothing.
func TestPolicyReloadInRunningWorker(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fmt.Sprintf(budgetPolicy, ""),
		Sim: &sim.Config{DefaultMaxTokens: 100, Seed: 6, CompletionMin: 1, CompletionMax: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Policy.Watch(ctx, a.Logger)
	w := startProcess(t, a, "worker", "LLMQ_LOG_LEVEL=info", "LLMQ_WORKER_CONCURRENCY=5")
	w.waitForOutput(t, "worker running")
	tenant, key := a.Tenant("big")
	path := a.Policy.Path()
	original, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rewrite := func(from, to string) {
		t.Helper()
		text := strings.Replace(string(original), from, to, 1)
		if text == string(original) && from != to {
			t.Fatalf("%q is not in the policy", from)
		}
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	reloads := func() int { return strings.Count(w.out.String(), "policy reloaded") }

	allEnd(t, a, submitEach(t, a, key, 5, expensiveJob), time.Minute)
	today := time.Now().UTC().Format(time.DateOnly)
	before, _ := a.Store.UsageSumByTenantDay(context.Background(), tenant, today)

	// The tier's budget drops from $1,000 to $0.05, less than was spent.
	rewrite("name: big, daily_budget_usd: 1000", "name: big, daily_budget_usd: 0.05")
	eventually(t, 10*time.Second, func() bool { return reloads() >= 1 }, "the worker reloads the policy")
	by := settled(t, a, submitEach(t, a, key, 10, func(i int) map[string]any { return expensiveJob(100 + i) }))
	after, _ := a.Store.UsageSumByTenantDay(context.Background(), tenant, today)
	if len(by[store.JobDeferred]) != 10 || after != before || before <= 50_000 {
		t.Fatalf("after lowering the budget below the $%s spent, the running worker deferred %d of 10 jobs and spent $%s more",
			before, len(by[store.JobDeferred]), after-before)
	}

	// The model's RPM drops to 1 (and the budget comes back): at most one
	// job runs (none when the bucket still counts this minute's 15 calls
	// against the new limit, as a provider would), the others wait for the
	// limiter.
	original = []byte(strings.Replace(string(original), "rpm: 60000", "rpm: 1", 1))
	rewrite("", "")
	eventually(t, 10*time.Second, func() bool { return reloads() >= 2 }, "the worker reloads the policy again")
	ids := submitEach(t, a, key, 3, func(i int) map[string]any { return expensiveJob(200 + i) })
	eventually(t, 30*time.Second, func() bool {
		n := map[store.JobStatus]int{}
		for _, id := range ids {
			j, _ := a.Store.JobGetByID(context.Background(), id)
			n[j.Status]++
		}
		return n[store.JobSucceeded] <= 1 && n[store.JobWaiting] >= 2 && n[store.JobSucceeded]+n[store.JobWaiting] == 3
	}, "at most one job succeeds and the others wait under 1 RPM")

	// An invalid edit is refused; the policy in force stays.
	if err := os.WriteFile(path+".new", []byte("models: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() bool { return strings.Contains(w.out.String(), "policy reload refused") }, "the worker refuses the invalid policy")
	if r := a.Do("GET", "/readyz", "", nil); r.Status != 200 {
		t.Fatalf("readyz after an invalid policy: %d", r.Status)
	}
	if m, ok := a.Policy.Current().Model("gpt-expensive"); !ok || m.Deployments[0].Limits.RPM != 1 {
		t.Fatal("the invalid policy replaced the one in force")
	}
	// The worker runs on under the policy in force: a new job is taken and
	// waits for the 1 RPM limit.
	late := submitEach(t, a, key, 1, func(i int) map[string]any { return expensiveJob(300 + i) })[0]
	eventually(t, 10*time.Second, func() bool {
		j, err := a.Store.JobGetByID(context.Background(), late)
		return err == nil && j.Status == store.JobWaiting
	}, "the worker takes a job after the refused edit and holds it to 1 RPM")
	select {
	case <-w.done:
		t.Fatalf("the worker exited after the invalid edit:\n%s", w.out.String())
	default:
	}
}

// TestInFlightJobsSurviveAPolicyReload: jobs whose provider calls are under
// way when the policy changes finish, each called and charged once, at the
// prices they started with; a job after the reload pays the new price.
func TestInFlightJobsSurviveAPolicyReload(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fmt.Sprintf(budgetPolicy, ""), Workers: 1,
		Sim: &sim.Config{DefaultMaxTokens: 100, Seed: 8, CompletionMin: 1, CompletionMax: 1, Latency: time.Second}})
	tenant, key := a.Tenant("big")
	ids := submitEach(t, a, key, 5, expensiveJob)
	eventually(t, 10*time.Second, func() bool { return a.Sim.Stats().InFlight == 5 }, "the 5 calls are in flight")
	old, _ := a.Policy.Current().Model("gpt-expensive")

	text, err := os.ReadFile(a.Policy.Path())
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(text), "output_per_mtok: 600", "output_per_mtok: 1200", 1)
	if err := os.WriteFile(a.Policy.Path(), []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Policy.Reload(); err != nil {
		t.Fatal(err)
	}
	m, _ := a.Policy.Current().Model("gpt-expensive")
	if reflect.DeepEqual(m.Deployments[0].Price, old.Deployments[0].Price) || a.Sim.Stats().InFlight != 5 {
		t.Fatalf("the reload did not land mid-call: price %+v, %d calls in flight", m.Deployments[0].Price, a.Sim.Stats().InFlight)
	}
	jobs := allEnd(t, a, ids, 30*time.Second)
	var ledger money.Micros
	for _, j := range jobs {
		if j.Status != store.JobSucceeded || j.Attempts != 1 {
			t.Fatalf("job %s: %s after %d attempts (%+v)", j.ID, j.Status, j.Attempts, j.Error)
		}
		if want := old.Deployments[0].Price.Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens}); j.Cost != want {
			t.Fatalf("job %s cost %s, want %s at the price it started with", j.ID, j.Cost, want)
		}
		ledger += j.Cost
	}
	if n := a.Sim.Stats().Requests; n != 5 {
		t.Fatalf("provider called %d times for 5 jobs", n)
	}
	u := settledUsage(t, a, key)
	if got := money.Micros(math.Round(u["spent_usd"].(float64) * 1e6)); got != ledger {
		t.Fatalf("spent $%s, ledger $%s", got, ledger)
	}
	after := allEnd(t, a, submitEach(t, a, key, 1, func(i int) map[string]any { return expensiveJob(100 + i) }), 30*time.Second)[0]
	if want := m.Deployments[0].Price.Cost(money.Tokens{Prompt: after.PromptTokens, Cached: after.CachedTokens, Completion: after.CompletionTokens}); after.Cost != want || after.TenantID != tenant {
		t.Fatalf("job after the reload cost %s, want %s at the new price", after.Cost, want)
	}
}

// A price that rises between a job's admission and its run raises what
// the run reserves: the reservation bounds the bill at the price the call
// is charged at, not the one it was admitted at.
func TestReservationBoundsTheBillAfterAPriceRise(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fmt.Sprintf(budgetPolicy, ""),
		Sim: &sim.Config{DefaultMaxTokens: 100, Seed: 9, CompletionMin: 1, CompletionMax: 1, Latency: time.Second}})
	_, key := a.Tenant("big")
	id := submitEach(t, a, key, 1, expensiveJob)[0]
	admitted, err := a.Store.JobGetByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(a.Policy.Path())
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(text), "output_per_mtok: 600", "output_per_mtok: 6000", 1)
	if err := os.WriteFile(a.Policy.Path(), []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Policy.Reload(); err != nil {
		t.Fatal(err)
	}
	a.StartWorker(worker.Options{})
	eventually(t, 10*time.Second, func() bool { return a.Sim.Stats().InFlight == 1 }, "the call is in flight")
	u := a.Do("GET", "/v1/usage", key, nil).Map(t)
	reserved := money.Micros(math.Round(u["reserved_usd"].(float64) * 1e6))
	j := allEnd(t, a, []string{id}, 30*time.Second)[0]
	if j.Status != store.JobSucceeded || j.CompletionTokens != 25 {
		t.Fatalf("job %s: %s, %d completion tokens (%+v)", j.ID, j.Status, j.CompletionTokens, j.Error)
	}
	if j.Cost <= admitted.EstCost || j.Cost > reserved {
		t.Fatalf("the job cost %s at the new price, admitted at a worst case of %s; the run reserved %s", j.Cost, admitted.EstCost, reserved)
	}
}
