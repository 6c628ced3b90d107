// Package redisbatch sends the Redis commands of independent steps of one
// request in one round trip. Run runs the steps concurrently (the first in
// the caller, the others in goroutines kept between Runs), each with a
// context that marks them as one batch; the hook Attach adds to the client they use holds each step's first command until
// every step has sent one or returned, then sends the commands held as one
// pipeline. What a step sends after that (a script loaded after NOSCRIPT, a
// second call) goes on its own, as without a batch. The steps' code stays
// as it is: they need not know they were batched, except code that waits
// for another goroutine's round trip (a read shared by concurrent callers),
// which calls Leave first so that the others' commands do not wait for it.
package redisbatch

import (
	"cmp"
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxHold bounds how long a step's command waits for the others: a step
// stuck on something other than Redis does not hold the rest past it.
const maxHold = 20 * time.Millisecond

type ctxKey struct{}

// batch is the state of one Run.
type batch struct {
	rdb redis.UniversalClient // the client of the first command held

	mu      sync.Mutex
	steps   int // steps that have neither sent a command nor returned
	held    []*held
	flushed bool
}

type held struct {
	ctx  context.Context
	cmd  redis.Cmder
	next redis.ProcessHook // the rest of the client's hooks
	done chan struct{}
}

// Run calls every step concurrently, each with a context whose first Redis
// command (on a client Attach was given) is sent in one pipeline with the
// others', and returns when all have returned. One step runs in the calling
// goroutine; no steps, nothing.
func Run(ctx context.Context, steps ...func(ctx context.Context)) {
	if len(steps) == 0 {
		return
	}
	if len(steps) == 1 {
		steps[0](ctx)
		return
	}
	b := &batch{steps: len(steps)}
	var wg sync.WaitGroup
	wg.Add(len(steps) - 1)
	for _, step := range steps[1:] {
		st := &stepState{b: b}
		goStep(func() {
			defer wg.Done()
			defer b.stepDone(st)
			step(context.WithValue(ctx, ctxKey{}, st))
		})
	}
	st := &stepState{b: b}
	func() {
		defer b.stepDone(st)
		steps[0](context.WithValue(ctx, ctxKey{}, st))
	}()
	wg.Wait()
}

// Steps other than the first run in goroutines kept from earlier Runs: a
// new goroutine's stack grows, copied each time, as its step goes down
// go-redis's call chain, and a kept one has grown already. An idle one ends
// after stepIdle, so a quiet process keeps none; at most maxIdleSteps wait.
const (
	stepIdle     = 200 * time.Millisecond
	maxIdleSteps = 64
)

// stepRunner is a kept goroutine; it takes its next step from next.
type stepRunner struct{ next chan func() }

var idleSteps struct {
	mu      sync.Mutex
	runners []*stepRunner // the most recently idle last
	after   time.Duration // how long a runner idles before it ends; stepIdle unless a test lengthens it
}

// goStep runs f in an idle kept goroutine, or else in a new one.
func goStep(f func()) {
	idleSteps.mu.Lock()
	if n := len(idleSteps.runners); n > 0 {
		r := idleSteps.runners[n-1]
		idleSteps.runners = idleSteps.runners[:n-1]
		idleSteps.mu.Unlock()
		r.next <- f // buffered: the runner takes it when it is ready
		return
	}
	idleSteps.mu.Unlock()
	go runSteps(&stepRunner{next: make(chan func(), 1)}, f)
}

// runSteps runs f, then the steps handed to r, until r idles for stepIdle.
// The most recently idle runner is taken first, so the others idle out
// when fewer are needed.
func runSteps(r *stepRunner, f func()) {
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	for {
		f()
		idleSteps.mu.Lock()
		if len(idleSteps.runners) >= maxIdleSteps {
			idleSteps.mu.Unlock()
			return
		}
		idleSteps.runners = append(idleSteps.runners, r)
		after := cmp.Or(idleSteps.after, stepIdle)
		idleSteps.mu.Unlock()
		idle.Reset(after)
		select {
		case f = <-r.next:
			idle.Stop()
		case <-idle.C:
			idleSteps.mu.Lock()
			if i := slices.Index(idleSteps.runners, r); i >= 0 {
				idleSteps.runners = slices.Delete(idleSteps.runners, i, i+1)
				idleSteps.mu.Unlock()
				return
			}
			idleSteps.mu.Unlock()
			// taken as the timer fired: its step is on the way
			f = <-r.next
		}
	}
}

// stepState is one step of a batch, the value of its context.
type stepState struct {
	b       *batch
	counted bool // it sent its first command, left, or returned; under b.mu
}

// Leave tells the Run of ctx, if any, that the calling step sends no first
// command now (it waits for another goroutine's round trip, say): the
// other steps' commands go without waiting for it, and its own go on their
// own.
func Leave(ctx context.Context) {
	if st, ok := ctx.Value(ctxKey{}).(*stepState); ok {
		st.b.stepDone(st)
	}
}

// stepDone counts a step that returned or left, once; it may complete the
// batch, which this goroutine then sends.
func (b *batch) stepDone(st *stepState) {
	b.mu.Lock()
	var send []*held
	if !b.flushed && !st.counted {
		st.counted = true
		b.steps--
		send = b.completeLocked()
	}
	b.mu.Unlock()
	b.send(send)
}

// completeLocked takes what is held once every step has sent a command or
// returned; the caller sends it, outside the lock.
func (b *batch) completeLocked() []*held {
	if b.steps > 0 || len(b.held) == 0 {
		return nil
	}
	return b.takeLocked()
}

func (b *batch) takeLocked() []*held {
	b.flushed = true
	held := b.held
	b.held = nil
	return held
}

func (b *batch) send(held []*held) {
	if len(held) == 0 {
		return
	}
	if len(held) == 1 {
		h := held[0]
		// The hooks return a command's error; the client sets it on the
		// command only at the top of its chain, above this hook.
		if err := h.next(h.ctx, h.cmd); err != nil {
			h.cmd.SetErr(err)
		}
		close(h.done)
		return
	}
	// Each command's own context is cancelled when its step gives up;
	// the pipeline runs under the first one's, as they share a request.
	_, _ = b.rdb.Pipelined(held[0].ctx, func(p redis.Pipeliner) error {
		for _, h := range held {
			_ = p.Process(h.ctx, h.cmd)
		}
		return nil
	})
	for _, h := range held {
		close(h.done)
	}
}

// hold queues cmd to be sent with the others' first commands, and reports
// false when the batch has been sent already (cmd goes on its own). When cmd
// completes the batch, this goroutine sends it before hold returns.
func (b *batch) hold(ctx context.Context, st *stepState, rdb redis.UniversalClient, cmd redis.Cmder, next redis.ProcessHook) (*held, bool) {
	b.mu.Lock()
	if b.flushed || st.counted || (b.rdb != nil && b.rdb != rdb) {
		b.mu.Unlock()
		return nil, false
	}
	b.rdb = rdb
	h := &held{ctx: context.WithoutCancel(ctx), cmd: cmd, next: next, done: make(chan struct{})}
	b.held = append(b.held, h)
	st.counted = true
	b.steps--
	send := b.completeLocked()
	b.mu.Unlock()
	b.send(send)
	return h, true
}

// expire sends what is held when a step waited maxHold for the others.
func (b *batch) expire() {
	b.mu.Lock()
	var send []*held
	if !b.flushed && len(b.held) > 0 {
		send = b.takeLocked()
	}
	b.mu.Unlock()
	b.send(send)
}

// Attach adds to rdb the hook that holds the commands of a Run's steps for
// their pipeline; commands outside a Run pass through it untouched. A
// client attached already is left as it is.
func Attach(rdb redis.UniversalClient) {
	if _, dup := attached.LoadOrStore(rdb, true); !dup {
		rdb.AddHook(hook{rdb: rdb})
	}
}

// attached holds the clients Attach hooked. It keeps a closed client's
// entry: a process makes a handful of clients.
var attached sync.Map

type hook struct{ rdb redis.UniversalClient }

func (hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (k hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		st, ok := ctx.Value(ctxKey{}).(*stepState)
		if !ok {
			return next(ctx, cmd)
		}
		b := st.b
		h, ok := b.hold(ctx, st, k.rdb, cmd, next)
		if !ok {
			return next(ctx, cmd)
		}
		t := time.NewTimer(maxHold)
		defer t.Stop()
		select {
		case <-h.done:
		case <-t.C:
			b.expire()
			<-h.done
		}
		return cmd.Err()
	}
}

func (hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
