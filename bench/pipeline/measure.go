package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/cost"
)

// finishLine counts tasks whose handler returned nil and notes when the
// last expected one did. Counting in the handler's middleware costs an
// atomic add, where polling the store for a count would put load on the
// very database being measured, and it marks the end within microseconds.
type finishLine struct {
	target int64
	n      atomic.Int64
	// busy sums the time handlers ran, successful or not: divided by the
	// elapsed time it is how many ran at once on average, which tells
	// whether the worker's concurrency was used.
	busy atomic.Int64
	done chan struct{}
	at   time.Time // written once, before done is closed
}

func newFinishLine(target int) *finishLine {
	return &finishLine{target: int64(target), done: make(chan struct{})}
}

func (f *finishLine) arrive() {
	if f.n.Add(1) == f.target {
		f.at = time.Now()
		close(f.done)
	}
}

// wait returns when every expected task has finished, or fails after
// timeout saying how many did.
func (f *finishLine) wait(ctx context.Context, timeout time.Duration) error {
	if f.target == 0 {
		return nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("only %d of %d tasks finished within %v", f.n.Load(), f.target, timeout)
	}
}

// finishes is the middleware that feeds the current finish line. Runs are
// measured one after another, each with its own line; every task of one
// finishes before the next line is set.
type finishes struct{ cur atomic.Pointer[finishLine] }

func (fs *finishes) start(target int) *finishLine {
	f := newFinishLine(target)
	fs.cur.Store(f)
	return f
}

func (fs *finishes) middleware(h asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		t0 := time.Now()
		err := h.ProcessTask(ctx, t)
		if f := fs.cur.Load(); f != nil {
			f.busy.Add(int64(time.Since(t0)))
			if err == nil {
				f.arrive()
			}
		}
		return err
	})
}

// produce calls do(i) for i in [0, n) from producers goroutines; the first
// error stops the others and is returned.
func produce(ctx context.Context, n, producers int, do func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range min(producers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := do(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// newRedis returns a client of database db of the server at rawURL, with
// its round trips counted (a pipeline counts once), and the URL of that
// database.
func newRedis(ctx context.Context, rawURL string, db int) (*redis.Client, string, *cost.RoundTrips, error) {
	c, dbURL, err := benchenv.Redis(ctx, rawURL, db)
	if err != nil {
		return nil, "", nil, err
	}
	return c, dbURL, cost.CountRoundTrips(c), nil
}

// measurement is one pipeline's run of n jobs.
type measurement struct {
	jobs    int
	elapsed time.Duration // first enqueue or POST to the last handler return (bare) or the last job seen succeeded
	busy    time.Duration // handlers' running time, summed
	usage
	// post are the POST /v1/jobs round trips and postSpan the time from
	// the first POST sent to the last answer read; none for bare asynq.
	post     latencies
	postSpan time.Duration
	gets     int64 // the client's polls
}

func (m *measurement) rate() float64 { return float64(m.jobs) / m.elapsed.Seconds() }

func (m *measurement) perJob(v float64) float64 { return v / float64(m.jobs) }

// usage is what a measurement reports per job besides time.
type usage struct {
	redisRT int64  // Redis round trips of the pipeline's client
	mallocs uint64 // heap allocations of the whole process
	cpu     cost.CPU
}

// meter reads a pipeline's usage.
type meter struct {
	rt  *cost.RoundTrips
	cpu *cost.CPUReader
}

func (mt *meter) read(ctx context.Context) usage {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return usage{redisRT: mt.rt.N(), mallocs: ms.Mallocs, cpu: mt.cpu.Read(ctx)}
}

// since is the usage from u to now.
func (mt *meter) since(ctx context.Context, u usage) usage {
	now := mt.read(ctx)
	return usage{redisRT: now.redisRT - u.redisRT, mallocs: now.mallocs - u.mallocs, cpu: now.cpu.Sub(u.cpu)}
}

// latencies are request durations, one per request, in no order.
type latencies []time.Duration

// percentile returns the nearest-rank q-quantile (0 < q <= 1) of sorted l.
func (l latencies) percentile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(l)))) - 1
	return l[max(0, min(i, len(l)-1))]
}

func (l latencies) sorted() latencies {
	s := slices.Clone(l)
	slices.Sort(s)
	return s
}
