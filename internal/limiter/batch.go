package limiter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/redisclock"
)

// maxBatch bounds the reservations of one script run, so that one run never
// blocks Redis for long.
const maxBatch = 64

// call is one reservation waiting for, or in, a script run.
type call struct {
	mode  string
	scope Scope
	cost  Cost
	id    string
	res   *Result
	err   error
	done  chan struct{} // closed when res and err are set; nil for a batch's first caller
	state atomic.Int32  // callWaiting, callDelivered or callAbandoned
}

const (
	callWaiting = iota
	callDelivered
	callAbandoned
)

// batcher queues the reservations of one scope while a run is in flight.
type batcher struct {
	key     string // the scope's hash
	mu      sync.Mutex
	queue   []*call
	running bool
}

func (tb *TokenBucket) reserve(ctx context.Context, mode string, scope Scope, cost Cost) (*Result, error) {
	if err := scope.validate(cost); err != nil {
		return nil, err
	}
	c := &call{mode: mode, scope: scope, cost: cost}
	if mode != modeState {
		c.id = newID()
	}
	bv, ok := tb.batchers.Load(scope.Name)
	if !ok {
		bv, _ = tb.batchers.LoadOrStore(scope.Name, &batcher{key: tb.opts.Keys.LimiterScope(scope.Name)})
	}
	b := bv.(*batcher)

	b.mu.Lock()
	if !b.running {
		// Nothing in flight: run now, alone (so on ctx, which concerns no
		// other caller), and hand what queued meanwhile to a flusher.
		b.running = true
		b.mu.Unlock()
		tb.run(ctx, b.key, []*call{c})
		b.mu.Lock()
		if len(b.queue) > 0 {
			go tb.flush(ctx, b)
		} else {
			b.running = false
		}
		b.mu.Unlock()
		return c.res, c.err
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	b.mu.Unlock()

	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	if i := slices.Index(b.queue, c); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
		b.mu.Unlock()
		return nil, ctx.Err()
	}
	b.mu.Unlock()
	if c.state.CompareAndSwap(callWaiting, callAbandoned) {
		return nil, ctx.Err()
	}
	<-c.done // delivered just now
	return c.res, c.err
}

// flush runs the queued reservations of b, a batch at a time, until none is
// left; it releases what it reserved for callers that stopped waiting.
func (tb *TokenBucket) flush(ctx context.Context, b *batcher) {
	ctx = context.WithoutCancel(ctx)
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()

		tb.run(ctx, b.key, batch)
		for _, c := range batch {
			if c.state.CompareAndSwap(callWaiting, callDelivered) {
				close(c.done)
			} else if c.err == nil && c.res.Reservation != nil {
				// Best effort: on failure the tokens stay counted as used,
				// which only costs capacity until they refill.
				_ = tb.Release(ctx, c.res.Reservation)
			}
		}
	}
}

// run decides a batch of reservations of one scope in one script run, and
// sets each call's res or err.
func (tb *TokenBucket) run(ctx context.Context, key string, batch []*call) {
	// The batch's distinct bucket lists go once; usually there is one.
	var lists [][]Bucket
	list := make([]int, len(batch))
	size := 4
	for i, c := range batch {
		list[i] = slices.IndexFunc(lists, func(l []Bucket) bool { return slices.Equal(l, c.scope.Buckets) })
		if list[i] < 0 {
			list[i] = len(lists)
			lists = append(lists, c.scope.Buckets)
			size += 1 + 4*len(c.scope.Buckets)
		}
		size += 3 + len(c.scope.Buckets)
	}
	args := make([]any, 0, size)
	args = append(args, redisclock.Arg(tb.opts.Clock), tb.probeTimeout, tb.probeRetry, len(lists))
	for _, l := range lists {
		args = append(args, len(l))
		for _, b := range l {
			args = append(args, b.Name, b.Limit, b.Period.Microseconds(), b.Burst.Microseconds())
		}
	}
	for i, c := range batch {
		args = append(args, list[i]+1, c.mode, c.id)
		for _, b := range c.scope.Buckets {
			args = append(args, c.cost.Of(b.Unit))
		}
	}
	v, err := reserveScript.Run(ctx, tb.rdb, []string{key}, args...).Result()
	var a []int64
	if err == nil {
		a, err = ints(v, 1) // each call's part is checked below
	}
	if err != nil {
		for _, c := range batch {
			c.err = fmt.Errorf("limiter: reserve on scope %q: %w", c.scope.Name, err)
		}
		return
	}
	now, a := time.UnixMicro(a[0]), a[1:]
	for _, c := range batch {
		n := 3 + 6*len(c.scope.Buckets)
		if len(a) < n {
			c.err = fmt.Errorf("limiter: reserve on scope %q: short script reply", c.scope.Name)
			continue
		}
		c.res = tb.result(c, now, a[:n])
		a = a[n:]
	}
}
