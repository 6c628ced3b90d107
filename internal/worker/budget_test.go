package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

// globalCapPolicy sets a global daily cap, so the global day is held and
// read as well as the tenant's.
const globalCapPolicy = apptest.PolicyYAML + "global_daily_budget_usd: 10000\n"

func status(t *testing.T, a *apptest.App, acct budget.Account) *budget.Decision {
	t.Helper()
	d, err := a.Budgets.Status(context.Background(), acct)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A worker that dies between storing a job's result (and ledger row) and
// settling its budget leaves Redis's spend below the ledger; the job's
// redelivery settles it, whether its reservation is still open or has
// expired, and however often the job is redelivered or settled it is
// charged once.
func TestRedeliveryAfterACrashBeforeSettleChargesOnce(t *testing.T) {
	t.Parallel()
	clk := testutil.NewClock(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Clock: clk.Now, Policy: globalCapPolicy})
	tenant, key := a.Tenant("standard")
	acct := a.Account(tenant)
	ctx := context.Background()
	m, _ := a.Policy.Current().Model("gpt-4o-mini")

	// What the worker does up to the crash, done by hand.
	crash := func(content string, prompt, completion int64) (*budget.Reservation, string, money.Micros) {
		t.Helper()
		id := submit(t, a, key, map[string]any{"body": apptest.ChatBody(content, "", 50)})
		j, started, err := a.Store.JobStart(ctx, id, "")
		if err != nil || !started {
			t.Fatalf("start %s: %v %v", id, started, err)
		}
		res, d, err := a.Budgets.Reserve(ctx, acct, id, j.EstCost)
		if err != nil || !d.Allowed {
			t.Fatalf("reserve %s: %v %+v", id, err, d)
		}
		cost := m.Deployments[0].Price.Cost(money.Tokens{Prompt: prompt, Completion: completion})
		if _, err := a.Store.JobComplete(ctx, &store.JobCompleteParams{ID: id, Day: res.Day, GlobalDay: res.GlobalDay,
			PromptTokens: prompt, CompletionTokens: completion, Cost: cost}); err != nil {
			t.Fatal(err)
		}
		return res, id, cost
	}
	open, openID, c1 := crash("open", 12, 30)
	if d := status(t, a, acct); d.Spent != 0 || d.Reserved == 0 {
		t.Fatalf("after the crash: %+v", d)
	}
	// The second job's reservation expires before its task comes back.
	_, lapsedID, c2 := crash("lapsed", 9, 41)
	clk.Add(budget.DefaultReservationTTL + time.Second)

	h := a.JobHandler(worker.Options{})
	for range 2 {
		for _, id := range []string{openID, lapsedID} {
			if err := h.Run(ctx, id); err != nil {
				t.Fatalf("redeliver %s: %v", id, err)
			}
		}
	}
	// A repeated Settle of the first run's reservation charges nothing more.
	if err := a.Budgets.Settle(ctx, open, c1, true); err != nil {
		t.Fatal(err)
	}
	ledger, err := a.Store.UsageSumByTenantDay(ctx, tenant, open.Day)
	if err != nil {
		t.Fatal(err)
	}
	d := status(t, a, acct)
	if d.Spent != ledger || ledger != c1+c2 || d.Reserved != 0 || d.GlobalSpent != ledger {
		t.Fatalf("spent %s (global %s), reserved %s; ledger %s, want %s", d.Spent, d.GlobalSpent, d.Reserved, ledger, c1+c2)
	}
	if n := a.Sim.Stats().Requests; n != 0 {
		t.Fatalf("the redeliveries called the provider %d times", n)
	}
}

// A job of a rejecting tier that no longer fits when a worker reserves it
// fails with budget_exhausted, naming the tenant's budget with its numbers
// and reset, without counting an attempt: what was spent leaves no room for
// its worst case today. (Room running jobs hold makes it wait instead:
// TestHeldBudgetWaitsOnRejectTier.)
func TestRejectTierJobFailsWhenItsBudgetIsSpent(t *testing.T) {
	t.Parallel()
	clk := testutil.NewClock(time.Date(2026, 6, 1, 22, 0, 0, 0, time.UTC))
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Clock: clk.Now})
	tenant, key := a.Tenant("free") // $1, on_exhausted: reject
	acct := a.Account(tenant)
	ctx := context.Background()
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("late", "", 20)})
	// Another job of the tenant spent what is left, minus a micro-dollar.
	worst := job(t, a, id).EstCost
	spent := money.PerDollar - worst + 1
	if res, d, err := a.Budgets.Reserve(ctx, acct, "job_other", spent); err != nil || !d.Allowed {
		t.Fatalf("reserve the rest: %v %+v", err, d)
	} else if err := a.Budgets.Settle(ctx, res, spent, true); err != nil {
		t.Fatal(err)
	}
	if err := a.JobHandler(worker.Options{}).Run(ctx, id); err != nil {
		t.Fatal(err)
	}
	j := job(t, a, id)
	if j.Status != store.JobFailed || j.Error == nil || j.Error.Code != client.CodeBudgetExhausted || j.Error.Type != "budget_exceeded_error" || j.Attempts != 0 {
		t.Fatalf("job: status %s attempts %d error %+v", j.Status, j.Attempts, j.Error)
	}
	for _, want := range []string{"tenant's daily budget", "$" + spent.String() + " spent and $0.000000 reserved of $1.000000",
		"free tier", "2026-06-02T00:00:00Z"} {
		if !strings.Contains(j.Error.Message, want) {
			t.Fatalf("error %q does not say %q", j.Error.Message, want)
		}
	}
	if n := a.Sim.Stats().Requests; n != 0 {
		t.Fatalf("provider called %d times", n)
	}
}

// The job that takes a tenant past its soft limit is counted once in the
// worker's metric; the jobs after it are not.
func TestSoftLimitCrossingIsCountedOnce(t *testing.T) {
	t.Parallel()
	a := start(t, nil)
	tenant, key := a.Tenant("standard") // $50, soft limit 80%
	acct := a.Account(tenant)
	ctx := context.Background()
	rec := metrics.New(metrics.Options{NoProcessMetrics: true})
	a.Observer = rec
	h := a.JobHandler(worker.Options{})

	ids := []string{
		submit(t, a, key, map[string]any{"body": apptest.ChatBody("one", "", 20)}),
		submit(t, a, key, map[string]any{"body": apptest.ChatBody("two", "", 20)}),
	}
	// Up to just below the soft limit: the first job's hold crosses it.
	worst := job(t, a, ids[0]).EstCost
	if _, d, err := a.Budgets.Reserve(ctx, acct, "job_filler", 40*money.PerDollar-worst); err != nil || !d.Allowed || d.SoftLimitReached {
		t.Fatalf("filler: %v %+v", err, d)
	}
	crossings := func() float64 {
		fams, err := rec.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "llmq_budget_soft_limit_crossings_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "tenant" && l.GetValue() == tenant {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	for i, id := range ids {
		if err := h.Run(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := crossings(); got != 1 {
			t.Fatalf("after job %d: %v soft-limit crossings counted, want 1", i+1, got)
		}
	}
}

// A provider call that outlives the budget reservation's TTL keeps its
// room: the worker extends the reservation while the call runs, so another
// job cannot reserve the same dollars meanwhile.
func TestReservationOutlivesALongCall(t *testing.T) {
	t.Parallel()
	a := start(t, &sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Latency: 5 * time.Second})
	tenant, key := a.Tenant("standard")
	acct := a.Account(tenant)
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	logs := &testutil.SyncBuffer{}
	h := worker.NewHandler(worker.Deps{
		Store: a.Store, Policy: a.Policy, Pacer: a.Pacer, Providers: a.Providers,
		Budgets: testutil.Must(budget.New(a.Redis, a.Store, budget.Options{Keys: a.Keys, ReservationTTL: ttl})),
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
	}, worker.Options{})

	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("slow", "", 20)})
	worst := job(t, a, id).EstCost
	// Leave room for this job and not quite another of its size.
	filler := acct.Budget - 2*worst + 1
	if _, d, err := a.Budgets.Reserve(ctx, acct, "job_filler", filler); err != nil || !d.Allowed {
		t.Fatalf("filler: %v %+v", err, d)
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx, id) }()
	var held, ended time.Time // the reservation seen; the charge seen (the call over)
	probes := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if ended.IsZero() {
				ended = time.Now()
			}
			if held.IsZero() || ended.Sub(held) < 2*ttl || probes == 0 {
				t.Fatalf("the call ran %v after its reservation (%d probes); the test needs more than %v", ended.Sub(held), probes, 2*ttl)
			}
			if j := job(t, a, id); j.Status != store.JobSucceeded {
				t.Fatalf("job %s", j.Status)
			}
			if d := status(t, a, acct); d.Reserved != filler || d.Spent != job(t, a, id).Cost {
				t.Fatalf("after the call: %+v", d)
			}
			if strings.Contains(logs.String(), "lapsed") {
				t.Fatalf("the reservation lapsed:\n%s", logs.String())
			}
			return
		case <-tick.C:
		}
		if held.IsZero() {
			if status(t, a, acct).Reserved == filler+worst {
				held = time.Now()
			}
			continue
		}
		// Another job of the same size must not fit while the call runs.
		if !ended.IsZero() {
			continue
		}
		probes++
		res, d, err := a.Budgets.Reserve(ctx, acct, "job_probe", worst)
		if err == nil && d.Allowed && d.Spent > 0 {
			// The call ended and its cost was charged between the two
			// looks: its room is free now, rightly. Wait for Run.
			if err := a.Budgets.Release(ctx, res); err != nil {
				t.Fatal(err)
			}
			ended = time.Now()
			continue
		}
		if err != nil || d.Allowed {
			t.Fatalf("%v into the call (TTL %v), another job reserved its room: %v %+v", time.Since(held), ttl, err, d)
		}
	}
}

// Two deliveries of one job on either side of midnight: the first reserved
// and stored the result (and its ledger row) on day one, the second
// reserved on day two and lost the race to store it. The job is charged
// once, on the ledger's day, and the second delivery's reservation on day
// two is given back.
func TestDeliveryThatLostTheRaceChargesTheLedgersDay(t *testing.T) {
	t.Parallel()
	clk := testutil.NewClock(time.Date(2026, 6, 1, 23, 59, 50, 0, time.UTC))
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Clock: clk.Now, Policy: globalCapPolicy,
		Sim: &sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Echo: true, Latency: 300 * time.Millisecond}})
	tenant, key := a.Tenant("standard")
	acct := a.Account(tenant)
	ctx := context.Background()
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("midnight", "", 50)})

	// The first delivery, by hand: started and reserved on day one.
	first, d, err := a.Budgets.Reserve(ctx, acct, id, job(t, a, id).EstCost)
	if err != nil || !d.Allowed || first.Day != "2026-06-01" {
		t.Fatalf("reserve on day one: %+v %+v %v", first, d, err)
	}
	// The second, a real run, past midnight: it reserves on day two and
	// calls the provider, while the first stores its result.
	clk.Add(20 * time.Second)
	done := make(chan error, 1)
	go func() { done <- a.JobHandler(worker.Options{}).Run(ctx, id) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return a.Sim.Stats().Requests == 1 })
	cost := m.Deployments[0].Price.Cost(money.Tokens{Prompt: 10, Completion: 20})
	if _, err := a.Store.JobComplete(ctx, &store.JobCompleteParams{ID: id, Day: first.Day, GlobalDay: first.GlobalDay,
		PromptTokens: 10, CompletionTokens: 20, Cost: cost}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("second delivery: %v", err)
	}
	// The first delivery settles too, late: nothing more is charged.
	if err := a.Budgets.Settle(ctx, first, cost, true); err != nil {
		t.Fatal(err)
	}
	day2 := status(t, a, acct)
	if day2.Spent != 0 || day2.Reserved != 0 || day2.GlobalSpent != 0 {
		t.Fatalf("day two: spent %s (global %s), reserved %s; want nothing", day2.Spent, day2.GlobalSpent, day2.Reserved)
	}
	clk.Add(-20 * time.Second)
	day1 := status(t, a, acct)
	if day1.Spent != cost || day1.GlobalSpent != cost || day1.Reserved != 0 {
		t.Fatalf("day one: spent %s (global %s), reserved %s; want %s charged once", day1.Spent, day1.GlobalSpent, day1.Reserved, cost)
	}
}

// The budget's reservation and the permit's first try go to Redis
// together: a job the budget refuses (here for the room another job holds:
// it waits) gives its permit back, so the model's one request a minute is
// still there for the job once the budget has room.
func TestBudgetRefusalGivesThePermitBack(t *testing.T) {
	t.Parallel()
	policy := strings.Replace(apptest.PolicyYAML, "limits: {rpm: 3000, tpm: 300000}", "limits: {rpm: 1, tpm: 300000}", 1)
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: policy})
	tenant, key := a.Tenant("standard") // $50, on_exhausted: defer
	acct := a.Account(tenant)
	ctx := context.Background()
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("deferred", "", 20)})
	worst := job(t, a, id).EstCost
	other, d, err := a.Budgets.Reserve(ctx, acct, "job_other", 50*money.PerDollar-worst+1)
	if err != nil || !d.Allowed {
		t.Fatalf("reserve the rest: %v %+v", err, d)
	}
	h := a.JobHandler(worker.Options{MaxInlineWait: time.Millisecond})
	err = h.Run(ctx, id)
	if err == nil || queue.IsFailure(err) {
		t.Fatalf("over budget: want a requeue without failure, got %v", err)
	}
	if j := job(t, a, id); j.Status != store.JobWaiting {
		t.Fatalf("job = %s, want waiting", j.Status)
	}
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	st, err := a.Limiter.State(ctx, scopeOf(m))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range st.Buckets {
		if b.Unit == limiter.UnitRequests && b.Remaining != 1 {
			t.Fatalf("requests bucket holds %d of %d after the refusal: the permit was kept", b.Remaining, b.Limit)
		}
	}
	if err := a.Budgets.Release(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := h.Run(ctx, id); err != nil {
		t.Fatalf("with room in the budget: %v", err)
	}
	if j := job(t, a, id); j.Status != store.JobSucceeded {
		t.Fatalf("job = %s, want succeeded", j.Status)
	}
}
