package budget_test

import (
	"testing"
	"time"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/testutil"
)

// wantHeld asserts a refusal only by what others hold: room comes back
// within HeldRetryAfter, not at the reset.
func (e *env) wantHeld(acct budget.Account, id string, amount money.Micros) *budget.Decision {
	e.t.Helper()
	d := e.mustDeny(acct, id, amount, budget.DeniedByTenant)
	if !d.Held || d.TooLarge || d.RetryAfter != budget.HeldRetryAfter {
		e.t.Fatalf("Reserve %s of %s: Held=%v TooLarge=%v RetryAfter=%v, want held, retry after %v (%+v)",
			id, amount, d.Held, d.TooLarge, d.RetryAfter, budget.HeldRetryAfter, d)
	}
	return d
}

// A $0.02 day, four jobs holding $0.005 each: a fifth is refused only by
// their holds (spent + its $0.005 fits), and runs once two settled at
// their real $0.002; one whose worst case passes the budget with what was
// spent is refused for spend, until the reset.
func TestHeldOrSpent(t *testing.T) {
	t.Parallel()
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_held", Budget: 20_000}
	var running []*budget.Reservation
	for _, id := range []string{"job_1", "job_2", "job_3", "job_4"} {
		running = append(running, e.mustReserve(acct, id, 5_000))
	}
	d := e.wantHeld(acct, "job_5", 5_000)
	if d.Spent != 0 || d.Reserved != 20_000 || !d.ResetsAt.Equal(utc("2025-06-11T00:00:00Z")) {
		t.Fatalf("held: %+v", d)
	}
	if n := d.Denial(); !n.Held || n.RetryAfter != budget.HeldRetryAfter || n.Spent != 0 || n.Reserved != 20_000 {
		t.Fatalf("Denial of a held refusal: %+v", n)
	}
	e.charge(running[0], 2_000)
	e.wantHeld(acct, "job_5", 5_000) // room 3,000
	e.charge(running[1], 2_000)
	e.mustReserve(acct, "job_5", 5_000) // room 6,000

	// $0.004 spent, $0.015 held: $0.017 would pass the budget with the
	// spend alone.
	d = e.mustDeny(acct, "job_big", 17_000, budget.DeniedByTenant)
	if d.Held || d.TooLarge || d.RetryAfter != 12*time.Hour {
		t.Fatalf("refused for spend: %+v", d)
	}
	if n := e.status(acct).Check(17_000); n == nil || n.Held || n.RetryAfter != 12*time.Hour {
		t.Fatalf("Check for spend: %+v", n)
	}
	if n := e.status(acct).Check(16_000); n == nil || !n.Held || n.RetryAfter != budget.HeldRetryAfter {
		t.Fatalf("Check by holds: %+v", n)
	}
}

// Jobs refused by holds get the room in the order they first waited: a
// later one that would fit alone waits while an earlier one needs the
// room, and so does a newcomer.
func TestWaitersGetTheRoomInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_order", Budget: 10_000}
	first := e.mustReserve(acct, "job_a", 10_000)
	e.wantHeld(acct, "job_w1", 6_000)
	e.clock.Add(time.Second)
	e.wantHeld(acct, "job_w2", 3_000)
	e.clock.Add(time.Second)

	e.charge(first, 2_000) // room 8,000: w1 fits, w2 and a newcomer would too
	e.wantHeld(acct, "job_w2", 3_000)
	e.wantHeld(acct, "job_n", 1_000)
	w1 := e.mustReserve(acct, "job_w1", 6_000)
	e.wantHeld(acct, "job_n", 1_000) // room 2,000, w2 first
	e.wantHeld(acct, "job_w2", 3_000)
	e.charge(w1, 4_000) // spent 6,000: room 4,000, w2's 3,000 first
	e.wantHeld(acct, "job_n", 1_001)
	w2 := e.mustReserve(acct, "job_w2", 3_000)
	e.wantHeld(acct, "job_n", 1_001)
	e.charge(w2, 2_000)
	e.mustReserve(acct, "job_n", 1_001)
	e.wantSpend(acct, 8_000, 1_001)
}

// A waiter that stops trying stops holding back those behind it: after
// WaitTTL from its last try, or at once when its caller says so
// (StopWaiting); and one whose worst case passes the budget with what was
// spent since holds nobody back (its next try is refused for spend).
func TestAWaiterThatGoesAwayStopsBlocking(t *testing.T) {
	t.Parallel()
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_gone", Budget: 10_000}
	a := e.mustReserve(acct, "job_a", 8_000)
	e.wantHeld(acct, "job_w", 5_000) // waits from 0 s
	e.clock.Add(time.Second)
	e.charge(a, 1_000)               // room 9,000
	e.wantHeld(acct, "job_n", 5_000) // behind w, from 1 s
	e.clock.Add(9 * time.Second)
	e.wantHeld(acct, "job_late", 5_000) // w and n still count at 10 s
	e.clock.Add(16 * time.Second)
	// At 26 s none of them tried within WaitTTL: all lapsed.
	e.mustReserve(acct, "job_x", 5_000) // room 4,000

	// A caller that gives up lets go at once.
	e.wantHeld(acct, "job_y", 4_001)
	e.clock.Add(time.Second)
	e.wantHeld(acct, "job_z", 3_000)
	if err := e.b.StopWaiting(e.ctx, acct, "job_y"); err != nil {
		t.Fatal(err)
	}
	e.mustReserve(acct, "job_z", 3_000)

	// Spend that passes a waiter's worst case: it no longer holds back.
	acct2 := budget.Account{TenantID: "ten_spent", Budget: 10_000}
	b := e.mustReserve(acct2, "job_b", 9_000)
	e.wantHeld(acct2, "job_w", 6_000)
	e.clock.Add(time.Second)
	e.charge(b, 5_000) // spent 5,000: w's 6,000 can never fit today
	e.mustReserve(acct2, "job_n", 4_000)
	if d := e.mustDeny(acct2, "job_w", 6_000, budget.DeniedByTenant); d.Held {
		t.Fatalf("the waiter past the budget: %+v, want refused for spend", d)
	}
}

// Under a global cap the global day refuses for spend or holds alike, and a
// job its tenant's day made wait, then refused by the global day for
// spend, waits no more: it holds nobody of its tenant back.
func TestGlobalSpendEndsATenantWait(t *testing.T) {
	t.Parallel()
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T12:00:00Z"))
	acct := budget.Account{TenantID: "ten_g1", Budget: 10_000, Global: 30_000}
	other := budget.Account{TenantID: "ten_g2", Budget: 50_000, Global: 30_000}
	e.charge(e.mustReserve(other, "job_o", 22_000), 22_000)
	mine := e.mustReserve(acct, "job_a", 6_000)
	// Tenant: held by job_a; global: 22,000 + 9,000 passes 30,000, for spend.
	if d := e.mustDeny(acct, "job_w", 9_000, budget.DeniedByTenant); d.Held {
		t.Fatalf("refused for global spend: %+v", d)
	}
	e.clock.Add(time.Second)
	e.charge(mine, 1_000)               // tenant room 9,000; global spent 23,000
	e.mustReserve(acct, "job_n", 5_000) // job_w, had it waited, would come first
	// Global: 23,000 spent and 7,000 held; 1,000 more is refused by holds.
	e.mustReserve(other, "job_o2", 2_000)
	d := e.mustDeny(acct, "job_h", 1_000, budget.DeniedByGlobal)
	if !d.Held || d.RetryAfter != budget.HeldRetryAfter {
		t.Fatalf("global refusal by holds: %+v", d)
	}
}
