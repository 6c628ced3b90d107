package queue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// gate counts a client's round trips and can hold the first one whose
// commands contain a given string until it is opened.
type gate struct {
	trips atomic.Int64
	mu    sync.Mutex
	match string        // hold the next round trip whose commands contain this
	held  chan struct{} // closed when it is held
	open  chan struct{} // closed to let it go
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.pass([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.pass(cmds)
		return next(ctx, cmds)
	}
}

func (g *gate) pass(cmds []redis.Cmder) {
	switch cmds[0].Name() {
	case "hello", "select", "client":
		// a new connection's set-up, not a command of the code under test
	default:
		g.trips.Add(1)
	}
	g.mu.Lock()
	match, held, open := g.match, g.held, g.open
	if match != "" && strings.Contains(fmt.Sprint(cmds), match) {
		g.match = ""
	} else {
		match = ""
	}
	g.mu.Unlock()
	if match != "" {
		close(held)
		<-open
	}
}

// arm holds the next round trip whose commands contain s.
func (g *gate) arm(s string) (held, open chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.match, g.held, g.open = s, make(chan struct{}), make(chan struct{})
	return g.held, g.open
}

// The fair queue's writes of many jobs share round trips: pushes of one
// scope made while another is under way go in one script run, and the
// scope is listed in the same round trip; a release enqueues all the tasks
// it took in one round trip; forgets, like pushes, go together.
func TestFairQueueGroupsItsRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb := testutil.Redis(t, redisDB)
	g := &gate{}
	rdb.AddHook(g)
	ac := asynq.NewClientFromRedisClient(rdb)
	ns := Namespace(testutil.Prefix(t))
	keys := rkeys.New(string(ns))
	rawIn := asynq.NewInspectorFromRedisClient(rdb)
	in := NewInspector(rawIn, ns)
	t.Cleanup(func() {
		for _, q := range ns.Queues() {
			_ = rawIn.DeleteQueue(q, true)
		}
		for _, k := range rdb.Keys(context.Background(), keys.Prefix()+":*").Val() {
			rdb.Del(context.Background(), k)
		}
	})
	c := NewClient(ac, ClientOptions{Namespace: ns, Redis: rdb, Keys: keys})
	ref := func(i int) JobRef {
		return JobRef{ID: fmt.Sprintf("job_g%d", i), Priority: Default, Scope: scope, TenantID: "t", Cost: 5}
	}

	// One push, its script loaded: one round trip, the scope listed.
	if _, err := c.EnqueueJob(ctx, ref(0)); err != nil {
		t.Fatal(err)
	}
	before := g.trips.Load()
	if ok, err := c.EnqueueJob(ctx, ref(1)); !ok || err != nil {
		t.Fatalf("push: %v, %v", ok, err)
	}
	if n := g.trips.Load() - before; n != 1 {
		t.Fatalf("a push took %d round trips, want 1", n)
	}
	if scopes, _ := c.Scopes(ctx); len(scopes) != 1 || scopes[0] != scope {
		t.Fatalf("scopes after a push: %v", scopes)
	}

	// Pushes made while one is under way go together in the next.
	const n = 30
	held, open := g.arm(fairPushScript.Hash())
	var wg sync.WaitGroup
	wg.Go(func() {
		if ok, err := c.EnqueueJob(ctx, ref(2)); !ok || err != nil {
			t.Errorf("push 2: %v, %v", ok, err)
		}
	})
	<-held
	calls := c.fair.pushes.Calls()
	for i := 3; i < 3+n; i++ {
		wg.Go(func() {
			if ok, err := c.EnqueueJob(ctx, ref(i)); !ok || err != nil {
				t.Errorf("push %d: %v, %v", i, ok, err)
			}
		})
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return c.fair.pushes.Queued(scope) == n })
	close(open)
	wg.Wait()
	if got := c.fair.pushes.Calls() - calls; got != 1 {
		t.Fatalf("%d pushes queued behind one took %d script runs, want 1", n, got)
	}
	// A job pushed again is not added twice.
	if ok, err := c.EnqueueJob(ctx, ref(5)); ok || err != nil {
		t.Fatalf("second push of a job: %v, %v", ok, err)
	}

	// A release enqueues the task of every job it took.
	rel, empty, err := c.Release(ctx, scope, unlimited)
	if err != nil || !empty || len(rel) != n+3 {
		t.Fatalf("release: %d jobs, empty=%v, %v", len(rel), empty, err)
	}
	for _, r := range rel {
		if st, err := in.JobTaskState(ctx, r.ID); err != nil || st != TaskPending {
			t.Fatalf("released %s: task %s, %v", r.ID, st, err)
		}
	}

	// Forgets made while one is under way go together; the released jobs
	// stop counting as released.
	held, open = g.arm(fairForgetScript.Hash())
	wg.Go(func() {
		if err := c.Started(ctx, scope, rel[0].ID); err != nil {
			t.Error(err)
		}
	})
	<-held
	calls = c.fair.forgets.Calls()
	for _, r := range rel[1:] {
		wg.Go(func() {
			if err := c.Started(ctx, scope, r.ID); err != nil {
				t.Error(err)
			}
		})
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return c.fair.forgets.Queued(scope) == len(rel)-1 })
	close(open)
	wg.Wait()
	if got := c.fair.forgets.Calls() - calls; got != 1 {
		t.Fatalf("%d forgets queued behind one took %d script runs, want 1", len(rel)-1, got)
	}
	if out := rdb.ZCard(ctx, keys.FairOut(scope)).Val(); out != 0 {
		t.Fatalf("%d jobs still released after every one started", out)
	}
	if sum := rdb.HGet(ctx, keys.FairState(scope), "outsum").Val(); sum != "0" {
		t.Fatalf("released tokens after every job started: %q", sum)
	}
}

// A server that has lost its scripts (a restart) still gets the job and
// lists the scope. (A server of its own: flushing the shared one's scripts
// would change what other tests count.)
func TestFairPushWithoutTheScriptLoaded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb := testutil.StartRedis(t).Client()
	ac := asynq.NewClientFromRedisClient(rdb)
	c := NewClient(ac, ClientOptions{Namespace: "n", Redis: rdb, Keys: rkeys.New("n")})
	if ok, err := c.EnqueueJob(ctx, JobRef{ID: "job_noscript", Priority: Default, Scope: scope, TenantID: "t", Cost: 5}); !ok || err != nil {
		t.Fatalf("push: %v, %v", ok, err)
	}
	if scopes, _ := c.Scopes(ctx); len(scopes) != 1 {
		t.Fatalf("scopes: %v", scopes)
	}
	if p, err := c.Placement(ctx, scope, "job_noscript"); p != "waiting" || err != nil {
		t.Fatalf("placement: %q, %v", p, err)
	}
}
