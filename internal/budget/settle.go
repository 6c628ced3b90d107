package budget

import (
	"context"
	_ "embed" // the script's Lua
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/scripts"
)

// settleScript turns one job's reservation in one day into its real cost,
// or just releases it, charging each job once per day (settle.lua).
//
//go:embed settle.lua
var settleLua string
var settleScript = redis.NewScript(reservationsLua + settleLua)

// Settle turns the job's reservation into the real cost: the hold is
// dropped and actual is added to the tenant's and the global spent (one
// script each, in one round trip), once per job and day: a job charged
// before (by this or any other call, from this reservation or one built
// from the job's ledger row) is not charged again, so a redelivered job,
// or a settle retried after a lost reply, can always settle. charge=false
// only releases. Call it after writing the job's ledger row, with the
// reservation's Day and GlobalDay on the row.
//
// The global day is settled whether or not a global cap is set, but only
// while Redis holds it: a day that never had a cap is never created, and
// one that had a cap earlier keeps counting, so a cap set again finds the
// day's spend whole (a day Redis lacks is rebuilt from the ledger).
//
// A reservation that expired before Settle (its holder stopped extending
// it) is still charged, once. When Redis has lost a day since Reserve
// (restart, FLUSHALL), the charge is counted as follows:
//
//   - Settle before the day is next touched finds no day hash and adds
//     nothing: its ledger row was written before, so the rebuild, which reads
//     the ledger only after creating the new hash, counts it.
//   - Settle after that adds actual to the new hash (once, marked c:<id>).
//     If its ledger row was written before the rebuild read the ledger, the
//     rebuild counted it too, and the day's spend is overstated by that job.
//     So is it when the job settles again after a loss that found it
//     settled: the marks of the lost hash are gone.
//
// So Redis never understates a day's spend after a loss; it may overstate it
// by the cost of the jobs whose ledger write and Settle straddle the ledger
// read (at most the jobs in flight then), which errs on the safe side: a
// tenant may be deferred a little early, never let past its budget. Closing
// it entirely would need the ledger to say which jobs its sum includes.
//
// The marks cost one hash field per charged job and day (about 80 bytes)
// for as long as the day's keys live.
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
	n, err := b.settleDays(ctx, res, actual, charge, "", true, true)
	if err != nil {
		return fmt.Errorf("budget: %s %s: %w", op, res.ID, err)
	}
	if n[0] == -1 {
		b.log.Debug("budget: settled a reservation of a day Redis lost", "tenant", res.TenantID,
			"reservation", res.ID, "day", res.Day)
	}
	return nil
}

// release drops the reservation from the tenant's day, the global day, or
// both, without charging.
func (b *Budgets) release(ctx context.Context, res *Reservation, tenant, global bool) error {
	_, err := b.settleDays(ctx, res, 0, false, "", tenant, global)
	return err
}

// settleDays runs the settle script on the reservation's tenant day and
// global day (those asked for), in one round trip, and returns each day's
// outcome (settle.lua), the tenant's first. written is the ledger row's
// time for an audit, else "".
func (b *Budgets) settleDays(ctx context.Context, res *Reservation, cost money.Micros, charge bool, written string, tenant, global bool) ([]int64, error) {
	flag := "0"
	if charge {
		flag = "1"
	}
	args := func(member string) []any {
		a := []any{member, int64(cost), flag}
		if written != "" {
			a = append(a, written)
		}
		return a
	}
	var calls []scripts.Call
	if tenant {
		calls = append(calls, scripts.Call{Script: settleScript, Keys: b.tenantKeys(res.TenantID, res.Day), Args: args(res.ID)})
	}
	if global {
		calls = append(calls, scripts.Call{Script: settleScript, Keys: b.globalKeys(res.GlobalDay),
			Args: args(globalMember(res.TenantID, res.ID))})
	}
	out := make([]int64, len(calls))
	for i, cmd := range b.scripts.RunAll(ctx, calls...) {
		n, err := cmd.Int64()
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}
