package budget_test

import (
	"testing"
	"time"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/testutil"
)

// fromLedger is the Reservation a redelivered job builds from its ledger row.
func fromLedger(res *budget.Reservation) *budget.Reservation {
	return &budget.Reservation{ID: res.ID, TenantID: res.TenantID, Day: res.Day, GlobalDay: res.GlobalDay}
}

// However often and by whom a job settles, it is charged once: a repeated
// Settle, one from a reservation rebuilt from the ledger row, one after a
// duplicate delivery released the shared hold, and one after the worker
// died between the ledger write and Settle.
func TestSettleChargesEachJobOnce(t *testing.T) {
	t.Parallel()
	t0 := utc("2025-06-10T12:00:00Z")
	e := setup(t, testutil.Redis(t, testDB), t0)
	acct := budget.Account{TenantID: "ten_once", Budget: dollar, Global: 10 * dollar}
	settle := func(res *budget.Reservation, cost money.Micros) {
		t.Helper()
		if err := e.b.Settle(e.ctx, res, cost, true); err != nil {
			t.Fatal(err)
		}
	}
	wantBoth := func(spent, reserved money.Micros) {
		t.Helper()
		if d := e.wantSpend(acct, spent, reserved); d.GlobalSpent != spent || d.GlobalReserved != reserved {
			t.Fatalf("global: spent %s reserved %s, want %s and %s", d.GlobalSpent, d.GlobalReserved, spent, reserved)
		}
	}

	// Settled twice, then again from the ledger row.
	r1 := e.mustReserve(acct, "job_1", 300_000)
	e.charge(r1, 200_000)
	settle(r1, 200_000)
	settle(fromLedger(r1), 200_000)
	wantBoth(200_000, 0)

	// A duplicate delivery of the job reserves again under its id after it
	// was charged, and settles: only its hold goes.
	dup := e.mustReserve(acct, "job_1", 300_000)
	wantBoth(200_000, 300_000)
	settle(dup, 250_000)
	wantBoth(200_000, 0)

	// Two deliveries share job_2's hold; the one that did not write the
	// ledger row releases it before the other settles: still charged.
	r2 := e.mustReserve(acct, "job_2", 100_000)
	if err := e.b.Release(e.ctx, r2); err != nil {
		t.Fatal(err)
	}
	e.charge(r2, 80_000)
	settle(r2, 80_000)
	wantBoth(280_000, 0)

	// The worker dies after writing job_3's ledger row, before Settle; its
	// reservation expires; the redelivery settles from the ledger row, once.
	r3 := e.mustReserve(acct, "job_3", 400_000)
	e.ledger.record(r3, 350_000)
	e.clock.Set(t0.Add(budget.DefaultReservationTTL + time.Second))
	wantBoth(280_000, 0)
	settle(fromLedger(r3), 350_000)
	settle(fromLedger(r3), 350_000)
	settle(r3, 350_000)
	wantBoth(630_000, 0)
	if got := e.ledger.tenant(acct.TenantID, r3.Day); got != 630_000 {
		t.Fatalf("ledger %s, Redis 0.630000", got)
	}
}

// A reservation its holder extends outlives ReservationTTL, so a long call
// keeps its room; once the holder stops, it lapses like any other.
func TestExtendKeepsTheReservation(t *testing.T) {
	t.Parallel()
	t0 := utc("2025-06-10T12:00:00Z")
	e := setup(t, testutil.Redis(t, testDB), t0)
	acct := budget.Account{TenantID: "ten_ext", Budget: dollar, Global: 10 * dollar}
	ttl := budget.DefaultReservationTTL
	long := e.mustReserve(acct, "job_long", 900_000)
	for i := 1; i <= 3; i++ {
		e.clock.Set(t0.Add(time.Duration(i) * ttl * 2 / 3))
		if held, err := e.b.Extend(e.ctx, long); err != nil || !held {
			t.Fatalf("Extend %d: held=%v %v", i, held, err)
		}
	}
	// Twice the TTL after Reserve the hold still counts.
	e.clock.Set(t0.Add(2*ttl + time.Minute))
	e.mustDeny(acct, "job_2", 200_000, budget.DeniedByTenant)
	if d := e.wantSpend(acct, 0, 900_000); d.GlobalReserved != 900_000 {
		t.Fatalf("global reserved: %+v", d)
	}
	// The holder stops: a TTL after its last extension the room is free.
	e.clock.Set(t0.Add(2*ttl + ttl + time.Second))
	e.mustReserve(acct, "job_2", 200_000)
	if held, err := e.b.Extend(e.ctx, long); err != nil || held {
		t.Fatalf("Extend of a lapsed reservation: held=%v %v", held, err)
	}
	r2, _ := e.reserve(acct, "job_2", 200_000)
	if err := e.b.Release(e.ctx, r2); err != nil {
		t.Fatal(err)
	}
	if held, err := e.b.Extend(e.ctx, r2); err != nil || held {
		t.Fatalf("Extend of a released reservation: held=%v %v", held, err)
	}
}

// A denial names the cap that refuses, with that cap's own numbers and
// reset: the tenant's day in its timezone, or the UTC day of the global cap.
func TestDenialNamesTheCapThatRefuses(t *testing.T) {
	t.Parallel()
	// 18:00 in New York: the tenant's day ends in 6 h, the UTC day in 2 h.
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T22:00:00Z"))
	ny := budget.Account{TenantID: "ten_ny", Budget: dollar, Location: mustLoad(t, "America/New_York"), Global: 5 * dollar}
	other := budget.Account{TenantID: "ten_big", Budget: 10 * dollar, Global: 5 * dollar}
	job1 := e.mustReserve(ny, "job_1", 900_000)

	// held: only reservations refuse, so try again soon; else the reset.
	check := func(amount money.Micros, by string, spent, reserved, limit money.Micros, resets string, held bool) {
		t.Helper()
		n := e.status(ny).Check(amount)
		retry := utc(resets).Sub(e.clock.Now())
		if held {
			retry = budget.HeldRetryAfter
		}
		if n == nil || n.By != by || n.Spent != spent || n.Reserved != reserved || n.Budget != limit ||
			!n.ResetsAt.Equal(utc(resets)) || n.RetryAfter != retry || n.Held != held {
			t.Fatalf("Check(%s) = %+v, want %s %s/%s of %s resetting at %s, held %v", amount, n, by, spent, reserved, limit, resets, held)
		}
	}
	if n := e.status(ny).Check(100_000); n != nil {
		t.Fatalf("Check of what fits: %+v", n)
	}
	check(100_001, budget.DeniedByTenant, 0, 900_000, dollar, "2025-06-11T04:00:00Z", true)

	big := e.mustReserve(other, "job_big", 4_050_000)
	check(60_000, budget.DeniedByGlobal, 0, 4_950_000, 5*dollar, "2025-06-11T00:00:00Z", true)
	// Both refuse: the tenant's day, which resets later, is the one to wait for.
	check(200_000, budget.DeniedByTenant, 0, 900_000, dollar, "2025-06-11T04:00:00Z", true)
	if n := e.status(ny).Check(6 * dollar); n == nil || !n.TooLarge || n.Held {
		t.Fatalf("Check of more than both caps: %+v", n)
	}

	// Settled, the same amounts are refused for spend, until the resets.
	e.charge(job1, 900_000)
	e.charge(big, 4_050_000)
	check(100_001, budget.DeniedByTenant, 900_000, 0, dollar, "2025-06-11T04:00:00Z", false)
	check(60_000, budget.DeniedByGlobal, 4_950_000, 0, 5*dollar, "2025-06-11T00:00:00Z", false)

	// A denied Reserve gives the same Denial.
	d := e.mustDeny(ny, "job_2", 60_000, budget.DeniedByGlobal)
	if n := d.Denial(); n.By != budget.DeniedByGlobal || n.Spent != 4_950_000 || n.Budget != 5*dollar || n.Held ||
		n.RetryAfter != 2*time.Hour || n.Name() != "global daily budget (all tenants)" {
		t.Fatalf("Denial of a Reserve = %+v (%s)", n, n.Name())
	}
	if _, d := e.reserve(ny, "job_3", 1); d.Denial() != nil {
		t.Fatalf("Denial of an allowed Reserve = %+v", d.Denial())
	}
}
