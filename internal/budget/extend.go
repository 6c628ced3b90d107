package budget

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// extendScript keeps an open reservation from expiring: its expiry moves to
// now + the reservation TTL, on the tenant's day and on the global day.
//
// KEYS[1..4] -> as in luaDay, for the reservation's days
// ARGV[1] -> now in Unix µs, or "" to read Redis TIME
// ARGV[2] -> reservation id; ARGV[3] -> its global member (<tenant>:<id>)
// ARGV[4] -> reservation TTL in µs
// Returns 1 if the reservation is still held (and now expires later), 0 if
// it is not (settled, released, expired, or its day lost).
var extendScript = redis.NewScript(redisclock.Lua + `
if redis.call("HEXISTS", KEYS[1], "r:" .. ARGV[2]) == 0 then return 0 end
local exp = string.format("%d", now + tonumber(ARGV[4]))
redis.call("ZADD", KEYS[2], "XX", exp, ARGV[2])
redis.call("ZADD", KEYS[4], "XX", exp, ARGV[3])
return 1
`)

// Extend keeps the reservation for another ReservationTTL from now. A worker
// calls it while the job waits for its rate-limit permit and its provider
// call, so that a reservation outlives the job however long the call takes,
// and only a holder that stopped (crashed) loses it: a lapsed reservation's
// room could go to another job while this one still spends. held is false
// when the reservation is gone (settled, released, or expired before this
// call: its room may have been taken, so the job is no longer covered).
func (b *Budgets) Extend(ctx context.Context, res *Reservation) (held bool, err error) {
	if res == nil {
		return false, fmt.Errorf("budget: Extend: nil reservation")
	}
	arg := redisclock.Arg(b.clock)
	keys := b.keysFor(res.TenantID, res.Day, res.GlobalDay)
	n, err := extendScript.Run(ctx, b.rdb, keys, arg, res.ID, globalMember(res.TenantID, res.ID), b.resTTL.Microseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("budget: Extend %s: %w", res.ID, err)
	}
	return n == 1, nil
}
