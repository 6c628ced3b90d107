package budget_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/testutil"
)

// coreTests run against the shared Redis and against a Redis Cluster.
var coreTests = []struct {
	name string
	fn   func(*testing.T, redis.UniversalClient)
}{
	{"ReserveSettleDeny", testReserveSettleDeny},
	{"CheckChargesLostSettlements", testCheckChargesLostSettlements},
	{"GlobalCapStopsTwoTenants", testGlobalCapStopsTwoTenants},
	{"UnlimitedTenantGlobalCap", testUnlimitedTenantGlobalCap},
	{"TimezoneDays", testTimezoneDays},
	{"WrongDayRetry", testWrongDayRetry},
	{"ReservationExpiry", testReservationExpiry},
	{"Idempotent", testIdempotent},
	{"SoftLimit", testSoftLimit},
	{"RebuildFreshDayFromLedger", testRebuildFreshDay},
	{"ConcurrentRebuildCountsOnce", testConcurrentRebuild},
	{"EveryKeyHasTTL", testEveryKeyHasTTL},
	{"RefusalHoldsNothing", testRefusalHoldsNothing},
	{"GlobalDayOnlyUnderACap", testGlobalDayOnlyUnderACap},
}

func TestCore(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, testDB)
	for _, c := range coreTests {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, rdb)
		})
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	rdb := testutil.StartRedisCluster(t)
	for _, c := range coreTests {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, rdb)
		})
	}
	t.Run("TenantsSpreadOverShards", func(t *testing.T) {
		t.Parallel()
		testTenantsSpreadOverShards(t, rdb)
	})
}

// Each tenant's day lives in a slot of its own tenant's, so a cluster's
// masters share the tenants; only the global day is one key.
func testTenantsSpreadOverShards(t *testing.T, rdb *redis.ClusterClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	masters := map[string]int{}
	for i := range 24 {
		acct := budget.Account{TenantID: fmt.Sprintf("ten_%d", i), Budget: dollar}
		e.charge(e.mustReserve(acct, "job_1", 1000), 500)
		key := e.keys.BudgetTenant("2025-06-10", acct.TenantID)
		node := testutil.Must(rdb.MasterForKey(e.ctx, key))
		if n := testutil.Must(node.Exists(e.ctx, key).Result()); n != 1 {
			t.Fatalf("tenant %s's day is not on the master of its slot", acct.TenantID)
		}
		masters[node.Options().Addr]++
	}
	if len(masters) < 3 {
		t.Fatalf("24 tenants' days on %d masters (%v), want all 3", len(masters), masters)
	}
	t.Logf("tenants' day keys per master: %v", masters)
}

// The tenant's day and the global day are held by two scripts (a cluster
// keeps them apart): when one refuses, the other's hold is let go, and the
// refused job holds nothing anywhere.
func testRefusalHoldsNothing(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	a := budget.Account{TenantID: "ten_a", Budget: dollar, Global: 2 * dollar}
	b := budget.Account{TenantID: "ten_b", Budget: 5 * dollar, Global: 2 * dollar}
	e.mustReserve(a, "job_a1", 900_000)
	e.mustReserve(b, "job_b1", 800_000)

	// a's own day refuses; the global day had room and holds nothing after.
	d := e.mustDeny(a, "job_a2", 200_000, "tenant")
	if d.Reserved != 900_000 || d.GlobalReserved != 1_700_000 {
		t.Fatalf("tenant refusal reports reserved %s, global %s; want 0.9 and 1.7", d.Reserved, d.GlobalReserved)
	}
	if st := e.status(b); st.GlobalReserved != 1_700_000 {
		t.Fatalf("global reserved %s after a tenant's refusal, want 1.7 (nothing held)", st.GlobalReserved)
	}
	// The global day refuses b; b's own day had room and holds nothing after.
	d = e.mustDeny(b, "job_b2", 400_000, "global")
	if d.Reserved != 800_000 || d.GlobalReserved != 1_700_000 {
		t.Fatalf("global refusal reports reserved %s, global %s; want 0.8 and 1.7", d.Reserved, d.GlobalReserved)
	}
	e.wantSpend(b, 0, 800_000)
	// What still fits, fits: the released holds left room behind (on a's
	// day once job_a2, which waits for its room first, stopped trying).
	e.mustReserve(b, "job_b3", 300_000)
	e.wantSpend(b, 0, 1_100_000)
	e.mustDeny(a, "job_a3", 0, "tenant")
	e.clock.Add(budget.WaitTTL + time.Second)
	e.mustReserve(a, "job_a3", 0)
	e.wantSpend(a, 0, 900_000)
}

// Without a global cap a job touches only its tenant's day (the global day
// is settled if Redis holds it, never created); a cap set later finds the
// day's spend from the ledger, and a cap taken away leaves the day counting.
func testGlobalDayOnlyUnderACap(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	global := e.keys.BudgetGlobal("2025-06-10")
	free := budget.Account{TenantID: "ten_free", Budget: dollar}
	res := e.mustReserve(free, "job_1", 300_000)
	if res.Global {
		t.Fatalf("reservation without a cap is held globally: %+v", res)
	}
	e.charge(res, 100_000)
	if n := testutil.Must(rdb.Exists(e.ctx, global).Result()); n != 0 {
		t.Fatalf("global day exists without a cap")
	}
	capped := free
	capped.Global = 10 * dollar
	if d := e.wantSpend(capped, 100_000, 0); d.GlobalSpent != 100_000 {
		t.Fatalf("a cap set later reads global spent %s, want the ledger's 0.1", d.GlobalSpent)
	}
	res = e.mustReserve(capped, "job_2", 300_000)
	if !res.Global {
		t.Fatalf("reservation under a cap is not held globally: %+v", res)
	}
	if held, err := e.b.Extend(e.ctx, res); err != nil || !held {
		t.Fatalf("Extend = %v, %v", held, err)
	}
	// The cap is taken away: the global day keeps counting what settles.
	e.charge(e.mustReserve(free, "job_3", 200_000), 200_000)
	e.charge(res, 150_000)
	if d := e.wantSpend(capped, 450_000, 0); d.GlobalSpent != 450_000 || d.GlobalReserved != 0 {
		t.Fatalf("global after the cap came back: spent %s reserved %s, want 0.45 and 0", d.GlobalSpent, d.GlobalReserved)
	}
	// A global hold gone while the tenant's stays is said, and the
	// tenant's is kept.
	res = e.mustReserve(capped, "job_4", 100_000)
	if err := rdb.HDel(e.ctx, global, "r:ten_free:job_4").Err(); err != nil {
		t.Fatal(err)
	}
	if held, err := e.b.Extend(e.ctx, res); err != nil || !held {
		t.Fatalf("Extend after the global hold went = %v, %v; want true (the tenant's day holds it)", held, err)
	}
	if !strings.Contains(e.logs.String(), "hold on the global day is gone") {
		t.Fatalf("the lost global hold was not logged:\n%s", e.logs.String())
	}
	e.charge(res, 0)
	if held, err := e.b.Extend(e.ctx, res); err != nil || held {
		t.Fatalf("Extend after Settle = %v, %v; want false", held, err)
	}
}

func testReserveSettleDeny(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_a", Budget: dollar, SoftLimit: 0.8}

	res, d := e.reserve(acct, "job_1", 300_000)
	if !d.Allowed || d.Reserved != 300_000 || d.Spent != 0 || d.Remaining != 700_000 || d.Budget != dollar {
		t.Fatalf("first reservation: %+v", d)
	}
	if d.Day != "2025-06-10" || d.GlobalDay != "2025-06-10" || !d.ResetsAt.Equal(utc("2025-06-11T00:00:00Z")) || d.RetryAfter != 0 {
		t.Fatalf("first reservation's day: %+v", d)
	}
	if res.ID != "job_1" || res.TenantID != "ten_a" || res.Day != "2025-06-10" || res.GlobalDay != "2025-06-10" || res.Amount != 300_000 {
		t.Fatalf("reservation: %+v", res)
	}
	e.charge(res, 120_000)
	d = e.wantSpend(acct, 120_000, 0)
	// Without a global cap the global day is not read.
	if d.Remaining != 880_000 || d.GlobalSpent != 0 || d.GlobalReserved != 0 || d.GlobalBudget != 0 || !d.Allowed {
		t.Fatalf("after settling: %+v", d)
	}

	// Exactly the budget fits; one micro-dollar more does not, for now:
	// what job_2 holds comes back when it settles.
	full := e.mustReserve(acct, "job_2", 880_000)
	d = e.mustDeny(acct, "job_3", 1, "tenant")
	if !d.Held || d.RetryAfter != budget.HeldRetryAfter || !d.ResetsAt.Equal(utc("2025-06-11T00:00:00Z")) || d.TooLarge || d.Remaining != 0 {
		t.Fatalf("denial: %+v", d)
	}
	if d = e.status(acct); d.Allowed || d.DeniedBy != "tenant" || !d.Held || d.RetryAfter != budget.HeldRetryAfter {
		t.Fatalf("status when full: %+v", d)
	}
	// More than the whole budget can never run: say so.
	if d = e.mustDeny(acct, "job_4", dollar+1, "tenant"); !d.TooLarge || d.Held {
		t.Fatalf("an amount over the budget is not TooLarge: %+v", d)
	}

	if err := e.b.Release(e.ctx, full); err != nil {
		t.Fatal(err)
	}
	e.wantSpend(acct, 120_000, 0)
	e.charge(e.mustReserve(acct, "job_3", 1), 1)
	// Spent to the budget: no settlement can make room before the reset.
	e.charge(e.mustReserve(acct, "job_5", 879_999), 879_999)
	d = e.mustDeny(acct, "job_6", 1, "tenant")
	if d.Held || d.RetryAfter != 12*time.Hour || !d.ResetsAt.Equal(utc("2025-06-11T00:00:00Z")) || d.TooLarge {
		t.Fatalf("denial for spend: %+v", d)
	}
	if d = e.status(acct); d.Allowed || d.Held || d.RetryAfter != 12*time.Hour {
		t.Fatalf("status when spent: %+v", d)
	}
}

func testGlobalCapStopsTwoTenants(t *testing.T, rdb redis.UniversalClient) {
	// 20:00 UTC is 16:00 in New York: the global (UTC) day ends four hours
	// before tenant b's.
	e := setup(t, rdb, utc("2025-06-10T20:00:00Z"))
	ny := mustLoad(t, "America/New_York")
	a := budget.Account{TenantID: "ten_a", Budget: 5 * dollar, Global: dollar}
	b := budget.Account{TenantID: "ten_b", Budget: 5 * dollar, Global: dollar, Location: ny}

	ra := e.mustReserve(a, "job_a1", 600_000)
	e.mustReserve(b, "job_b1", 400_000)
	for _, acct := range []budget.Account{a, b} {
		d := e.mustDeny(acct, "job_more_"+acct.TenantID, 1, "global")
		if !d.Held || d.RetryAfter != budget.HeldRetryAfter || !d.ResetsAt.Equal(utc("2025-06-11T00:00:00Z")) || d.GlobalReserved != dollar {
			t.Fatalf("tenant %s: %+v", acct.TenantID, d)
		}
		// The tenant's own figures are untouched by the global cap.
		if d.Remaining == 0 {
			t.Fatalf("tenant %s: remaining 0 under a global denial: %+v", acct.TenantID, d)
		}
	}
	if d := e.status(b); d.Allowed || d.DeniedBy != "global" || d.Day != "2025-06-10" || d.GlobalDay != "2025-06-10" {
		t.Fatalf("status of b: %+v", d)
	}

	// Settling below the estimate frees global room for either tenant.
	e.charge(ra, 100_000)
	e.mustReserve(b, "job_b2", 500_000)
	e.mustDeny(a, "job_a2", 1, "global")

	// Both caps deny b for spend: the tenant's New York day resets after
	// the UTC one, so that is when b can run.
	e.charge(e.mustReserve(b, "job_b1", 400_000), 400_000)
	small := budget.Account{TenantID: "ten_b", Budget: 900_000, Global: dollar, Location: ny}
	if d := e.mustDeny(small, "job_b3", 600_000, "tenant"); d.Held || d.TooLarge ||
		!d.ResetsAt.Equal(utc("2025-06-11T04:00:00Z")) || d.RetryAfter != 8*time.Hour {
		t.Fatalf("both caps: %+v", d)
	}

	// Past UTC midnight the global day is new; b's New York day is not.
	e.clock.Set(utc("2025-06-11T00:00:01Z"))
	e.mustReserve(a, "job_a3", 600_000)
	rb := e.mustReserve(b, "job_b4", 400_000)
	if rb.Day != "2025-06-10" || rb.GlobalDay != "2025-06-11" {
		t.Fatalf("reservation days after UTC midnight: %+v", rb)
	}
	// (b's earlier reservations, never settled, expired hours ago.)
	if d := e.status(b); d.Reserved != 400_000 || d.GlobalReserved != dollar {
		t.Fatalf("b after UTC midnight: %+v", d)
	}
}

func testUnlimitedTenantGlobalCap(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_u", Unlimited: true, SoftLimit: 0.8, Global: 2 * dollar}

	r1, d := e.reserve(acct, "job_1", 1_500_000)
	if !d.Allowed || !d.Unlimited || d.Budget != 0 || d.Remaining != 0 || d.SoftLimitReached {
		t.Fatalf("unlimited reservation: %+v", d)
	}
	e.mustDeny(acct, "job_2", 600_000, "global")
	if d := e.mustDeny(acct, "job_big", 3*dollar, "global"); !d.TooLarge {
		t.Fatalf("over the global cap is not TooLarge: %+v", d)
	}
	// The global day keeps no order: what fits, fits.
	e.mustReserve(acct, "job_3", 500_000)
	e.charge(r1, 1_400_000)
	e.wantSpend(acct, 1_400_000, 500_000)

	// Without a global cap nothing stops it, and its spend is still recorded.
	free := budget.Account{TenantID: "ten_u", Unlimited: true}
	r := e.mustReserve(free, "job_4", 1000*dollar)
	e.charge(r, 900*dollar)
	e.wantSpend(free, 901_400_000, 500_000)
}

func testTimezoneDays(t *testing.T, rdb redis.UniversalClient) {
	ny := mustLoad(t, "America/New_York")
	sp := mustLoad(t, "America/Sao_Paulo")
	for _, c := range []struct {
		name        string
		loc         *time.Location
		now         string
		day, gday   string
		resets      string
		retryAfter  time.Duration
		description string
	}{
		{"ny spring start", ny, "2025-03-09T05:30:00Z", "2025-03-09", "2025-03-09", "2025-03-10T04:00:00Z", 22*time.Hour + 30*time.Minute, "00:30 EST on a 23-hour day"},
		{"ny spring end", ny, "2025-03-10T03:30:00Z", "2025-03-09", "2025-03-10", "2025-03-10T04:00:00Z", 30 * time.Minute, "23:30 EDT, already the next UTC day"},
		{"ny fall", ny, "2025-11-02T04:30:00Z", "2025-11-02", "2025-11-02", "2025-11-03T05:00:00Z", 24*time.Hour + 30*time.Minute, "00:30 EDT on a 25-hour day"},
		{"sao paulo before skipped midnight", sp, "2018-11-04T02:30:00Z", "2018-11-03", "2018-11-04", "2018-11-04T03:00:00Z", 30 * time.Minute, "23:30 -03; midnight never came, the next day starts at 01:00 -02"},
		{"sao paulo day without midnight", sp, "2018-11-04T03:30:00Z", "2018-11-04", "2018-11-04", "2018-11-05T02:00:00Z", 22*time.Hour + 30*time.Minute, "01:30 -02 on a day that began at 01:00"},
		{"utc", nil, "2025-06-10T23:59:59.999999Z", "2025-06-10", "2025-06-10", "2025-06-11T00:00:00Z", time.Microsecond, "the last micro-second"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t, rdb, utc(c.now))
			acct := budget.Account{TenantID: "ten_tz", Budget: 0, Location: c.loc, Global: 100 * dollar}
			d := e.mustDeny(acct, "job_1", 1, "tenant")
			if d.Day != c.day || d.GlobalDay != c.gday || !d.ResetsAt.Equal(utc(c.resets)) || d.RetryAfter != c.retryAfter {
				t.Fatalf("%s: day %s global %s resets %s retry after %s, want %s %s %s %s",
					c.description, d.Day, d.GlobalDay, d.ResetsAt.UTC(), d.RetryAfter, c.day, c.gday, c.resets, c.retryAfter)
			}
			acct.Budget = dollar
			res := e.mustReserve(acct, "job_2", 10)
			if res.Day != c.day || res.GlobalDay != c.gday {
				t.Fatalf("reservation days %s %s, want %s %s", res.Day, res.GlobalDay, c.day, c.gday)
			}
			for _, key := range []string{e.keys.BudgetTenant(c.day, "ten_tz"), e.keys.BudgetGlobal(c.gday)} {
				if n, err := e.rdb.Exists(e.ctx, key).Result(); err != nil || n != 1 {
					t.Fatalf("day key %s (days %s / %s): %d %v", key, c.day, c.gday, n, err)
				}
			}
		})
	}
}

func testWrongDayRetry(t *testing.T, rdb redis.UniversalClient) {
	t.Run("injected clock", func(t *testing.T) {
		e := setup(t, rdb, utc("2025-06-10T23:30:00Z"))
		// This worker believes it is already tomorrow; the script's clock says otherwise.
		budget.SetGuess(e.b, func() time.Time { return utc("2025-06-11T00:10:00Z") })
		acct := budget.Account{TenantID: "ten_w", Budget: dollar}
		res := e.mustReserve(acct, "job_1", 100)
		if res.Day != "2025-06-10" || budget.WrongDays(e.b) != 1 {
			t.Fatalf("day %s after %d wrong-day replies, want 2025-06-10 after 1", res.Day, budget.WrongDays(e.b))
		}
		for _, k := range e.scanKeys() {
			if strings.Contains(k, "2025-06-11") {
				t.Fatalf("the wrong guess wrote %s", k)
			}
		}
	})
	t.Run("redis time", func(t *testing.T) {
		e := setup(t, rdb, time.Time{})
		b := testutil.Must(budget.New(rdb, e.ledger, budget.Options{Keys: e.keys})) // Redis TIME
		budget.SetGuess(b, func() time.Time { return time.Now().Add(-72 * time.Hour) })
		acct := budget.Account{TenantID: "ten_w", Budget: dollar}
		before := time.Now().UTC()
		res, d, err := b.Reserve(e.ctx, acct, "job_1", 100)
		after := time.Now().UTC()
		if err != nil || !d.Allowed {
			t.Fatalf("Reserve: %v %+v", err, d)
		}
		if res.Day != before.Format(time.DateOnly) && res.Day != after.Format(time.DateOnly) {
			t.Fatalf("day %s, want today (%s)", res.Day, before.Format(time.DateOnly))
		}
		if budget.WrongDays(b) != 1 {
			t.Fatalf("%d wrong-day replies, want 1", budget.WrongDays(b))
		}
		if err := b.Settle(e.ctx, res, 50, true); err != nil {
			t.Fatal(err)
		}
		if d, err := b.Status(e.ctx, acct); err != nil || d.Spent != 50 {
			t.Fatalf("status: %v %+v", err, d)
		}
	})
}

func testReservationExpiry(t *testing.T, rdb redis.UniversalClient) {
	t0 := utc("2025-06-10T12:00:00Z")
	e := setup(t, rdb, t0)
	acct := budget.Account{TenantID: "ten_x", Budget: dollar, Global: 10 * dollar}

	crashed := e.mustReserve(acct, "job_crashed", 900_000)
	e.clock.Set(t0.Add(10 * time.Minute))
	e.mustDeny(acct, "job_2", 200_000, "tenant")

	// The holder never settled: after ReservationTTL it stops counting.
	e.clock.Set(t0.Add(budget.DefaultReservationTTL))
	e.mustReserve(acct, "job_2", 200_000)
	if d := e.wantSpend(acct, 0, 200_000); d.GlobalReserved != 200_000 {
		t.Fatalf("global reserved after expiry: %+v", d)
	}

	// A call that outlived its reservation is still charged, once.
	e.charge(crashed, 500_000)
	if err := e.b.Settle(e.ctx, crashed, 500_000, true); err != nil {
		t.Fatal(err)
	}
	if d := e.wantSpend(acct, 500_000, 200_000); d.GlobalSpent != 500_000 {
		t.Fatalf("global spent after a late settlement: %+v", d)
	}
}

func testIdempotent(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_i", Budget: dollar, Global: 10 * dollar}

	r1 := e.mustReserve(acct, "job_1", 300_000)
	again := e.mustReserve(acct, "job_1", 500_000)
	if again.Amount != 300_000 {
		t.Fatalf("second Reserve of the same id holds %s, want the first 0.300000", again.Amount)
	}
	if d := e.wantSpend(acct, 0, 300_000); d.GlobalReserved != 300_000 {
		t.Fatalf("global after a repeated Reserve: %+v", d)
	}

	e.charge(r1, 200_000)
	if err := e.b.Settle(e.ctx, again, 200_000, true); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Release(e.ctx, r1); err != nil {
		t.Fatal(err)
	}
	if d := e.wantSpend(acct, 200_000, 0); d.GlobalSpent != 200_000 {
		t.Fatalf("global after settling twice: %+v", d)
	}

	r2 := e.mustReserve(acct, "job_2", 400_000)
	for range 2 {
		if err := e.b.Release(e.ctx, r2); err != nil {
			t.Fatal(err)
		}
	}
	e.wantSpend(acct, 200_000, 0)

	// A retried job reserves again under its id after a release.
	r2 = e.mustReserve(acct, "job_2", 400_000)
	e.wantSpend(acct, 200_000, 400_000)
	// charge=false: the ledger row existed, the job was charged before.
	if err := e.b.Settle(e.ctx, r2, 350_000, false); err != nil {
		t.Fatal(err)
	}
	if d := e.wantSpend(acct, 200_000, 0); d.GlobalReserved != 0 || d.GlobalSpent != 200_000 {
		t.Fatalf("global after charge=false: %+v", d)
	}
}

func testSoftLimit(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_s", Budget: dollar, SoftLimit: 0.8}

	if _, d := e.reserve(acct, "job_1", 500_000); d.SoftLimitReached || d.SoftLimitCrossed {
		t.Fatalf("at 50%%: %+v", d)
	}
	if _, d := e.reserve(acct, "job_2", 300_000); !d.SoftLimitReached || !d.SoftLimitCrossed {
		t.Fatalf("at 80%%: %+v", d)
	}
	if _, d := e.reserve(acct, "job_3", 100_000); !d.SoftLimitReached || d.SoftLimitCrossed {
		t.Fatalf("at 90%%: %+v", d)
	}
	if d := e.status(acct); !d.SoftLimitReached || d.SoftLimitCrossed || d.Remaining != 100_000 {
		t.Fatalf("status at 90%%: %+v", d)
	}
	if n := containsCount(e.logs.String(), "soft limit"); n != 1 {
		t.Fatalf("%d soft-limit log lines, want 1:\n%s", n, e.logs.String())
	}
}

func testRebuildFreshDay(t *testing.T, rdb redis.UniversalClient) {
	// Redis has never seen this day (or lost it), the ledger has its spend.
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	e.ledger.add("ten_r", "2025-06-10", "2025-06-10", 700_000)
	e.ledger.add("ten_other", "2025-06-10", "2025-06-10", 1_300_000)
	acct := budget.Account{TenantID: "ten_r", Budget: dollar, Global: 2_500_000}

	if d := e.wantSpend(acct, 700_000, 0); d.GlobalSpent != 2*dollar {
		t.Fatalf("global spent not rebuilt: %+v", d)
	}
	e.mustDeny(acct, "job_1", 300_001, "tenant")
	e.mustReserve(acct, "job_1", 300_000)
	e.mustDeny(budget.Account{TenantID: "ten_other", Budget: 5 * dollar, Global: 2_500_000}, "job_2", 200_001, "global")
	if n := e.ledger.reads.Load(); n != 3 {
		t.Fatalf("%d ledger reads, want 3 (ten_r, the global day, ten_other)", n)
	}
	if !strings.Contains(e.logs.String(), "rebuilt") {
		t.Fatalf("no log of the rebuild:\n%s", e.logs.String())
	}
}

func testConcurrentRebuild(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	e.ledger.add("ten_c", "2025-06-10", "2025-06-10", 400_000)
	acct := budget.Account{TenantID: "ten_c", Budget: dollar, Global: 100 * dollar}
	workers := []*budget.Budgets{e.b, e.budgets(rdb), e.budgets(rdb), e.budgets(rdb)}
	errs := make(chan error, 40)
	for i := range 40 {
		go func() {
			_, _, err := workers[i%len(workers)].Reserve(e.ctx, acct, "job_"+string(rune('a'+i)), 10_000)
			errs <- err
		}()
	}
	for range 40 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if d := e.wantSpend(acct, 400_000, 400_000); d.GlobalSpent != 400_000 {
		t.Fatalf("global spent %s, want 0.400000 once", d.GlobalSpent)
	}
}

func testEveryKeyHasTTL(t *testing.T, rdb redis.UniversalClient) {
	now := utc("2025-06-10T20:00:00Z")
	e := setup(t, rdb, now)
	ny := mustLoad(t, "America/New_York")
	a := budget.Account{TenantID: "ten_a", Budget: dollar, SoftLimit: 0.5, Global: 10 * dollar}
	b := budget.Account{TenantID: "ten_b", Budget: dollar, Location: ny}
	ra := e.mustReserve(a, "job_1", 600_000)
	e.charge(ra, 500_000)
	e.mustReserve(a, "job_2", 100_000)
	rb := e.mustReserve(b, "job_3", 100_000)
	e.mustReserve(b, "job_4", 100_000)
	if err := e.b.Release(e.ctx, rb); err != nil {
		t.Fatal(err)
	}
	e.status(budget.Account{TenantID: "ten_c", Budget: dollar})
	// A job that waits for room b's jobs hold: its day's waiters.
	if d := e.mustDeny(b, "job_5", 950_000, "tenant"); !d.Held {
		t.Fatalf("not held: %+v", d)
	}

	keys := e.scanKeys()
	if len(keys) < 7 {
		t.Fatalf("only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		ttl, err := e.rdb.PTTL(e.ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// UTC days end in 4h, New York's in 8h; keys live 48h past that.
		if ttl < 52*time.Hour-time.Minute || ttl > 56*time.Hour {
			t.Errorf("key %s: TTL %v, want the day's end + 48h", k, ttl)
		}
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T12:00:00Z"))
	ok := budget.Account{TenantID: "ten_v", Budget: dollar}
	for _, c := range []struct {
		acct   budget.Account
		id     string
		amount money.Micros
		want   string
	}{
		{budget.Account{Budget: dollar}, "job", 1, "TenantID"},
		{budget.Account{TenantID: "t", Budget: -1}, "job", 1, "Budget"},
		{budget.Account{TenantID: "t", Budget: 1, SoftLimit: 1.5}, "job", 1, "SoftLimit"},
		{budget.Account{TenantID: "t", Budget: 1, Global: -1}, "job", 1, "Global"},
		{ok, "", 1, "empty reservation id"},
		{ok, "job", -1, "negative amount"},
	} {
		if _, _, err := e.b.Reserve(e.ctx, c.acct, c.id, c.amount); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Reserve(%+v, %q, %d) = %v, want an error naming %s", c.acct, c.id, c.amount, err, c.want)
		}
	}
	if err := e.b.Settle(e.ctx, &budget.Reservation{ID: "job", TenantID: "t", Day: "d", GlobalDay: "d"}, -1, true); err == nil {
		t.Error("Settle accepted a negative cost")
	}
	if err := e.b.Release(e.ctx, nil); err == nil {
		t.Error("Release accepted a nil reservation")
	}
}

// New without a Ledger is an error, and no Budgets.
func TestNewNeedsLedger(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"})
	defer rdb.Close()
	if _, err := budget.New(rdb, nil, budget.Options{}); err == nil {
		t.Fatal("New without a Ledger: no error")
	}
}

// Concurrent Status calls of one account share reads, and each still sees
// what was done before it was made: here, its own goroutine's reservation.
func TestConcurrentStatusSharesReadsAndSeesEarlierWrites(t *testing.T) {
	t.Parallel()
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_a", Budget: 1000 * dollar}
	const workers, rounds = 50, 10
	var wg sync.WaitGroup
	var calls atomic.Int64
	errs := make(chan error, workers)
	start := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			<-start
			var mine money.Micros
			for i := range rounds {
				_, d, err := e.b.Reserve(e.ctx, acct, fmt.Sprintf("job_%d_%d", w, i), 1000)
				if err != nil || !d.Allowed {
					errs <- fmt.Errorf("reserve: %v %+v", err, d)
					return
				}
				mine += 1000
				// Everyone's reservations so far include this goroutine's.
				for range 3 {
					calls.Add(1)
					s, err := e.b.Status(e.ctx, acct)
					if err != nil {
						errs <- err
						return
					}
					if s.Reserved < mine {
						errs <- fmt.Errorf("status after reserving %s shows %s reserved", mine, s.Reserved)
						return
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e.wantSpend(acct, 0, workers*rounds*1000)
	reads := budget.StatusReads(e.b)
	t.Logf("%d Status calls, %d reads", calls.Load(), reads)
	if int64(reads) >= calls.Load() {
		t.Fatalf("%d Status calls made %d reads: concurrent calls share none", calls.Load(), reads)
	}
}

// A failover lost a settlement (the ledger has the row, Redis holds the
// reservation or nothing): Check charges it once, on the tenant's day and
// the global day; the rows Redis counts, a second check, the job's own
// late settlement and the rows of a day rebuilt from the ledger add
// nothing.
func testCheckChargesLostSettlements(t *testing.T, rdb redis.UniversalClient) {
	e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_audit", Budget: dollar, Global: 10 * dollar}
	settled := e.mustReserve(acct, "job_settled", 100_000)
	e.charge(settled, 50_000)
	lost := e.mustReserve(acct, "job_lost", 100_000)
	e.ledger.record(lost, 70_000) // its Settle never reached Redis

	rep := e.check(budget.RaisedRestored, time.Time{})
	if rep.Days != 2 || rep.Behind != 2 || rep.Raised != 2 || rep.Rows != 2 || rep.Added != 140_000 {
		t.Fatalf("Check = %+v; want both days raised by the lost row (70000 each)", rep)
	}
	if d := e.wantSpend(acct, 120_000, 0); d.GlobalSpent != 120_000 {
		t.Fatalf("after the check: %+v", d)
	}
	if rep := e.check(budget.RaisedRestored, time.Time{}); rep.Days != 2 || rep.Behind != 0 || rep.Rows != 0 {
		t.Fatalf("second Check = %+v; want nothing behind", rep)
	}
	if err := e.b.Settle(e.ctx, lost, 70_000, true); err != nil {
		t.Fatal(err)
	}
	e.wantSpend(acct, 120_000, 0)

	// A day Redis lost whole is rebuilt from the ledger: its rows are in
	// the sum, and a check leaves them.
	for _, key := range []string{e.keys.BudgetTenant("2025-06-10", "ten_audit"), e.keys.BudgetGlobal("2025-06-10")} {
		if err := rdb.Del(e.ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if rep := e.check(budget.RaisedRestored, time.Time{}); rep.Days != 0 {
		t.Fatalf("Check of days Redis lost = %+v; want them left to their rebuild", rep)
	}
	e.wantSpend(acct, 120_000, 0)
	if rep := e.check(budget.RaisedRestored, time.Time{}); rep.Behind != 0 || rep.Rows != 0 {
		t.Fatalf("Check after a rebuild = %+v; want nothing behind", rep)
	}
	e.wantSpend(acct, 120_000, 0)
}
