package budget

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/redisbatch"
)

// statusScript reads a day without reserving (dropping expired
// reservations, and starting a rebuild when Redis lost the day).
//
// KEYS and ARGV[1..7] -> as in luaDay
// Returns {"wrongday", now}, {"rebuild", tenant token, global token} as
// reserveScript, else {"ok", now, spent, reserved, global spent, global reserved}.
var statusScript = redis.NewScript(luaDay + `
local t = redis.call("HMGET", KEYS[1], "spent", "reserved")
local g = redis.call("HMGET", KEYS[3], "spent", "reserved")
return {"ok", int(now), t[1], t[2], g[1], g[2]}
`)

// Status reports the tenant's day so far (GET /v1/usage, the dashboard):
// spent, reserved, remaining, the soft limit and when the day resets,
// without reserving. Allowed says whether both caps still have room; when
// not, DeniedBy and RetryAfter say which and until when; Check says whether
// an amount would still fit.
//
// Concurrent calls for one account share a read (every API response
// carries the budget's status, and a busy tenant's requests come many at
// once), but never one that began before the call: what a call returns
// was read after it was made, as if it had read alone.
func (b *Budgets) Status(ctx context.Context, acct Account) (*Decision, error) {
	if err := acct.validate(); err != nil {
		return nil, err
	}
	return b.statuses.do(ctx, acct, b.readStatus)
}

// readStatus is one read of the account's day.
func (b *Budgets) readStatus(ctx context.Context, acct Account) (*Decision, error) {
	r, sp, err := b.eval(ctx, statusScript, acct, nil)
	if err != nil {
		return nil, fmt.Errorf("budget: Status of tenant %s: %w", acct.TenantID, err)
	}
	n, err := r.ints(1, 2, 3, 4, 5)
	if err != nil {
		return nil, fmt.Errorf("budget: Status of tenant %s: %w", acct.TenantID, err)
	}
	now := time.UnixMicro(n[0])
	d := b.decision(acct, sp, now, money.Micros(n[1]), money.Micros(n[2]), money.Micros(n[3]), money.Micros(n[4]))
	tfull := !acct.Unlimited && d.Spent+d.Reserved >= acct.Budget
	gfull := acct.Global > 0 && d.GlobalSpent+d.GlobalReserved >= acct.Global
	d.Allowed = !tfull && !gfull
	if !d.Allowed {
		d.deny(tfull, gfull, 0)
	}
	return d, nil
}

// statusReads coalesces the Status calls of each account: while one read
// is under way, the calls that come meanwhile wait for the next read, which
// starts when it ends and answers them all.
type statusReads struct {
	mu    sync.Mutex
	slots map[Account]*statusSlot
	reads int // reads made, for tests; under mu
}

type statusSlot struct {
	running *statusRead // the read under way
	next    *statusRead // the read that starts when it ends; nil when none waits
}

type statusRead struct {
	done    chan struct{} // closed once d and err are set
	d       *Decision
	err     error
	callers int // the calls it answers; under statusReads.mu
}

func (g *statusReads) do(ctx context.Context, acct Account, read func(context.Context, Account) (*Decision, error)) (*Decision, error) {
	g.mu.Lock()
	if g.slots == nil {
		g.slots = map[Account]*statusSlot{}
	}
	s := g.slots[acct]
	if s == nil {
		s = &statusSlot{}
		g.slots[acct] = s
	}
	if s.running == nil {
		// Nothing under way: read now, alone, on ctx (it concerns no other
		// caller).
		r := &statusRead{done: make(chan struct{})}
		s.running = r
		g.mu.Unlock()
		g.run(ctx, acct, s, r, read)
		return r.result()
	}
	r, lead := s.next, s.next == nil
	if lead {
		r = &statusRead{done: make(chan struct{})}
		s.next = r
	}
	r.callers++
	prev := s.running
	g.mu.Unlock()
	// This call waits for another's read: the commands sent with it in one
	// round trip (redisbatch) must not wait for this one.
	redisbatch.Leave(ctx)
	if lead {
		// The read under way began before this call: the next one is this
		// call's to make, for every call that joins it meanwhile, so it is
		// not cut short by this call's cancellation.
		<-prev.done
		g.run(context.WithoutCancel(ctx), acct, s, r, read)
		return r.result()
	}
	select {
	case <-r.done:
		return r.result()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run makes read r, then hands the slot to the next read (whose leader
// waits for r to end) or frees it.
func (g *statusReads) run(ctx context.Context, acct Account, s *statusSlot, r *statusRead, read func(context.Context, Account) (*Decision, error)) {
	r.d, r.err = read(ctx, acct)
	g.mu.Lock()
	g.reads++
	s.running, s.next = s.next, nil
	if s.running == nil {
		delete(g.slots, acct)
	}
	g.mu.Unlock()
	close(r.done)
}

// result is the read's answer, a copy of its Decision for each caller.
func (r *statusRead) result() (*Decision, error) {
	if r.err != nil {
		return nil, r.err
	}
	d := *r.d
	return &d, nil
}
