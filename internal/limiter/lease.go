package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrLeaseClosed is returned by Take after Close.
var ErrLeaseClosed = errors.New("limiter: lease is closed")

// LeaseOptions configure a Lease.
type LeaseOptions struct {
	// Size is the slice leased from Redis at a time; a Take larger than Size
	// leases what it needs. It is capped at the smallest capacity of each
	// unit. Defaults, per unit, to 1% of the smallest bucket of that unit (at
	// least 1).
	Size Cost
	// MaxAge is how long a slice is spent from before its unused part is
	// given back and a fresh one leased, so that a lease sees a penalty or a
	// limit change within MaxAge. Defaults to 1s.
	MaxAge time.Duration
}

// Lease is the token bucket's lease mode, for paths too hot for one round
// trip per call: the process leases a slice of its scope's buckets (one
// Reserve of Size), spends it locally, and gives back the unused part
// (Reconcile with what was spent) when the slice is too small for a Take, is
// older than MaxAge, or the lease is closed.
//
// Overshoot bound: Redis counts a slice as used when it is leased, not when
// it is spent, so the tokens spent in any window of length T are at most
// capacity + refill×T + U, where U is the total leased and still unspent, over
// all leases, at the window's start. With N leases (say one per process) and
// slices of at most S (Size, or one Take's cost when larger), U ≤ N×S. A
// single lease overshoots too, by its unspent part, once the bucket refilled
// while it held it. With Size equal to each Take's cost nothing stays
// unspent, and the bound is the token bucket's own: no overshoot. The same
// holds for penalties: a lease never becomes the probe and leases nothing
// while a scope is penalized, but it spends what it already holds, for at
// most MaxAge.
type Lease struct {
	tb     *TokenBucket
	scope  Scope
	size   Cost
	maxAge time.Duration

	// sem guards everything below; a channel so waiting honours ctx.
	sem    chan struct{}
	res    *Reservation // the current slice, nil when none
	left   Cost         // what is left of it
	spent  Cost         // what was spent of it
	since  time.Time
	limit  int64 // tightest bucket at the last lease
	remain int64
	closed bool
}

// validate reports, naming the field, a negative size or age.
func (o LeaseOptions) validate() error {
	switch {
	case o.MaxAge < 0:
		return fmt.Errorf("limiter: LeaseOptions.MaxAge must not be negative, got %v", o.MaxAge)
	case o.Size.Requests < 0 || o.Size.Tokens < 0:
		return fmt.Errorf("limiter: LeaseOptions.Size must not be negative, got %+v", o.Size)
	}
	return nil
}

// NewLease returns a lease on scope from tb, or an error naming a field of
// opts that is invalid; an invalid scope or size is reported by Take.
func NewLease(tb *TokenBucket, scope Scope, opts LeaseOptions) (*Lease, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = time.Second
	}
	l := &Lease{tb: tb, scope: scope, maxAge: opts.MaxAge, sem: make(chan struct{}, 1)}
	l.size.Requests = leaseSize(scope, UnitRequests, opts.Size.Requests)
	l.size.Tokens = leaseSize(scope, UnitTokens, opts.Size.Tokens)
	return l, nil
}

// leaseSize is the slice of unit u: want (or 1% of the smallest capacity),
// capped at the smallest capacity; 0 when no bucket counts u.
func leaseSize(s Scope, u Unit, want int64) int64 {
	var c int64
	for _, b := range s.Buckets {
		if b.Unit == u && b.Limit > 0 && (c == 0 || b.Limit < c) {
			c = b.Limit
		}
	}
	if want <= 0 {
		want = max(c/100, 1)
	}
	return min(want, c)
}

// Take spends cost from the local slice, leasing a new slice (one or two
// round trips) when the current one is too small or too old. It never waits
// for capacity: when Redis denies a new slice, the Result says so, with
// RetryAfter. A cost above a bucket's capacity fails at once with
// ErrCostExceedsCapacity. For a local take, Limit and Remaining are those of
// the tightest bucket at the last lease, and Time is zero.
func (l *Lease) Take(ctx context.Context, cost Cost) (*Result, error) {
	if err := l.scope.validate(cost); err != nil {
		return nil, err
	}
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-l.sem }()
	if l.closed {
		return nil, ErrLeaseClosed
	}
	if l.res != nil && l.now().Sub(l.since) < l.maxAge &&
		(l.size.Requests == 0 || l.left.Requests >= cost.Requests) &&
		(l.size.Tokens == 0 || l.left.Tokens >= cost.Tokens) {
		l.left.Requests -= cost.Requests
		l.left.Tokens -= cost.Tokens
		l.spent.Requests += cost.Requests
		l.spent.Tokens += cost.Tokens
		return &Result{Allowed: true, Limit: l.limit, Remaining: l.remain}, nil
	}
	if err := l.giveBack(ctx); err != nil {
		return nil, err
	}
	want := Cost{max(l.size.Requests, cost.Requests), max(l.size.Tokens, cost.Tokens)}
	res, err := l.tb.reserve(ctx, modeReserveLease, l.scope, want)
	if err == nil && !res.Allowed && !res.Penalized && want != cost {
		// Near the limit, a slice may not fit where this one cost does.
		want = cost
		res, err = l.tb.reserve(ctx, modeReserveLease, l.scope, want)
	}
	if err != nil || !res.Allowed {
		return res, err
	}
	l.res, l.since = res.Reservation, l.now()
	l.left = Cost{want.Requests - cost.Requests, want.Tokens - cost.Tokens}
	l.spent = cost
	l.limit, l.remain = res.Limit, res.Remaining
	res.Reservation = nil
	return res, nil
}

// Close gives back the unused part of the current slice. Take fails with
// ErrLeaseClosed afterwards; closing again does nothing.
func (l *Lease) Close(ctx context.Context) error {
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.sem }()
	l.closed = true
	return l.giveBack(ctx)
}

// giveBack reconciles the current slice with what was spent of it, once (so
// without a reconciled marker). On error the slice is dropped all the same:
// its unspent part then stays counted as used, which only costs capacity.
func (l *Lease) giveBack(ctx context.Context) error {
	r, spent := l.res, l.spent
	l.res, l.left, l.spent = nil, Cost{}, Cost{}
	if r == nil || spent == r.Cost {
		return nil
	}
	return l.tb.reconcile(ctx, r, spent, false)
}

func (l *Lease) now() time.Time {
	if l.tb.opts.Clock != nil {
		return l.tb.opts.Clock()
	}
	return time.Now()
}
