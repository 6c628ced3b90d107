package budget

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
)

// settleScript turns one reservation into its real cost (or just releases
// it), on the tenant's day and on the global day.
//
// KEYS[1..4] -> as in luaDay, for the reservation's days
// ARGV[1] -> reservation id; ARGV[2] -> its global member (<tenant>:<id>)
// ARGV[3] -> real cost (µ$); ARGV[4] -> "1" to charge it, "0" to release only
// ARGV[5] -> tenant hash generation at Reserve; ARGV[6] -> global's
// Returns {tenant outcome, global outcome}, each
//
//	-1: the day hash is gone: nothing added (the ledger has the charge and
//	    the rebuild counts it)
//	 0: nothing to do (settled or released before)
//	 1: settled an open reservation
//	 2: settled a reservation that had expired unsettled
//	 3: charged a reservation of a lost incarnation of the hash (made before
//	    Redis lost the day), once: s:<id> marks it
var settleScript = redis.NewScript(`
local function int(n) return string.format("%d", n) end
local charge = ARGV[4] == "1"
local function settle(h, z, m, gen)
  local f = redis.call("HMGET", h, "gen", "r:" .. m, "x:" .. m, "s:" .. m)
  if not f[1] then return -1 end
  if f[2] then
    redis.call("ZREM", z, m)
    redis.call("HDEL", h, "r:" .. m)
    redis.call("HINCRBY", h, "reserved", int(-tonumber(f[2])))
    if charge then redis.call("HINCRBY", h, "spent", ARGV[3]) end
    return 1
  end
  if f[3] then
    redis.call("HDEL", h, "x:" .. m)
    if charge then redis.call("HINCRBY", h, "spent", ARGV[3]) end
    return 2
  end
  if charge and f[1] ~= gen and not f[4] then
    redis.call("HINCRBY", h, "spent", ARGV[3])
    redis.call("HSET", h, "s:" .. m, "1")
    return 3
  end
  return 0
end
return {settle(KEYS[1], KEYS[2], ARGV[1], ARGV[5]), settle(KEYS[3], KEYS[4], ARGV[2], ARGV[6])}
`)

// Settle turns the reservation into the real cost: the hold is dropped and
// actual is added to the tenant's and the global spent. charge=false (the
// ledger row already existed: the job was charged before) only releases.
// Settle is idempotent: settling a reservation twice charges once. Call it
// after writing the job's ledger row, with the reservation's Day and
// GlobalDay on the row.
//
// A reservation that expired before Settle (a provider call longer than
// ReservationTTL) is still charged, once. When Redis has lost the day since
// Reserve (restart, FLUSHALL), the charge is counted exactly as follows:
//
//   - Settle before the day is next touched finds no day hash and adds
//     nothing: its ledger row was written before, so the rebuild, which reads
//     the ledger only after creating the new hash, counts it.
//   - Settle after that adds actual to the new hash (once, marked s:<id>).
//     If its ledger row was written before the rebuild read the ledger, the
//     rebuild counted it too, and the day's spend is overstated by that job.
//
// So Redis never understates a day's spend after a loss; it may overstate it
// by the cost of the jobs whose ledger write and Settle straddle the ledger
// read (at most the jobs in flight then), which errs on the safe side: a
// tenant may be deferred a little early, never let past its budget. Closing
// it entirely would need the ledger to say which jobs its sum includes.
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
	v, err := settleScript.Run(ctx, b.rdb, keys, res.ID, globalMember(res.TenantID, res.ID),
		int64(actual), flag, res.tenantGen, res.globalGen).Slice()
	if err != nil {
		return fmt.Errorf("budget: %s %s: %w", op, res.ID, err)
	}
	n, err := reply(v).ints(0, 1)
	if err != nil {
		return fmt.Errorf("budget: %s %s: %w", op, res.ID, err)
	}
	if n[0] == -1 || n[0] == 3 {
		b.log.Debug("budget: settled a reservation of a day Redis lost", "tenant", res.TenantID,
			"reservation", res.ID, "day", res.Day, "outcome", n[0])
	}
	return nil
}
