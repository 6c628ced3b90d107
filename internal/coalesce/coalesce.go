// Package coalesce makes one call for the concurrent callers of a key, the
// way a database groups commits: a caller that finds no call for its key
// under way makes one at once, alone; callers that come while one is under
// way wait for the next, made once for all of them. Group shares one call's
// result among callers asking the same thing (never a call begun before the
// caller came); Batch gathers the callers' inputs into one call that
// answers each.
package coalesce

import (
	"context"
	"sync"
)

// Group coalesces the calls of each key. The zero value is ready to use.
type Group[K comparable, R any] struct {
	mu    sync.Mutex
	slots map[K]*slot[R]
	calls int // calls made; under mu
}

type slot[R any] struct {
	running *call[R] // the call under way
	next    *call[R] // the call that starts when it ends; nil when none waits
}

type call[R any] struct {
	done chan struct{} // closed once res is set
	n    int           // the callers it answers; under Group.mu until it starts
	res  R
}

// Do returns the result of a call of fn for key made after Do was called,
// and how many callers that call answered (fn was told the same number).
// A caller whose ctx ends while it waits gets ctx's error; the call it
// waited for still answers the others. fn's context is ctx for a call made
// at once, else one without cancellation (the call is everyone's).
func (g *Group[K, R]) Do(ctx context.Context, key K, fn func(ctx context.Context, n int) R) (res R, n int, err error) {
	g.mu.Lock()
	if g.slots == nil {
		g.slots = map[K]*slot[R]{}
	}
	s := g.slots[key]
	if s == nil {
		s = &slot[R]{}
		g.slots[key] = s
	}
	if s.running == nil {
		c := &call[R]{done: make(chan struct{}), n: 1}
		s.running = c
		g.mu.Unlock()
		g.run(ctx, key, s, c, fn)
		return c.res, 1, nil
	}
	c, lead := s.next, s.next == nil
	if lead {
		c = &call[R]{done: make(chan struct{})}
		s.next = c
	}
	c.n++
	prev := s.running
	g.mu.Unlock()
	if lead {
		<-prev.done
		g.run(context.WithoutCancel(ctx), key, s, c, fn)
		return c.res, c.n, nil
	}
	select {
	case <-c.done:
		return c.res, c.n, nil
	case <-ctx.Done():
		var zero R
		return zero, 0, ctx.Err()
	}
}

// run makes call c, then hands the slot to the next call or frees it.
func (g *Group[K, R]) run(ctx context.Context, key K, s *slot[R], c *call[R], fn func(context.Context, int) R) {
	g.mu.Lock()
	n := c.n
	g.mu.Unlock()
	c.res = fn(ctx, n)
	g.mu.Lock()
	g.calls++
	s.running, s.next = s.next, nil
	if s.running == nil {
		delete(g.slots, key)
	}
	g.mu.Unlock()
	close(c.done)
}

// Calls returns how many calls the group has made.
func (g *Group[K, R]) Calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}
