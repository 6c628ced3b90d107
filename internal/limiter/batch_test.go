package limiter

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// gateHook holds the scripts run through a client at a gate until the test
// opens it, one script at a time.
type gateHook struct {
	closed  atomic.Bool
	entered chan string   // the script's first key, when it reaches the gate
	open    chan struct{} // lets one script through
}

func newGateHook() *gateHook {
	return &gateHook{entered: make(chan string, 16), open: make(chan struct{})}
}

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA only: an EVAL after NOSCRIPT is the same run.
		if cmd.Name() == "evalsha" && !g.closed.Load() {
			g.entered <- cmd.Args()[3].(string)
			<-g.open
		}
		return next(ctx, cmd)
	}
}

// waitQueued waits until n reservations of scope queue behind a run.
func waitQueued(t *testing.T, tb *TokenBucket, scope string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for tb.reserves.Queued(scope) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d reservations never queued", n)
		}
		runtime.Gosched()
	}
}

type reserveResult struct {
	r   *Result
	err error
}

func goReserve(ctx context.Context, tb *TokenBucket, s Scope, c Cost) chan reserveResult {
	ch := make(chan reserveResult, 1)
	go func() {
		r, err := tb.Reserve(ctx, s, c)
		ch <- reserveResult{r, err}
	}()
	return ch
}

// Reserves that arrive while a run is in flight go together in the next
// run, each decided alone, all or nothing, in arrival order.
func testBatchedReserves(t *testing.T, e *env) {
	rdb := e.newClient()
	gate := newGateHook()
	rdb.AddHook(gate)
	tb := must(NewTokenBucket(rdb, e.opts()))
	s := modelScope("batched", 0, 100, 10, 0, 0)
	ctx := context.Background()

	a := goReserve(ctx, tb, s, Cost{Requests: 1, Tokens: 4})
	<-gate.entered
	var queued []chan reserveResult
	for i, tokens := range []int64{5, 3, 1} {
		queued = append(queued, goReserve(ctx, tb, s, Cost{Requests: 1, Tokens: tokens}))
		waitQueued(t, tb, s.Name, i+1)
	}
	gate.open <- struct{}{}
	if r := <-a; r.err != nil || !r.r.Allowed {
		t.Fatalf("first: %+v", r)
	}
	<-gate.entered // the three together
	gate.closed.Store(true)
	gate.open <- struct{}{}
	var got []*Result
	for _, ch := range queued {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		got = append(got, r.r)
	}
	// 4 taken; 5 fits, 3 does not, 1 does.
	if !got[0].Allowed || got[1].Allowed || !got[2].Allowed {
		t.Fatalf("allowed = %v %v %v, want true false true", got[0].Allowed, got[1].Allowed, got[2].Allowed)
	}
	if !got[0].Time.Equal(got[2].Time) || bucket(t, got[1], "tpm").Remaining != 1 || bucket(t, got[1], "rpm").Remaining != 98 {
		t.Fatalf("the batch's decisions: %+v %+v %+v", got[0], got[1], got[2])
	}
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 0 || got["rpm"] != 97 {
		t.Fatalf("remaining = %v, want tpm 0, rpm 97", got)
	}
}

// A caller whose context ends while it waits still gets the answer of the
// run it joined: the run is everyone's, and what it reserved is the
// caller's to use or release.
func testBatchedReserveCancelled(t *testing.T, e *env) {
	rdb := e.newClient()
	gate := newGateHook()
	rdb.AddHook(gate)
	tb := must(NewTokenBucket(rdb, e.opts()))
	s := modelScope("cancelled", 0, 100, 0, 0, 0)
	one := Cost{Requests: 1}

	a := goReserve(context.Background(), tb, s, one)
	<-gate.entered
	ctx, cancel := context.WithCancel(context.Background())
	b := goReserve(ctx, tb, s, one)
	waitQueued(t, tb, s.Name, 1)
	cancel()
	gate.closed.Store(true)
	gate.open <- struct{}{}
	for _, ch := range []chan reserveResult{a, b} {
		if r := <-ch; r.err != nil || !r.r.Allowed {
			t.Fatalf("reserve: %+v", r)
		}
	}
	if got := remaining(mustState(t, tb, s)); got["rpm"] != 98 {
		t.Fatalf("remaining = %v, want 98: both admitted", got)
	}
}
