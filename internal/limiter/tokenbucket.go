package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/coalesce"
	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// TokenBucket is the weighted token bucket over the buckets of a scope at
// once, in one hash per scope. What a bucket used may exceed Limit (debt)
// after a Reconcile took more than was reserved. Limits are passed on every
// call: lowering one below what was used puts the bucket in debt, as a
// provider counts what it served whatever the limit.
type TokenBucket struct {
	rdb      redis.Scripter
	opts     Options
	scripts  *scripts.Runner // the settles, in shared pipelines
	reserves coalesce.Batch[string, *call, *Result]
}

// NewTokenBucket returns a TokenBucket over rdb.
func NewTokenBucket(rdb scripts.Client, opts Options) (*TokenBucket, error) {
	tb := &TokenBucket{rdb: rdb, opts: opts.withDefaults(), scripts: scripts.New(rdb)}
	tb.reserves.Max, tb.reserves.Fn = maxBatch, tb.runReserves
	return tb, nil
}

// Reservation is what an allowed Reserve took.
type Reservation struct {
	ID    string
	Scope Scope
	Cost  Cost
	// Probe marks the single call admitted after a penalty; every other
	// caller is denied until it is settled, released or times out.
	Probe bool

	gen int64   // the in-flight generation the reservation is held in; -1 when not held
	lag []int64 // per bucket, what it had taken a moment before (see lagDelay)
	pos []int64 // per bucket, what it had taken just before this reservation
}

// inflightGen is the length of one in-flight generation. A bucket holds back
// from refill and refunds what the current and the previous generation
// reserved and did not settle yet: the provider charges a call a little
// after the reservation and refunds a little before the settle, and its
// bucket, if full then, loses refill this one would get. Two generations
// (one to two lengths) must exceed those delays; longer calls stop being
// held back, and a reservation never settled (a crashed worker) lapses.
const inflightGen = 5 * time.Second

// Reserve status codes and modes of reserveScript (see luaConstants).
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

var reserveScript = bucketScript("reserve.lua")

// Reserve takes cost from every bucket of scope, or from none: allowed only
// when every bucket covers it and the scope is not penalized. Concurrent
// Reserves of one scope in one process share a script run (batch.go).
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
			Remaining: x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2]), Burst: x[5], Taken: x[4],
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
		res.RetryAfter = time.Duration(float64(res.RetryAfter) * (0.75 + 0.5*rand.Float64()))
	}
	if !res.Allowed && a[2] == 1 {
		// The holds lapse after seconds, but a reconcile may free them at
		// any moment: check again soon, and not in lockstep.
		res.HeldInFlight = true
		res.RetryAfter = min(res.RetryAfter, time.Duration(float64(holdRetry)*(0.75+0.5*rand.Float64())))
	}
	return res
}

var penalizeScript = redis.NewScript(redisclock.Lua + stateLua + lua("penalize.lua"))

// Penalize blocks scope for every caller until Redis's now plus d (a
// duration: limiter time is Redis's, never the caller's clock), never
// shortening a penalty in force. Then the first Reserve is the probe
// (Reservation.Probe), alone; a new Penalize cancels a probe in flight.
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
	args := []any{redisclock.Arg(tb.opts.Clock), d.Microseconds(), tb.opts.ProbeTimeout.Microseconds()}
	if err := penalizeScript.Run(ctx, tb.rdb, []string{tb.opts.Keys.LimiterScope(scope.Name)}, args...).Err(); err != nil {
		return fmt.Errorf("limiter: penalize scope %q: %w", scope.Name, err)
	}
	return nil
}

// Wait reserves cost, sleeping each RetryAfter (plus up to waitJitter)
// until admitted. When ctx's deadline comes before the admission RetryAfter
// promises, it returns at once, with the last Result and an error wrapping
// context.DeadlineExceeded.
func (tb *TokenBucket) Wait(ctx context.Context, scope Scope, cost Cost) (*Result, error) {
	for {
		res, err := tb.Reserve(ctx, scope, cost)
		if err != nil || res.Allowed {
			return res, err
		}
		if dl, ok := ctx.Deadline(); ok && !res.probeWait && !res.HeldInFlight && time.Until(dl) < res.RetryAfter {
			return res, fmt.Errorf("limiter: scope %q admits this cost in %v, after the context's deadline: %w",
				scope.Name, res.RetryAfter, context.DeadlineExceeded)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(res.RetryAfter + time.Duration(rand.Float64()*float64(waitJitter))):
		}
	}
}
