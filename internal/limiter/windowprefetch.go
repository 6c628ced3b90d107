package limiter

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"
)

// ErrPrefetchClosed is returned by Take after Close.
var ErrPrefetchClosed = errors.New("limiter: prefetch is closed")

// PrefetchOptions configure a WindowPrefetch.
type PrefetchOptions struct {
	// Size is the slice counted at a time, within 1 and the set's smallest
	// limit.
	Size int64
	// MaxAge is how long a slice is spent from before a fresh one is
	// counted, so a limit change reaches it within MaxAge. Defaults to 1s.
	MaxAge time.Duration
}

// WindowPrefetch counts a window set ahead, for paths too hot for a round
// trip per call: a slice of Size in every window at once, spent in process,
// its unspent part given back when the slice is too small for a Take, older
// than MaxAge, or the prefetch is closed.
type WindowPrefetch struct {
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
	view   []BucketState // the windows as the last slice saw them
	closed bool
}

// Prefetch returns a prefetch of set; an invalid set is reported by Take.
func (w *Windows) Prefetch(set WindowSet, opts PrefetchOptions) *WindowPrefetch {
	size := opts.Size
	for _, nw := range set.Windows {
		size = min(size, nw.Limit)
	}
	return &WindowPrefetch{w: w, set: set, size: max(size, 1), maxAge: cmp.Or(opts.MaxAge, time.Second),
		sem: make(chan struct{}, 1)}
}

// Set returns the set the prefetch takes from.
func (l *WindowPrefetch) Set() WindowSet { return l.set }

// Take spends cost from the local slice, counting a new one when the
// current one is too small or too old. It never waits: when Redis denies a
// new slice, the Result says so. A local take's Buckets are the windows as
// the last slice saw them plus what is left of it, and its Time is zero.
func (l *WindowPrefetch) Take(ctx context.Context, cost int64) (*Result, error) {
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
		return nil, ErrPrefetchClosed
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

// result is the windows as the last slice saw them, with what is left of it.
func (l *WindowPrefetch) result(at time.Time) *Result {
	bs := slices.Clone(l.view)
	for i := range bs {
		bs[i].Remaining += l.left
	}
	r := &Result{Allowed: true, Buckets: bs, Time: at}
	r.fill()
	return r
}

// Close gives back the unspent part of the current slice; Take fails with
// ErrPrefetchClosed afterwards.
func (l *WindowPrefetch) Close(ctx context.Context) error {
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.sem }()
	l.closed = true
	return l.giveBack(ctx)
}

// giveBack gives back what is unspent of the current slice, once; on error
// it stays counted until its windows pass.
func (l *WindowPrefetch) giveBack(ctx context.Context) error {
	t, spent := l.cur, l.spent
	l.cur, l.left, l.spent = nil, 0, 0
	if t == nil {
		return nil
	}
	return l.w.giveBack(ctx, t, spent)
}

func (l *WindowPrefetch) now() time.Time {
	if l.w.opts.Clock != nil {
		return l.w.opts.Clock()
	}
	return time.Now()
}
