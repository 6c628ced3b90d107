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
// the reservation TTL (extend.lua).
//
//go:embed extend.lua
var extendLua string
var extendScript = redis.NewScript(redisclock.Lua + extendLua)

// Extend keeps the reservation for another ReservationTTL from now, on its
// tenant's day and, when it is held there, the global day. A worker calls
// it while the job waits for its rate-limit permit and its provider call,
// so that a reservation outlives the job however long the call takes, and
// only a holder that stopped (crashed) loses it: a lapsed reservation's
// room could go to another job while this one still spends. held is false
// when the reservation is gone from its tenant's day (settled, released,
// or expired before this call: its room may have been taken, so the job is
// no longer covered). A global hold gone while the tenant's stays (the
// global day lost and rebuilt) is logged, and the tenant's is kept.
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
