package budget

import (
	"context"
	_ "embed" // the script's Lua
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/scripts"
)

// settleScript turns one job's reservation into its real cost, or just
// releases it, on the tenant's day and the global day, charging each job
// once (settle.lua).
//
//go:embed settle.lua
var settleLua string
var settleScript = redis.NewScript(reservationsLua + settleLua)

// Settle turns the job's reservation into the real cost: the hold is
// dropped and actual is added to the tenant's and the global spent, once
// per job and day: a job charged before (by this or any other call, from
// this reservation or one built from the job's ledger row) is not charged
// again, so a redelivered job, or a settle retried after a lost reply, can
// always settle. charge=false only releases. Call it after writing the
// job's ledger row, with the reservation's Day and GlobalDay on the row.
//
// A reservation that expired before Settle (its holder stopped extending
// it) is still charged, once. When Redis has lost the day since Reserve
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
// The marks cost one hash field per charged job (about 80 bytes) for as
// long as the day's keys live.
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
	flag := "0"
	if charge {
		flag = "1"
	}
	keys := b.keysFor(res.TenantID, res.Day, res.GlobalDay)
	v, err := b.scripts.Run(ctx, scripts.Call{Script: settleScript, Keys: keys,
		Args: []any{res.ID, globalMember(res.TenantID, res.ID), int64(actual), flag}}).Slice()
	if err != nil {
		return fmt.Errorf("budget: %s %s: %w", op, res.ID, err)
	}
	n, err := reply(v).ints(0, 1)
	if err != nil {
		return fmt.Errorf("budget: %s %s: %w", op, res.ID, err)
	}
	if n[0] == -1 || n[1] == -1 {
		b.log.Debug("budget: settled a reservation of a day Redis lost", "tenant", res.TenantID,
			"reservation", res.ID, "day", res.Day, "global_day", res.GlobalDay)
	}
	return nil
}
