package coalesce

import (
	"context"
	"slices"
	"sync"
)

// Batch gathers the inputs of concurrent callers of a key into one call:
// callers that come while a call is under way queue, and when it ends the
// oldest of them makes the next, for all the inputs queued by then (at
// most Max). No caller waits for a timer.
//
// The zero value, with Fn set, is ready to use. Fn gets the inputs in the
// order their callers came and returns one result and one error per input
// (errs may be nil when all succeeded). Its context carries no
// cancellation (the call is everyone's): it must bound its own time.
type Batch[K comparable, P, R any] struct {
	Fn  func(ctx context.Context, key K, ps []P) ([]R, []error)
	Max int // most inputs one call takes; 0 or less for no bound

	mu    sync.Mutex
	lanes map[K]*lane[P, R]
	calls int // calls made; under mu
}

type lane[P, R any] struct {
	queue []*entry[P, R]
	busy  bool // a caller is making the key's call
}

type entry[P, R any] struct {
	p    P
	res  R
	err  error
	done bool          // res and err are set
	wake chan struct{} // done, or this caller makes the next call
}

// Do returns the result of Fn for p, in a call shared with the callers of
// key that came while another call was under way.
func (b *Batch[K, P, R]) Do(ctx context.Context, key K, p P) (R, error) {
	e := &entry[P, R]{p: p, wake: make(chan struct{}, 1)}
	b.mu.Lock()
	if b.lanes == nil {
		b.lanes = map[K]*lane[P, R]{}
	}
	l := b.lanes[key]
	if l == nil {
		l = &lane[P, R]{}
		b.lanes[key] = l
	}
	l.queue = append(l.queue, e)
	lead := !l.busy
	l.busy = true
	b.mu.Unlock()
	if !lead {
		<-e.wake
		if e.done {
			return e.res, e.err
		}
	}
	b.mu.Lock()
	b.calls++
	n := len(l.queue)
	if b.Max > 0 {
		n = min(n, b.Max)
	}
	group := slices.Clone(l.queue[:n])
	l.queue = l.queue[n:]
	b.mu.Unlock()

	ps := make([]P, n)
	for i, g := range group {
		ps[i] = g.p
	}
	res, errs := b.Fn(context.WithoutCancel(ctx), key, ps)

	b.mu.Lock()
	for i, g := range group {
		if i < len(res) {
			g.res = res[i]
		}
		if i < len(errs) {
			g.err = errs[i]
		}
		g.done = true
		if g != e {
			g.wake <- struct{}{}
		}
	}
	if len(l.queue) > 0 {
		l.queue[0].wake <- struct{}{} // not done: it makes the next call
	} else {
		delete(b.lanes, key)
	}
	b.mu.Unlock()
	return e.res, e.err
}

// Calls returns how many calls the batch has made.
func (b *Batch[K, P, R]) Calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

// Queued returns how many inputs wait for key's next call.
func (b *Batch[K, P, R]) Queued(key K) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.lanes[key]; l != nil {
		return len(l.queue)
	}
	return 0
}
