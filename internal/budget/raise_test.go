package budget_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/testutil"
)

// raises records what a Budgets' Observer is told.
type raises struct {
	mu    sync.Mutex
	days  map[string]int
	added map[string]money.Micros
}

func (r *raises) BudgetRaised(reason string, added money.Micros) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.days == nil {
		r.days, r.added = map[string]int{}, map[string]money.Micros{}
	}
	r.days[reason]++
	r.added[reason] += added
}

func (r *raises) get(reason string) (int, money.Micros) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.days[reason], r.added[reason]
}

// observed replaces e.b with Budgets that tell obs of the days they raise.
func (e *env) observed(obs budget.Observer) {
	e.b = testutil.Must(budget.New(e.rdb, e.ledger, budget.Options{Keys: e.keys, Clock: e.clock.Now, Observer: obs}))
}

// snapshot saves the server's keys (SAVE) and keeps a copy of the RDB
// aside; restore kills the server and starts it again from that copy.
func snapshot(t *testing.T, srv *testutil.RedisServer) (restore func()) {
	t.Helper()
	if err := srv.Client().Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	aside := filepath.Join(t.TempDir(), "old.rdb")
	copyFile(t, filepath.Join(srv.Dir, "dump.rdb"), aside)
	return func() {
		srv.Stop()
		copyFile(t, aside, filepath.Join(srv.Dir, "dump.rdb"))
		srv.Start()
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

// Redis restarts from an RDB older than the ledger: the day hash exists,
// holding the spend of the snapshot. The first reservation after the
// restart, before anything else runs, sees the ledger's sum to the
// micro-dollar (tenant and global day); a settlement in flight across the
// raise (ledger row written, Settle after) is counted once; and a loop of
// reservations, each charged what it reserved, stops exactly at the budget.
func TestRestoredSnapshotIsRaisedBeforeItAdmits(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	e := setup(t, srv.Client(), utc("2025-06-10T12:00:00Z"))
	obs := &raises{}
	e.observed(obs)
	acct := budget.Account{TenantID: "ten_rdb", Budget: dollar, Global: 10 * dollar}

	e.charge(e.mustReserve(acct, "job_1", 200_000), 150_000)
	e.charge(e.mustReserve(acct, "job_2", 100_000), 80_000)
	restore := snapshot(t, srv)
	e.charge(e.mustReserve(acct, "job_3", 300_000), 250_000)
	e.charge(e.mustReserve(acct, "job_4", 100_000), 90_000)
	inflight := e.mustReserve(acct, "job_5", 200_000)
	e.ledger.record(inflight, 120_000) // its Settle comes after the restart
	e.wantSpend(acct, 570_000, 200_000)
	ledger := e.ledger.tenant("ten_rdb", "2025-06-10")
	if ledger != 690_000 {
		t.Fatalf("ledger %s, want 690000", ledger)
	}

	restore()
	if got := e.rdb.HGet(e.ctx, e.keys.BudgetTenant("2025-06-10", "ten_rdb"), "spent").Val(); got != "230000" {
		t.Fatalf("the restored day holds spent %s, want the snapshot's 230000", got)
	}

	res, d := e.reserve(acct, "job_6", 10_000)
	if !d.Allowed || d.Spent != ledger || d.GlobalSpent != ledger {
		t.Fatalf("first reservation after the restore: allowed %v, spent %s, global %s; want the ledger's %s", d.Allowed, d.Spent, d.GlobalSpent, ledger)
	}
	// job_5's reservation is not in the snapshot; the raise charged its
	// row, and its own Settle, coming now, adds nothing.
	if d.Reserved != 10_000 {
		t.Fatalf("reserved %s after the raise, want job_6's 10000 alone", d.Reserved)
	}
	if n, added := obs.get(budget.RaisedRestored); n != 2 || added != 2*460_000 {
		t.Fatalf("observer: %d days raised by %s, want 2 (tenant and global) by 460000 each", n, added)
	}
	if err := e.b.Settle(e.ctx, inflight, 120_000, true); err != nil {
		t.Fatal(err)
	}
	e.charge(res, 10_000)
	spent := e.wantSpend(acct, 700_000, 0).Spent
	allowed := 1
	for {
		r, d := e.reserve(acct, "loop_"+newID(), 10_000)
		if d.Spent+d.Reserved > acct.Budget {
			t.Fatalf("spent %s + reserved %s passed the budget %s", d.Spent, d.Reserved, acct.Budget)
		}
		if !d.Allowed {
			break
		}
		allowed++
		e.charge(r, 10_000)
		spent += 10_000
	}
	final := e.wantSpend(acct, dollar, 0)
	if spent != dollar || final.Spent != e.ledger.tenant("ten_rdb", "2025-06-10") || allowed != 31 {
		t.Fatalf("after the loop: spent %s (ledger %s), %d reservations allowed; want the budget exactly, 31 allowed",
			final.Spent, e.ledger.tenant("ten_rdb", "2025-06-10"), allowed)
	}
	// A restart without a snapshot starts empty: the days are rebuilt from
	// the ledger's sums, counted as lost.
	srv.Stop()
	if err := os.Remove(filepath.Join(srv.Dir, "dump.rdb")); err != nil {
		t.Fatal(err)
	}
	srv.Start()
	e.wantSpend(acct, dollar, 0)
	if n, added := obs.get(budget.RaisedLost); n != 2 || added != 2*dollar {
		t.Fatalf("observer: %d days rebuilt by %s, want 2 by $1 each", n, added)
	}
	if n, _ := obs.get(budget.RaisedRestored); n != 2 {
		t.Fatalf("observer: %d days raised after restarts, want the first 2 alone", n)
	}
}

// A restart that lost nothing (the snapshot is the last state) checks each
// day once per server, adding nothing; a Status is checked as a Reserve is.
func TestRestartWithoutLossChecksOnce(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	e := setup(t, srv.Client(), utc("2025-06-10T12:00:00Z"))
	obs := &raises{}
	e.observed(obs)
	acct := budget.Account{TenantID: "ten_same", Budget: dollar}
	e.charge(e.mustReserve(acct, "job_1", 200_000), 150_000)
	snapshot(t, srv)()
	reads := e.ledger.reads.Load()
	e.wantSpend(acct, 150_000, 0)
	e.wantSpend(acct, 150_000, 0)
	e.mustReserve(acct, "job_2", 100_000)
	if n := e.ledger.reads.Load() - reads; n != 1 {
		t.Fatalf("%d ledger reads after the restart, want 1 (one check of the day)", n)
	}
	if n, _ := obs.get(budget.RaisedRestored); n != 0 {
		t.Fatalf("%d days raised after a restart that lost nothing", n)
	}
}

// The reconciler's check: a day behind the ledger (a settlement lost, its
// mark and spend gone, or spend lowered by hand) is raised; rows written
// after InFlight are left to their settlements and counted in later
// checks; a day at the ledger's sum reads no row.
func TestCheckRaisesDaysBehind(t *testing.T) {
	t.Parallel()
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T12:00:00Z"))
	obs := &raises{}
	e.observed(obs)
	acct := budget.Account{TenantID: "ten_chk", Budget: dollar}
	day := e.keys.BudgetTenant("2025-06-10", "ten_chk")
	lost := e.mustReserve(acct, "job_lost", 100_000)
	e.charge(lost, 60_000)
	e.charge(e.mustReserve(acct, "job_kept", 100_000), 40_000)
	// The settlement of job_lost is lost: its mark and its spend.
	if err := e.rdb.HDel(e.ctx, day, "c:job_lost").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HIncrBy(e.ctx, day, "spent", -60_000).Err(); err != nil {
		t.Fatal(err)
	}
	if rep := e.check(budget.RaisedPeriodic, time.Now().Add(-time.Hour)); rep.Behind != 1 || rep.Raised != 0 {
		t.Fatalf("Check with the rows in flight = %+v; want the day behind, left to its settlements", rep)
	}
	e.wantSpend(acct, 40_000, 0)
	if rep := e.check(budget.RaisedPeriodic, time.Now().Add(time.Hour)); rep.Raised != 1 || rep.Rows != 1 || rep.Added != 60_000 {
		t.Fatalf("Check = %+v; want job_lost's 60000 charged", rep)
	}
	e.wantSpend(acct, 100_000, 0)

	// Spend lowered by hand, the marks left: the day is raised to the sum.
	if err := e.rdb.HSet(e.ctx, day, "spent", 30_000).Err(); err != nil {
		t.Fatal(err)
	}
	if rep := e.check(budget.RaisedPeriodic, time.Now().Add(time.Hour)); rep.Raised != 1 || rep.Rows != 0 || rep.Added != 70_000 {
		t.Fatalf("Check of spend lowered by hand = %+v; want it raised by 70000", rep)
	}
	e.wantSpend(acct, 100_000, 0)
	if n, added := obs.get(budget.RaisedPeriodic); n != 2 || added != 130_000 {
		t.Fatalf("observer: %d days raised by %s, want 2 by 130000", n, added)
	}
	// Nothing behind: only the sums were compared.
	before := e.ledger.reads.Load()
	if rep := e.check(budget.RaisedPeriodic, time.Now().Add(time.Hour)); rep.Days != 1 || rep.Behind != 0 {
		t.Fatalf("Check of a day at the ledger's sum = %+v", rep)
	}
	if n := e.ledger.reads.Load() - before; n != 0 {
		t.Fatalf("a check of a day not behind read the ledger's rows %d times", n)
	}
}

// A settlement that lands while a check charges the rows of its day is
// counted once, whichever comes first, on every master of a cluster too.
func TestCheckAndSettlementRace(t *testing.T) {
	t.Parallel()
	for name, rdb := range map[string]redis.UniversalClient{"single": testutil.Redis(t, testDB), "cluster": testutil.StartRedisCluster(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
			acct := budget.Account{TenantID: "ten_race", Budget: 1000 * dollar, Global: 1000 * dollar}
			var res []*budget.Reservation
			for range 200 {
				r := e.mustReserve(acct, "job_"+newID(), 2_000)
				e.ledger.record(r, 1_500)
				res = append(res, r)
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				for _, r := range res {
					if err := e.b.Settle(context.WithoutCancel(e.ctx), r, 1_500, true); err != nil {
						t.Error(err)
					}
				}
			})
			rep := e.check(budget.RaisedRestored, time.Time{})
			wg.Wait()
			d := e.wantSpend(acct, 300_000, 0)
			if d.GlobalSpent != 300_000 {
				t.Fatalf("global day: %s, want 300000", d.GlobalSpent)
			}
			t.Logf("the check charged %d of 200 rows before their settlements", rep.Rows/2)
		})
	}
}
