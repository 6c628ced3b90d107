package budget

import (
	"context"
	_ "embed" // the script's Lua
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// extendScript moves an open reservation's expiry in one day to now plus
// the reservation TTL.
//
//go:embed extend.lua
var extendLua string
var extendScript = redis.NewScript(redisclock.Lua + extendLua)

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
	calls := []scripts.Call{{Script: extendScript, Keys: b.tenantKeys(res.TenantID, res.Day), Args: []any{arg, res.ID, ttl}}}
	if res.Global {
		calls = append(calls, scripts.Call{Script: extendScript, Keys: b.globalKeys(res.GlobalDay),
			Args: []any{arg, globalMember(res.TenantID, res.ID), ttl}})
	}
	n := make([]int64, len(calls))
	for i, cmd := range b.scripts.RunAll(ctx, calls...) {
		if n[i], err = cmd.Int64(); err != nil {
			return false, fmt.Errorf("budget: Extend %s: %w", res.ID, err)
		}
	}
	if len(n) > 1 && n[0] == 1 && n[1] == 0 {
		b.log.Warn("budget: a reservation's hold on the global day is gone", "tenant", res.TenantID,
			"reservation", res.ID, "global_day", res.GlobalDay)
	}
	return n[0] == 1, nil
}
