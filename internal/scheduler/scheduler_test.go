package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/pacer"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/scheduler"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// redisDB is internal/queue's (docs/ARCHITECTURE.md); each test has its own
// namespace and key prefix.
const redisDB = 3

// policy has two models at 600 RPM / 60,000 TPM and tiers of shares 1 and 2.
const policy = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 600, tpm: 60000}
  - name: gpt-4o
    provider: sim
    price: {input_per_mtok: 2.5, output_per_mtok: 10}
    limits: {rpm: 600, tpm: 60000}
tiers:
  - name: standard
    daily_budget_usd: 1000
    priority: default
    api_rps: 1000
  - name: double
    daily_budget_usd: 1000
    priority: default
    api_rps: 1000
    share: 2
`

// world is a scheduler over a limiter on a simulated clock, and workers
// that take a released job's permit at once and finish it after latency.
type world struct {
	t     *testing.T
	a     *apptest.App
	clock *testutil.Clock
	tb    *limiter.TokenBucket
	p     *pacer.Pacer
	s     *scheduler.Scheduler

	// per tenant: tokens whose permits were taken, and when each job was
	// queued and released (simulated time)
	tokens   map[string]int64
	queuedAt map[string]time.Time
	doneAt   map[string]time.Time
	tenantOf map[string]string
	modelOf  map[string]string
	cost     map[string]int64
	in       *asynq.Inspector
	// held are released jobs a worker holds, waiting for their permit, and
	// since when; wasted counts those that waited past a worker's inline
	// wait (10 s): a worker would have put them back in the queue.
	held   []string
	heldAt map[string]time.Time
	wasted int
}

func newWorld(t *testing.T) *world { t.Helper(); return newWorldOf(t, policy) }

// newWorldOf is newWorld under another policy.
func newWorldOf(t *testing.T, policy string) *world {
	t.Helper()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: policy, NoScheduler: true})
	clock := testutil.NewClock(time.Unix(1_900_000_000, 0))
	tb := testutil.Must(limiter.NewTokenBucket(a.Redis, limiter.Options{Keys: a.Keys, Clock: clock.Now, HoldInFlight: true}))
	p := testutil.Must(pacer.New(tb, a.Redis, a.Keys, nil, nil, pacer.Options{Now: clock.Now}))
	s, err := scheduler.New(scheduler.Deps{Queue: a.Queue, Pacer: p, Policy: a.Policy, Redis: a.Redis, Keys: a.Keys}, scheduler.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, a: a, clock: clock, tb: tb, p: p, s: s, tokens: map[string]int64{}, queuedAt: map[string]time.Time{},
		doneAt: map[string]time.Time{}, tenantOf: map[string]string{}, modelOf: map[string]string{}, cost: map[string]int64{}, heldAt: map[string]time.Time{},
		in: asynq.NewInspectorFromRedisClient(a.Redis)}
}

// submit queues n jobs of cost tokens for tenant on model, at priority q.
func (w *world) submit(tenant, model, q string, n int, cost int64, share float64) []string {
	w.t.Helper()
	m, _ := w.a.Policy.Current().Model(model)
	refs := make([]queue.JobRef, n)
	ids := make([]string, n)
	for i := range refs {
		ids[i] = fmt.Sprintf("job_%s_%s_%d_%d", tenant, model, len(w.queuedAt), i)
		refs[i] = queue.JobRef{ID: ids[i], Priority: q, Scope: m.Queue(), TenantID: tenant, Cost: cost, Share: share}
		w.queuedAt[ids[i]] = w.clock.Now()
		w.tenantOf[ids[i]], w.modelOf[ids[i]], w.cost[ids[i]] = tenant, model, cost
	}
	if _, err := w.a.Queue.EnqueueJobs(context.Background(), refs); err != nil {
		w.t.Fatal(err)
	}
	return ids
}

// run steps the simulated clock by step for d: each step the scheduler
// releases, and each released job is started and takes its permit.
func (w *world) run(d, step time.Duration) {
	w.t.Helper()
	ctx := context.Background()
	for end := w.clock.Now().Add(d); w.clock.Now().Before(end); w.clock.Add(step) {
		if err := w.s.Tick(ctx, false); err != nil {
			w.t.Fatal(err)
		}
		qname := w.a.Queue.Namespace().Queue(queue.Jobs)
		tasks, err := w.in.ListPendingTasks(qname, asynq.PageSize(1000))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			w.t.Fatal(err)
		}
		for _, task := range tasks {
			if err := w.in.DeleteTask(qname, task.ID); err != nil {
				w.t.Fatal(err)
			}
			w.held = append(w.held, task.ID)
			w.heldAt[task.ID] = w.clock.Now()
		}
		kept := w.held[:0]
		for _, id := range w.held {
			if !w.permit(id) {
				kept = append(kept, id)
			}
		}
		w.held = kept
	}
}

// permit is a worker asking the job's permit; once it has it, the job no
// longer counts as released in its fair queue, and the call ends at once
// (the provider keeps max_tokens charged).
func (w *world) permit(id string) bool {
	ctx := context.Background()
	m, _ := w.a.Policy.Current().Model(w.modelOf[id])
	cost := w.cost[id]
	res, err := w.tb.Reserve(ctx, admission.Scope(m.Routes()[0]), limiter.Cost{Requests: 1, Tokens: cost})
	if err != nil {
		w.t.Fatal(err)
	}
	if !res.Allowed {
		if w.clock.Now().Sub(w.heldAt[id]) > 10*time.Second {
			w.wasted++
		}
		return false
	}
	if err := w.a.Queue.Started(ctx, m.Routes()[0].Deployment.Name(), id); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.tb.Settle(ctx, res.Reservation, limiter.Feedback{}); err != nil {
		w.t.Fatal(err)
	}
	w.tokens[w.tenantOf[id]] += cost
	w.doneAt[id] = w.clock.Now()
	return true
}

// placement is where a job the world queued is in its fair queue.
func (w *world) placement(id string) string {
	m, _ := w.a.Policy.Current().Model(w.modelOf[id])
	p, err := w.a.Queue.Placement(context.Background(), m.Routes()[0].Deployment.Name(), id)
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// A tenant's backlog does not hold another tenant's work back: B's 20 jobs,
// queued behind A's 2,000 on a model at its limits, all get their permit
// within 15 s, at half the model each meanwhile; nothing is released that
// the limiter then refuses.
func TestIsolation(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.submit("a", "gpt-4o-mini", queue.Default, 2000, 250, 1)
	w.run(30*time.Second, 100*time.Millisecond)
	b := w.submit("b", "gpt-4o-mini", queue.Default, 20, 250, 1)
	from := w.clock.Now()
	aBefore := w.tokens["a"]
	w.run(15*time.Second, 100*time.Millisecond)
	var last time.Duration
	for _, id := range b {
		done, ok := w.doneAt[id]
		if !ok {
			t.Fatalf("B's job %s has no permit 15 s after B queued it (B got %d tokens, A %d)", id, w.tokens["b"], w.tokens["a"]-aBefore)
		}
		last = max(last, done.Sub(from))
	}
	t.Logf("B's 20 jobs done %v after they were queued; meanwhile A got %d tokens", last, w.tokens["a"]-aBefore)
	if w.wasted != 0 {
		t.Fatalf("%d released jobs waited past a worker's inline wait for their permit", w.wasted)
	}
}

// Two tenants that both flood the model split it by their tiers' shares in
// tokens, whatever the size of their jobs; a tenant alone gets all of it.
func TestSharesAndWorkConserving(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.submit("alone", "gpt-4o-mini", queue.Default, 500, 250, 1)
	w.run(60*time.Second, 100*time.Millisecond)
	// 60,000 refilled over the minute, paced, and the first burst.
	if got := w.tokens["alone"]; got < 57_000 {
		t.Fatalf("a tenant alone got %d tokens in a minute, want about 60,000", got)
	}

	w2 := newWorld(t)
	w2.submit("single", "gpt-4o-mini", queue.Default, 2000, 1000, 1)
	w2.submit("double", "gpt-4o-mini", queue.Default, 4000, 100, 2)
	w2.run(30*time.Second, 100*time.Millisecond) // both tenants waiting
	s0, d0 := w2.tokens["single"], w2.tokens["double"]
	w2.run(60*time.Second, 100*time.Millisecond)
	s, d := w2.tokens["single"]-s0, w2.tokens["double"]-d0
	if r := float64(d) / float64(s); r < 1.8 || r > 2.2 {
		t.Fatalf("over a minute, double got %d tokens and single %d: %.2f, want 2 within 10%%", d, s, r)
	}
	if s+d < 57_000 {
		t.Fatalf("the two together got %d tokens in a minute, want about 60,000", s+d)
	}
	if w.wasted+w2.wasted != 0 {
		t.Fatalf("%d released jobs waited past a worker's inline wait for their permit", w.wasted+w2.wasted)
	}
}

// Jobs for a model whose limits are spent (paused after a 429) neither wait
// in asynq's queues nor hold up another model's jobs.
func TestAcrossModels(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	mini, _ := w.a.Policy.Current().Model("gpt-4o-mini")
	if err := w.tb.Penalize(ctx, admission.Scope(mini.Routes()[0]), time.Hour); err != nil {
		t.Fatal(err)
	}
	paused := w.submit("a", "gpt-4o-mini", queue.Default, 50, 250, 1)
	other := w.submit("a", "gpt-4o", queue.Default, 20, 250, 1)
	w.run(5*time.Second, 100*time.Millisecond)
	for _, id := range other {
		if _, ok := w.doneAt[id]; !ok {
			t.Fatalf("gpt-4o's job %s waits behind gpt-4o-mini's", id)
		}
	}
	for _, id := range paused {
		if p := w.placement(id); p != "waiting" {
			t.Fatalf("a paused model's job is %q, want waiting in its fair queue", p)
		}
	}
	if w.wasted != 0 {
		t.Fatalf("%d released jobs waited past a worker's inline wait for their permit", w.wasted)
	}
}

// Of two schedulers, one holds the lease and releases; when it stops, the
// other takes over.
func TestOneSchedulerAtATime(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: policy, NoScheduler: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, second := a.Scheduler(), a.Scheduler()
	ctx1, stop1 := context.WithCancel(ctx)
	done1, done2 := make(chan struct{}), make(chan struct{})
	go func() { first.Run(ctx1); close(done1) }()
	holder := func() string { return a.Redis.Get(ctx, a.Keys.Lock("scheduler")).Val() }
	testutil.Eventually(t, 5*time.Second, func() bool { return holder() != "" })
	held := holder()
	go func() { second.Run(ctx); close(done2) }()
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	ref := queue.JobRef{ID: "job_x", Priority: queue.Default, Scope: m.Routes()[0].Deployment.Name(), TenantID: "a", Cost: 10}
	if _, err := a.Queue.EnqueueJob(ctx, ref); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		p, _ := a.Queue.Placement(ctx, m.Routes()[0].Deployment.Name(), "job_x")
		return p == "released"
	})
	if holder() != held {
		t.Fatal("the lease changed hands while its holder ran")
	}
	stop1()
	<-done1
	testutil.Eventually(t, 10*time.Second, func() bool { h := holder(); return h != "" && h != held })
	cancel()
	<-done2
}
