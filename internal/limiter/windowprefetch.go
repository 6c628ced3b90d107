package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrLeaseClosed is returned by Take after Close.
var ErrLeaseClosed = errors.New("limiter: lease is closed")

// WindowLeaseOptions configure a WindowLease.
type WindowLeaseOptions struct {
	// Size is the slice leased at a time; a Take larger than Size leases
	// what it needs. It is capped at the set's smallest limit. Defaults to
	// 1% of that limit (at least 1).
	Size int64
	// MaxAge is how long a slice is spent from before its unspent part is
	// given back and a fresh one leased, so that a limit change reaches a
	// lease within MaxAge. Defaults to 1s.
	MaxAge time.Duration
}

// WindowLease is lease mode for a WindowSet, for paths too hot for a round
// trip per call (a dispatcher's busiest API keys): it counts a slice of
// Size in every window at once (one Allow), spends it in process, and gives
// back the unspent part when the slice is too small for a Take, older than
// MaxAge, or the lease is closed.
//
// Overshoot bound: a slice is counted when leased, not when spent, so what
// is spent in any window is at most what the set's algorithm admits in it
// plus U, what all leases of the set held leased and unspent when the
// window began: U ≤ N×S for N leases (say one per process) of slices of at
// most S. With Size 1 nothing is ever unspent and nothing overshoots. Given
// back, the unspent part counts no more in the windows it was counted in
// (those that have not ended), so leases cost no capacity once closed.
type WindowLease struct {
	w      *Windows
	set    WindowSet
	size   int64
	maxAge time.Duration

	// sem guards everything below; a channel so waiting honours ctx.
	sem    chan struct{}
	cur    *taken // the current slice, nil when none
	left   int64  // what is left of it
	spent  int64  // what was spent of it
	since  time.Time
	view   []BucketState // the windows as the last lease saw them, the slice counted
	closed bool
}

// validate reports, naming the field, a negative size or age.
func (o WindowLeaseOptions) validate() error {
	switch {
	case o.MaxAge < 0:
		return fmt.Errorf("limiter: WindowLeaseOptions.MaxAge must not be negative, got %v", o.MaxAge)
	case o.Size < 0:
		return fmt.Errorf("limiter: WindowLeaseOptions.Size must not be negative, got %d", o.Size)
	}
	return nil
}

// NewLease returns a lease on set, or an error naming a field of opts that
// is invalid; an invalid set is reported by Take.
func (w *Windows) NewLease(set WindowSet, opts WindowLeaseOptions) (*WindowLease, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = time.Second
	}
	var smallest int64
	for _, nw := range set.Windows {
		if nw.Limit > 0 && (smallest == 0 || nw.Limit < smallest) {
			smallest = nw.Limit
		}
	}
	if opts.Size == 0 {
		opts.Size = max(smallest/100, 1)
	}
	return &WindowLease{w: w, set: set, size: max(min(opts.Size, smallest), 1), maxAge: opts.MaxAge,
		sem: make(chan struct{}, 1)}, nil
}

// Set returns the set the lease takes from.
func (l *WindowLease) Set() WindowSet { return l.set }

// Take spends cost from the local slice, leasing a new one (one or two round
// trips, and one more to give back the old one's unspent part) when the
// current one is too small or too old. It never waits: when Redis denies a
// new slice, the Result says so, with RetryAfter. For a local take,
// Result.Buckets are the windows as the last lease saw them, plus what is
// left of the slice, and Time is zero.
func (l *WindowLease) Take(ctx context.Context, cost int64) (*Result, error) {
	if err := l.set.validate(cost); err != nil {
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
	if l.cur != nil && l.now().Sub(l.since) < l.maxAge && l.left >= cost {
		l.left -= cost
		l.spent += cost
		return l.result(time.Time{}), nil
	}
	if err := l.giveBack(ctx); err != nil {
		return nil, err
	}
	want := max(l.size, cost)
	res, t, err := l.w.take(ctx, l.set, want, true)
	if err == nil && !res.Allowed && !res.Penalized && want != cost {
		// Near the limit, a slice may not fit where this one cost does.
		want = cost
		res, t, err = l.w.take(ctx, l.set, want, true)
	}
	if err != nil || !res.Allowed {
		return res, err
	}
	l.cur, l.since = t, l.now()
	l.left, l.spent = want-cost, cost
	l.view = res.Buckets
	return l.result(res.Time), nil
}

// result is the windows as the last lease saw them, with what is left of
// the slice, which this process may still spend.
func (l *WindowLease) result(at time.Time) *Result {
	bs := slices.Clone(l.view)
	for i := range bs {
		bs[i].Remaining += l.left
	}
	r := &Result{Allowed: true, Buckets: bs, Time: at}
	r.fill()
	return r
}

// Close gives back the unspent part of the current slice. Take fails with
// ErrLeaseClosed afterwards; closing again does nothing.
func (l *WindowLease) Close(ctx context.Context) error {
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.sem }()
	l.closed = true
	return l.giveBack(ctx)
}

// giveBack gives back what is unspent of the current slice, once. On error
// the slice is dropped all the same: its unspent part then stays counted,
// which only costs capacity until its windows pass.
func (l *WindowLease) giveBack(ctx context.Context) error {
	t, spent := l.cur, l.spent
	l.cur, l.left, l.spent = nil, 0, 0
	if t == nil {
		return nil
	}
	return l.w.giveBack(ctx, t, spent)
}

func (l *WindowLease) now() time.Time {
	if l.w.opts.Clock != nil {
		return l.w.opts.Clock()
	}
	return time.Now()
}
