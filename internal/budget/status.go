package budget

import (
	"context"
	_ "embed" // the script's Lua
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/redisclock"
)

// statusScript reads a day without reserving.
//
//go:embed status.lua
var statusLua string
var statusScript = redis.NewScript(redisclock.Lua + reservationsLua + dayLua + statusLua)

// Status reports the tenant's day so far without reserving. Allowed says
// whether both caps still have room; when not, DeniedBy and RetryAfter say
// which and until when; Check says whether an amount would still fit.
//
// Concurrent calls for one account share a read, but never one that began
// before the call (coalesce.Group).
func (b *Budgets) Status(ctx context.Context, acct Account) (*Decision, error) {
	if err := acct.validate(); err != nil {
		return nil, err
	}
	r, _, err := b.statuses.Do(ctx, acct, func(ctx context.Context, _ int) statusRead {
		d, err := b.readStatus(ctx, acct)
		return statusRead{d, err}
	})
	if err != nil {
		return nil, err
	}
	if r.err != nil {
		return nil, r.err
	}
	d := *r.d // each caller its own copy
	return &d, nil
}

// statusRead is one read's answer, shared by the calls it answers.
type statusRead struct {
	d   *Decision
	err error
}

// readStatus is one read of the account's day, and of the global day
// under a global cap.
func (b *Budgets) readStatus(ctx context.Context, acct Account) (*Decision, error) {
	days := []onDay{{}}
	if acct.Global > 0 {
		days = append(days, onDay{global: true})
	}
	rs, sp, err := b.eval(ctx, statusScript, acct, days...)
	if err != nil {
		return nil, fmt.Errorf("budget: Status of tenant %s: %w", acct.TenantID, err)
	}
	// now, spent, reserved
	t, err := rs[0].ints(1, 2, 3)
	if err != nil {
		return nil, fmt.Errorf("budget: Status of tenant %s: %w", acct.TenantID, err)
	}
	g := []int64{0, 0, 0}
	if len(rs) > 1 {
		if g, err = rs[1].ints(1, 2, 3); err != nil {
			return nil, fmt.Errorf("budget: Status of tenant %s: %w", acct.TenantID, err)
		}
	}
	d := b.decision(acct, sp, time.UnixMicro(t[0]), money.Micros(t[1]), money.Micros(t[2]), money.Micros(g[1]), money.Micros(g[2]))
	tfull := !acct.Unlimited && d.Spent+d.Reserved >= acct.Budget
	gfull := acct.Global > 0 && d.GlobalSpent+d.GlobalReserved >= acct.Global
	d.Allowed = !tfull && !gfull
	if !d.Allowed {
		tspent := !acct.Unlimited && d.Spent >= acct.Budget
		gspent := acct.Global > 0 && d.GlobalSpent >= acct.Global
		d.deny(tfull, gfull, 0, !tspent && !gspent)
	}
	return d, nil
}
