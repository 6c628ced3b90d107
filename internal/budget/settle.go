package budget

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
)

// settleScript turns one job's reservation into its real cost (or just
// releases it), on the tenant's day and on the global day, charging each job
// once: c:<id> marks a job whose cost spent counts. The global day marks a
// job (c:<tenant>:<id>) only when the tenant's day hash was gone.
//
// KEYS[1..4] -> as in luaDay, for the reservation's days
// ARGV[1] -> job id; ARGV[2] -> its global member (<tenant>:<id>)
// ARGV[3] -> real cost (µ$); ARGV[4] -> "1" to charge it, "0" to release only
// Returns {tenant outcome, global outcome}, each
//
//	-1: the day hash is gone: nothing added (the ledger has the charge and
//	    the rebuild counts it)
//	 0: nothing charged (a release, or the job was charged before)
//	 1: charged
var settleScript = redis.NewScript(`
local function int(n) return string.format("%d", n) end
local id, member = ARGV[1], ARGV[2]
local function drop(h, z, m)
  local a = redis.call("HGET", h, "r:" .. m)
  if a then
    redis.call("HDEL", h, "r:" .. m)
    redis.call("HINCRBY", h, "reserved", int(-tonumber(a)))
  end
  redis.call("ZREM", z, m)
end
drop(KEYS[1], KEYS[2], id)
drop(KEYS[3], KEYS[4], member)
local th, gh = redis.call("EXISTS", KEYS[1]) == 1, redis.call("EXISTS", KEYS[3]) == 1
local tout, gout = -1, -1
if th then tout = 0 end
if gh then gout = 0 end
if ARGV[4] ~= "1" then return {tout, gout} end
if (th and redis.call("HEXISTS", KEYS[1], "c:" .. id) == 1) or
   (gh and redis.call("HEXISTS", KEYS[3], "c:" .. member) == 1) then
  return {tout, gout}
end
if th then
  redis.call("HINCRBY", KEYS[1], "spent", ARGV[3])
  redis.call("HSET", KEYS[1], "c:" .. id, "1")
  tout = 1
end
if gh then
  redis.call("HINCRBY", KEYS[3], "spent", ARGV[3])
  if not th then redis.call("HSET", KEYS[3], "c:" .. member, "1") end
  gout = 1
end
return {tout, gout}
`)

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
	v, err := settleScript.Run(ctx, b.rdb, keys, res.ID, globalMember(res.TenantID, res.ID), int64(actual), flag).Slice()
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
