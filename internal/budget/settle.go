package budget

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// settleScript turns one job's reservation in one day into its real cost,
// or just releases it, charging each job once per day.
var settleScript = script("", "reservations", "settle")

// Settle turns the job's reservation into the real cost: the hold is
// dropped and actual is added to the tenant's and the global spent (one
// script each, in one round trip), once per job and day, so a redelivered
// job, or a settle retried after a lost reply, can always settle.
// charge=false only releases. Call it after writing the job's ledger row.
// The global day is settled whether or not a global cap is set, but only
// while Redis holds it. A reservation that expired before Settle is still
// charged, once.
//
// When Redis has lost a day since Reserve, a Settle before the day is next
// touched finds no hash and adds nothing (the rebuild, reading the ledger
// after creating the new hash, counts the row); a Settle after that adds
// actual to the new hash, which the rebuild may have counted too. So Redis
// never understates a day's spend after a loss; it may overstate it by the
// jobs in flight at the rebuild: a tenant may be deferred a little early,
// never let past its budget.
func (b *Budgets) Settle(ctx context.Context, res *Reservation, actual money.Micros, charge bool) error {
	return b.settle(ctx, "Settle", res, actual, charge)
}

// Release drops the reservation without charging (the call failed or will
// be retried). Releasing twice, or after Settle, does nothing.
func (b *Budgets) Release(ctx context.Context, res *Reservation) error {
	return b.settle(ctx, "Release", res, 0, false)
}

func (b *Budgets) settle(ctx context.Context, op string, res *Reservation, actual money.Micros, charge bool) error {
	if res == nil {
		return fmt.Errorf("budget: %s: nil reservation", op)
	}
	if actual < 0 {
		return fmt.Errorf("budget: %s %s: negative cost %s", op, res.ID, actual)
	}
	if !charge {
		actual = 0
	}
	n, err := b.settleDays(ctx, res, actual, charge, true, true)
	if err != nil {
		return fmt.Errorf("budget: %s %s: %w", op, res.ID, err)
	}
	if n[0] == -1 {
		b.log.Debug("budget: settled a reservation of a day Redis lost", "tenant", res.TenantID,
			"reservation", res.ID, "day", res.Day)
	}
	return nil
}

// settleDays is onDays of the settle script (its outcomes in settle.lua).
func (b *Budgets) settleDays(ctx context.Context, res *Reservation, cost money.Micros, charge bool, tenant, global bool) ([]int64, error) {
	return b.onDays(ctx, settleScript, res, tenant, global, func(member string) []any {
		return []any{member, int64(cost), charge} // go-redis sends a bool as 1 or 0
	})
}

// onDays runs s on the reservation's tenant and global days (those asked
// for) in one round trip, with args of its member there; the tenant's first.
func (b *Budgets) onDays(ctx context.Context, s *redis.Script, res *Reservation, tenant, global bool, args func(member string) []any) ([]int64, error) {
	var calls []scripts.Call
	add := func(d dayRef) {
		calls = append(calls, scripts.Call{Script: s, Keys: b.dayKeys(d), Args: args(d.member(res.TenantID, res.ID))})
	}
	if tenant {
		add(dayRef{res.TenantID, res.Day})
	}
	if global {
		add(dayRef{"", res.GlobalDay})
	}
	return b.runInts(ctx, calls)
}

// runInts runs calls in one round trip: their integer replies, up to the first error.
func (b *Budgets) runInts(ctx context.Context, calls []scripts.Call) ([]int64, error) {
	out := make([]int64, 0, len(calls))
	for _, cmd := range b.scripts.RunAll(ctx, calls...) {
		n, err := cmd.Int64()
		if err != nil {
			return out, err
		}
		out = append(out, n)
	}
	return out, nil
}

// extendScript moves an open reservation's expiry in one day to now plus
// the reservation TTL.
var extendScript = script(redisclock.Lua, "extend")

// Extend keeps the reservation for another ReservationTTL from now, on its
// tenant's day and, when it is held there, the global day: a worker calls it
// while its job waits and calls, so only a holder that stopped loses it.
// held is false when the reservation is gone from its tenant's day (its
// room may have been taken). A global hold gone while the tenant's stays is
// logged, and the tenant's is kept.
func (b *Budgets) Extend(ctx context.Context, res *Reservation) (held bool, err error) {
	if res == nil {
		return false, fmt.Errorf("budget: Extend: nil reservation")
	}
	arg, ttl := redisclock.Arg(b.clock), b.resTTL.Microseconds()
	n, err := b.onDays(ctx, extendScript, res, true, res.Global, func(member string) []any { return []any{arg, member, ttl} })
	if err != nil {
		return false, fmt.Errorf("budget: Extend %s: %w", res.ID, err)
	}
	if len(n) > 1 && n[0] == 1 && n[1] == 0 {
		b.log.Warn("budget: a reservation's hold on the global day is gone", "tenant", res.TenantID,
			"reservation", res.ID, "global_day", res.GlobalDay)
	}
	return n[0] == 1, nil
}
