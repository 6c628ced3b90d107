package limiter

import (
	"context"
	_ "embed" // the scripts' Lua
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/coalesce"
	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// TokenBucket is the distributed, weighted token bucket over several buckets
// at once. One hash per scope (rkeys.LimiterScope) holds, per bucket, the
// tokens used and the time they were last counted, plus the penalty and the
// probe. A bucket refills continuously at Limit/Period: the used amount
// decays linearly and is never negative; it may exceed Limit (debt) after a
// Reconcile took more than was reserved.
//
// Limits are passed on every call, so they may change at any time. The used
// amount is kept as it is when they do: raising a limit frees capacity at
// once, lowering it below what was used puts the bucket in debt, repaid at
// the new rate. This matches what a provider does, which counts the tokens it
// served, whatever the limit.
//
// The hash expires once every bucket would be full again, no reservation is
// held in flight and no penalty or probe is pending (plus one second), so an
// idle scope leaves nothing behind. A call only knows the buckets it names,
// and a scope's bucket list may change (learned limits), so a call extends
// the expiry and never shortens it: after a refund the hash may outlive its
// usage by up to its longest bucket's period.
type TokenBucket struct {
	rdb  redis.Scripter
	opts Options
	// scripts runs the settles, those of concurrent calls in one pipeline.
	scripts *scripts.Runner
	// probeTimeout, probeRetry and reconcileTTL as script arguments.
	probeTimeout, probeRetry, reconcileTTL string
	// reserves groups the reservations of a scope (batch.go).
	reserves coalesce.Batch[string, *call, *Result]
}

// NewTokenBucket returns a TokenBucket over rdb (any redis.UniversalClient
// fits), or an error naming a field of opts that is invalid.
func NewTokenBucket(rdb scripts.Client, opts Options) (*TokenBucket, error) {
	o := opts.withDefaults()
	tb := &TokenBucket{
		rdb:          rdb,
		opts:         o,
		scripts:      scripts.New(rdb),
		probeTimeout: strconv.FormatInt(o.ProbeTimeout.Microseconds(), 10),
		probeRetry:   strconv.FormatInt(o.ProbeRetry.Microseconds(), 10),
		reconcileTTL: strconv.FormatInt(max(o.ReconcileTTL.Milliseconds(), 1), 10),
	}
	tb.reserves.Max, tb.reserves.Fn = maxBatch, tb.runReserves
	return tb, nil
}

// Reservation is what an allowed Reserve took. Pass it to Reconcile (the call
// happened, with its real usage) or Release (it did not, or failed).
type Reservation struct {
	ID    string
	Scope Scope
	Cost  Cost
	// Probe marks the single call admitted after a penalty. Until it is
	// reconciled, released or times out, every other caller is denied.
	Probe bool

	gen int64   // the in-flight generation the reservation is held in; -1 when not held
	lag []int64 // per bucket, what it had taken a moment before (see lagDelay)
	pos []int64 // per bucket, what it had taken just before this reservation
}

// inflightGen is the length of one in-flight generation. A bucket holds back,
// from refill and refunds, what was reserved in the current and the previous
// generation and is not yet reconciled ("in flight"), so it never runs ahead
// of the provider's bucket:
//
// The provider charges a call when it arrives, a little after the
// reservation here, and refunds its unused tokens when it completes, a
// little before the reconcile here. If its bucket is full at those moments
// it loses the refill or the refund that this bucket, which charged earlier
// or refunds later, still gets. Both gaps only involve calls reserved and
// not yet reconciled within the last moments, so with this floor on the
// tokens used the provider's bucket always holds at least as much as this
// one: a permit here is a call the provider admits, provided reservations
// cover what the provider counts and llmq is the account's only user.
//
// Two generations cover between one and two lengths, which must exceed the
// delay between a reservation and the call's arrival, and between the call's
// completion and its reconcile. Calls in flight longer stop being held back,
// so slow calls do not hold capacity, and a reservation never reconciled (a
// crashed worker) lapses within two lengths.
const inflightGen = 5 * time.Second

// Reserve status codes and modes of reserveScript (STATUS_* and MODE_* in
// its Lua, see luaConstants).
const (
	statusDenied        = 0
	statusAllowed       = 1
	statusProbe         = 2
	statusPenalty       = 3
	statusProbeWait     = 4
	modeReserve         = "r"
	modeReserveHold     = "h"
	modeReservePrefetch = "l"
	modeState           = "s"
)

// reserveScript decides, in order, a batch of reservations on one scope:
// for each, it checks every bucket, the penalty and the probe, and takes
// the cost from all buckets or from none, as if each ran alone at the same
// instant (reserve.lua). Buckets refill at their learned rate (see
// bucketLua); the scope's state is as stateLua lists.
//
//go:embed reserve.lua
var reserveLua string
var reserveScript = bucketScript(reserveLua)

// Reserve takes cost from every bucket of scope, or from none: allowed only
// when every bucket can cover it and the scope is not penalized. A cost above
// a bucket's capacity fails at once with ErrCostExceedsCapacity. When
// allowed, pass Result.Reservation to Reconcile or Release after the call.
//
// Concurrent Reserves of one scope in one process share a script run and a
// round trip: the first caller runs at once, and callers arriving meanwhile
// go together in the next run, each decided alone, in arrival order. A caller
// whose context ends while it waits returns at once; what a shared run
// reserved for it is released.
func (tb *TokenBucket) Reserve(ctx context.Context, scope Scope, cost Cost) (*Result, error) {
	mode := modeReserve
	if tb.opts.HoldInFlight {
		mode = modeReserveHold
	}
	return tb.reserve(ctx, mode, scope, cost)
}

// State returns the levels of scope's buckets without taking anything:
// Allowed tells whether a zero cost would pass now (no penalty, no debt).
func (tb *TokenBucket) State(ctx context.Context, scope Scope) (*Result, error) {
	return tb.reserve(ctx, modeState, scope, Cost{})
}

// result reads one reservation's part of reserveScript's reply.
func (tb *TokenBucket) result(c *call, now time.Time, a []int64) *Result {
	status := a[0]
	res := &Result{
		Allowed:    status == statusAllowed || status == statusProbe,
		Penalized:  status == statusPenalty || status == statusProbeWait,
		RetryAfter: us(a[1]),
		Time:       now,
		Buckets:    make([]BucketState, len(c.scope.Buckets)),
	}
	lag, pos := make([]int64, len(c.scope.Buckets)), make([]int64, len(c.scope.Buckets))
	for i, b := range c.scope.Buckets {
		x := a[3+6*i:]
		lag[i], pos[i] = x[3], x[4]
		res.Buckets[i] = BucketState{
			Name: b.Name, Unit: b.Unit, Limit: b.Limit,
			Remaining: x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2]), Burst: x[5],
		}
	}
	res.fill()
	switch {
	case res.Allowed:
		res.RetryAfter = 0
		if c.mode != modeState {
			res.Reservation = &Reservation{ID: c.id, Scope: c.scope, Cost: c.cost, Probe: status == statusProbe, gen: -1, lag: lag, pos: pos}
			if c.mode == modeReserveHold {
				res.Reservation.gen = now.UnixMicro() / inflightGen.Microseconds()
			}
		}
	case status == statusProbeWait:
		// Callers denied together while a probe is in flight spread out.
		res.probeWait = true
		res.RetryAfter = time.Duration(float64(res.RetryAfter) * (0.75 + 0.5*tb.opts.Rand()))
	}
	if !res.Allowed && a[2] == 1 {
		// The holds lapse after seconds, but a reconcile may free them at
		// any moment: check again soon, and not in lockstep.
		res.HeldInFlight = true
		res.RetryAfter = min(res.RetryAfter, time.Duration(float64(tb.opts.HoldRetry)*(0.75+0.5*tb.opts.Rand())))
	}
	return res
}

// penalizeScript blocks a scope until now + d, never shortening a penalty
// in force, and cancels a probe in flight so that a new one follows
// (penalize.lua).
//
//go:embed penalize.lua
var penalizeLua string
var penalizeScript = redis.NewScript(redisclock.Lua + stateLua + penalizeLua)

// Penalize blocks scope for every caller in every process until Redis's now
// plus d, after a provider's 429. It takes a duration, not the wall-clock
// time the provider announced, because limiter time is Redis TIME, never the
// caller's clock: pass the provider's retry-after (or reset) as d. A shorter
// penalty never shortens a longer one in force. When the penalty ends, the
// first Reserve is admitted alone as the probe (Reservation.Probe); the rest
// are denied until the probe is reconciled, released or times out. A new
// Penalize while a probe is in flight blocks again and cancels that probe.
func (tb *TokenBucket) Penalize(ctx context.Context, scope Scope, d time.Duration) error {
	if err := scope.validate(Cost{}); err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("limiter: Penalize of scope %q: negative duration %v", scope.Name, d)
	}
	if d < time.Microsecond {
		return nil
	}
	args := []any{redisclock.Arg(tb.opts.Clock), d.Microseconds(), tb.probeTimeout}
	if err := penalizeScript.Run(ctx, tb.rdb, []string{tb.opts.Keys.LimiterScope(scope.Name)}, args...).Err(); err != nil {
		return fmt.Errorf("limiter: penalize scope %q: %w", scope.Name, err)
	}
	return nil
}

// Wait reserves cost, sleeping each returned RetryAfter (plus up to
// Options.Jitter) until it is admitted; it never polls on a fixed tick. It
// ends with the context: when ctx is done it returns ctx.Err(), and when
// ctx's deadline comes before the admission RetryAfter promises, it returns
// at once, with the last Result (its RetryAfter tells how long remains) and
// an error wrapping context.DeadlineExceeded. A cost above a bucket's
// capacity fails at once with ErrCostExceedsCapacity. Wait sleeps real time:
// with an injected Clock it advances only as that clock does.
func (tb *TokenBucket) Wait(ctx context.Context, scope Scope, cost Cost) (*Result, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		res, err := tb.Reserve(ctx, scope, cost)
		if err != nil || res.Allowed {
			return res, err
		}
		if dl, ok := ctx.Deadline(); ok && !res.probeWait && !res.HeldInFlight && time.Until(dl) < res.RetryAfter {
			return res, fmt.Errorf("limiter: scope %q admits this cost in %v, after the context's deadline: %w",
				scope.Name, res.RetryAfter, context.DeadlineExceeded)
		}
		d := res.RetryAfter + time.Duration(tb.opts.Rand()*float64(tb.opts.Jitter))
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-timer.C:
		}
	}
}
