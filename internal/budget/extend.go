package budget

import (
	"context"
	_ "embed" // the script's Lua
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// extendScript moves an open reservation's expiry to now plus the
// reservation TTL, on both days (extend.lua).
//
//go:embed extend.lua
var extendLua string
var extendScript = redis.NewScript(redisclock.Lua + extendLua)

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
