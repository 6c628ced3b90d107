package recovery_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/recovery"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// budgetReconciler is reconciler with the app's budgets, whose clock is
// now; the app's days raised are counted by a metrics Recorder.
func budgetReconciler(t *testing.T, a *apptest.App, now func() time.Time) (*recovery.Reconciler, *metrics.Recorder) {
	t.Helper()
	rec := metrics.New(metrics.Options{NoProcessMetrics: true})
	a.Observer = rec
	r := reconciler(a, now)
	r.Budgets = a.Budgets
	return r, rec
}

// charge runs one job of the tenant through the budget and the ledger as a
// worker does: reserve, ledger row, settle (unless settle is false: a
// settlement Redis lost, or one still in flight).
func charge(t *testing.T, a *apptest.App, tenant string, cost money.Micros, settle bool) {
	t.Helper()
	ctx := context.Background()
	j := insertJob(t, a, tenant, &store.JobInsertParams{})
	if _, _, err := a.Store.JobStart(ctx, j.ID, ""); err != nil {
		t.Fatal(err)
	}
	res, d, err := a.Budgets.Reserve(ctx, a.Account(tenant), j.ID, cost)
	if err != nil || !d.Allowed {
		t.Fatalf("reserve: %v %+v", err, d)
	}
	if _, err := a.Store.JobComplete(ctx, &store.JobCompleteParams{ID: j.ID, Day: res.Day, GlobalDay: res.GlobalDay, Cost: cost}); err != nil {
		t.Fatal(err)
	}
	if settle {
		if err := a.Budgets.Settle(ctx, res, cost, true); err != nil {
			t.Fatal(err)
		}
	}
}

// redisSpent reads the tenant's day's spent straight from Redis: a Status
// would check the day itself.
func redisSpent(t *testing.T, a *apptest.App, tenant string) money.Micros {
	t.Helper()
	day := time.Now().UTC().Format(time.DateOnly)
	s, err := a.Redis.HGet(context.Background(), a.Keys.BudgetTenant(day, tenant), "spent").Result()
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return money.Micros(n)
}

// raisedMetric reads llmq_budget_rebuilt_total and _usd_total of reason.
func raisedMetric(t *testing.T, rec *metrics.Recorder, reason string) (days, usd float64) {
	t.Helper()
	fams, err := rec.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					switch f.GetName() {
					case "llmq_budget_rebuilt_total":
						days = m.GetCounter().GetValue()
					case "llmq_budget_rebuilt_usd_total":
						usd = m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return days, usd
}

// Every full pass checks today's days against the ledger: a day whose
// spent was lowered by hand is raised to the ledger's sum, counted in
// llmq_budget_rebuilt_total{reason="periodic"}; a day the ledger agrees
// with is left alone.
func TestFullPassRaisesBudgetDaysBehind(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	behind, _ := a.Tenant("standard")
	even, _ := a.Tenant("standard")
	charge(t, a, behind, 300_000, true)
	charge(t, a, behind, 120_000, true)
	charge(t, a, even, 50_000, true)
	day := time.Now().UTC().Format(time.DateOnly)
	if err := a.Redis.HSet(ctx, a.Keys.BudgetTenant(day, behind), "spent", 100_000).Err(); err != nil {
		t.Fatal(err)
	}
	// The epoch is there: the first pass is a full one, not a loss's.
	if err := a.Redis.Set(ctx, a.Keys.Epoch(), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Its clock is two minutes on, so the rows are past the settlements'
	// slack (budget.LedgerSlack).
	r, rec := budgetReconciler(t, a, func() time.Time { return time.Now().Add(2 * time.Minute) })
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return redisSpent(t, a, behind) == 420_000 })
	cancel()
	<-done
	if got := redisSpent(t, a, even); got != 50_000 {
		t.Fatalf("the day the ledger agrees with: spent %s, want 50000", got)
	}
	if days, usd := raisedMetric(t, rec, budget.RaisedPeriodic); days != 1 || usd < 0.32-1e-9 || usd > 0.32+1e-9 {
		t.Fatalf("llmq_budget_rebuilt_total{periodic} = %v, usd %v; want 1 day, $0.32", days, usd)
	}
	if sum, _ := a.Store.UsageSumByTenantDay(context.Background(), behind, day); sum != 420_000 {
		t.Fatalf("ledger %s, want 420000", sum)
	}
}

// Redis restarts from an older RDB: the reconciler sees its run id change
// and at once raises the days the snapshot holds behind the ledger,
// settlements lost and in flight alike (reason restored), before anything
// reserves on them.
func TestRestartFromAnOlderSnapshotRaisesTheDaysAtOnce(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/0"})
	tenant, _ := a.Tenant("standard")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, rec := budgetReconciler(t, a, time.Now)
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	testutil.Eventually(t, 10*time.Second, func() bool { n, _ := a.Redis.Exists(ctx, a.Keys.Epoch()).Result(); return n == 1 })

	charge(t, a, tenant, 200_000, true)
	if err := a.Redis.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	aside := filepath.Join(t.TempDir(), "old.rdb")
	copyFile(t, filepath.Join(srv.Dir, "dump.rdb"), aside)
	charge(t, a, tenant, 300_000, true)
	charge(t, a, tenant, 70_000, false) // in flight at the restart
	srv.Stop()
	copyFile(t, aside, filepath.Join(srv.Dir, "dump.rdb"))
	srv.Start()

	testutil.Eventually(t, 10*time.Second, func() bool { return redisSpent(t, a, tenant) == 570_000 })
	cancel()
	<-done
	if days, usd := raisedMetric(t, rec, budget.RaisedRestored); days != 1 || usd < 0.37-1e-9 || usd > 0.37+1e-9 {
		t.Fatalf("llmq_budget_rebuilt_total{restored} = %v, usd %v; want 1 day, $0.37", days, usd)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
