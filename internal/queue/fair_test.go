package queue

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// fairSetup is setup with the fair queue on.
func fairSetup(t *testing.T) (*Client, *Inspector) {
	t.Helper()
	opt := testutil.AsynqOpt(t, redisDB)
	ns := Namespace(testutil.Prefix(t))
	ac := asynq.NewClient(opt)
	in := asynq.NewInspector(opt)
	rdb := testutil.Redis(t, redisDB)
	keys := rkeys.New(string(ns))
	t.Cleanup(func() {
		for _, q := range ns.Queues() {
			_ = in.DeleteQueue(q, true)
		}
		ctx := context.Background()
		for _, k := range rdb.Keys(ctx, keys.Prefix()+":*").Val() {
			rdb.Del(ctx, k)
		}
		_ = ac.Close()
		_ = in.Close()
	})
	return NewClient(ac, ClientOptions{Namespace: ns, Redis: rdb, Keys: keys}), NewInspector(in, ns)
}

const scope = "sim/m"

var unlimited = Room{Tokens: math.Inf(1), Requests: math.Inf(1), MaxOutstanding: 1 << 20}

func push(t *testing.T, c *Client, tenant, q string, n int, cost int64, share float64) []string {
	t.Helper()
	refs := make([]JobRef, n)
	ids := make([]string, n)
	for i := range refs {
		ids[i] = fmt.Sprintf("job_%s_%s_%d", tenant, q, i)
		refs[i] = JobRef{ID: ids[i], Priority: q, Scope: scope, TenantID: tenant, Cost: cost, Share: share}
	}
	added, err := c.EnqueueJobs(context.Background(), refs)
	if err != nil || added != n {
		t.Fatalf("push %d for %s: %d, %v", n, tenant, added, err)
	}
	return ids
}

func release(t *testing.T, c *Client, room Room) []Released {
	t.Helper()
	rel, _, err := c.Release(context.Background(), scope, room)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// tokensOf sums the released tokens per tenant.
func tokensOf(rel []Released) map[string]int64 {
	m := map[string]int64{}
	for _, r := range rel {
		m[r.TenantID] += r.Cost
	}
	return m
}

// A tenant that starts waiting behind another's backlog is served at once,
// turn about, not after the backlog.
func TestFairQueueIsolatesTenants(t *testing.T) {
	t.Parallel()
	c, in := fairSetup(t)
	push(t, c, "a", Default, 200, 100, 1)
	first := release(t, c, Room{Tokens: 1000, Requests: math.Inf(1), MaxOutstanding: 1 << 20})
	if len(first) != 10 || first[0].ID != "job_a_default_0" {
		t.Fatalf("released %d, first %+v; want A's first 10", len(first), first)
	}
	for _, r := range first {
		if err := c.Started(context.Background(), scope, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	push(t, c, "b", Default, 5, 100, 1)
	rel := release(t, c, Room{Tokens: 1000, Requests: math.Inf(1), MaxOutstanding: 1 << 20})
	b := 0
	for i, r := range rel {
		if r.TenantID == "b" {
			b++
			if i > 2*b {
				t.Fatalf("B's job %d released at %d: %v", b, i, rel)
			}
		}
	}
	if b != 5 {
		t.Fatalf("B got %d of the next 10 releases, want all 5 of its jobs: %v", b, rel)
	}
	// Released jobs have their task; the rest wait.
	if st, _ := in.JobTaskState(context.Background(), "job_b_default_0"); st != TaskPending {
		t.Fatalf("released job's task is %s", st)
	}
	if p, _ := c.Placement(context.Background(), scope, "job_a_default_199"); p != "waiting" {
		t.Fatalf("A's last job is %q, want waiting", p)
	}
}

// Tenants that both wait split the releases by their shares, in tokens: a
// tenant of large jobs gets no more by sending fewer.
func TestFairQueueSplitsTokensByShare(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                 string
		costA, costB         int64
		shareA, shareB, want float64 // want: A's tokens over B's
	}{
		{"equal", 100, 100, 1, 1, 1},
		{"shares 3:1", 100, 100, 3, 1, 3},
		{"large jobs", 1000, 100, 1, 1, 1},
		{"large jobs, shares 1:2", 1000, 100, 1, 2, 0.5},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			q, _ := fairSetup(t)
			push(t, q, "a", Default, 1000, c.costA, c.shareA)
			push(t, q, "b", Default, 1000, c.costB, c.shareB)
			// Both stay waiting throughout: what they get is their share.
			got := tokensOf(release(t, q, Room{Tokens: 80_000, Requests: math.Inf(1), MaxOutstanding: 1 << 20}))
			ratio := float64(got["a"]) / float64(got["b"])
			// within one job of the exact split
			tol := float64(c.costA)/float64(got["a"]) + float64(c.costB)/float64(got["b"])
			if math.Abs(ratio/c.want-1) > tol {
				t.Fatalf("tokens released %v: A/B = %.3f, want %.3f", got, ratio, c.want)
			}
		})
	}
}

// Priorities keep the proportions of their queues' weights, in tokens.
func TestFairQueueWeighsPriorities(t *testing.T) {
	t.Parallel()
	c, _ := fairSetup(t)
	push(t, c, "a", Critical, 1000, 100, 1)
	push(t, c, "a", Low, 1000, 100, 1)
	byQueue := map[string]int64{}
	for _, r := range release(t, c, Room{Tokens: 50_000, Requests: math.Inf(1), MaxOutstanding: 1 << 20}) {
		byQueue[r.Priority] += r.Cost
	}
	if r := float64(byQueue[Critical]) / float64(byQueue[Low]); math.Abs(r/4-1) > 0.05 {
		t.Fatalf("released %v: critical/low = %.2f, want 4 (weights 8:2)", byQueue, r)
	}
}

// A release takes only what the room holds, counting what was released and
// not yet started; started jobs free their room.
func TestFairQueueReleasesWithinTheRoom(t *testing.T) {
	t.Parallel()
	c, _ := fairSetup(t)
	ctx := context.Background()
	push(t, c, "a", Default, 10, 100, 1)
	room := Room{Tokens: 250, Requests: math.Inf(1), MaxOutstanding: 100, Factor: 1}
	if rel := release(t, c, room); len(rel) != 2 {
		t.Fatalf("released %d, want 2 (250 tokens of room, 100 each)", len(rel))
	}
	if rel := release(t, c, room); len(rel) != 0 {
		t.Fatalf("released %d more, want none: 200 are out", len(rel))
	}
	if err := c.Started(ctx, scope, "job_a_default_0"); err != nil {
		t.Fatal(err)
	}
	if rel := release(t, c, room); len(rel) != 1 {
		t.Fatalf("released %d after one started, want 1", len(rel))
	}
	// Requests, the calibration factor and the cap on outstanding jobs bound
	// it too.
	if rel := release(t, c, Room{Tokens: math.Inf(1), Requests: 3, MaxOutstanding: 100}); len(rel) != 1 {
		t.Fatalf("with room for 3 requests and 2 out: released %d, want 1", len(rel))
	}
	if rel := release(t, c, Room{Tokens: math.Inf(1), Requests: math.Inf(1), MaxOutstanding: 5}); len(rel) != 2 {
		t.Fatalf("with at most 5 out and 3 out: released %d, want 2", len(rel))
	}
	c2, _ := fairSetup(t)
	push(t, c2, "a", Default, 10, 100, 1)
	if rel := release(t, c2, Room{Tokens: 300, Requests: math.Inf(1), MaxOutstanding: 100, Factor: 1.5}); len(rel) != 2 {
		t.Fatalf("jobs counted 1.5x: released %d in 300 tokens, want 2", len(rel))
	}
}

// A job larger than any room goes alone once nothing is out; a cancelled job
// is dropped when it comes up; a job is queued once.
func TestFairQueueForceCancelAndOnce(t *testing.T) {
	t.Parallel()
	c, _ := fairSetup(t)
	ctx := context.Background()
	push(t, c, "a", Default, 3, 5000, 1)
	if rel := release(t, c, Room{Tokens: 1000, Requests: math.Inf(1), MaxOutstanding: 100}); len(rel) != 0 {
		t.Fatalf("released %d without Force", len(rel))
	}
	if rel := release(t, c, Room{Tokens: 1000, Requests: math.Inf(1), MaxOutstanding: 100, Force: true}); len(rel) != 1 {
		t.Fatalf("released %d with Force, want exactly 1", len(rel))
	}
	if err := c.Dequeue(ctx, scope, "job_a_default_1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Started(ctx, scope, "job_a_default_0"); err != nil {
		t.Fatal(err)
	}
	rel := release(t, c, unlimited)
	if len(rel) != 1 || rel[0].ID != "job_a_default_2" {
		t.Fatalf("released %+v, want job_a_default_2 only (1 was cancelled)", rel)
	}
	if ok, err := c.EnqueueJob(ctx, JobRef{ID: "job_a_default_2", Priority: Default, Scope: scope, TenantID: "a", Cost: 1}); err != nil || ok {
		t.Fatalf("a released job enqueued again: %v, %v", ok, err)
	}
	ws, out, err := c.Waiting(ctx, scope)
	if err != nil || len(ws) != 0 || out != 1 {
		t.Fatalf("waiting %+v, out %d, %v; want nothing waiting, 1 out", ws, out, err)
	}
}

// What waits is seen per priority and tenant; a job released and never
// started (the scheduler stopped) gets its task again.
func TestFairQueueWaitingAndStale(t *testing.T) {
	t.Parallel()
	c, in := fairSetup(t)
	ctx := context.Background()
	push(t, c, "a", Default, 3, 100, 1)
	push(t, c, "b", Low, 2, 100, 1)
	ws, out, err := c.Waiting(ctx, scope)
	if err != nil || out != 0 || len(ws) != 2 {
		t.Fatalf("waiting %+v, %d, %v", ws, out, err)
	}
	for _, w := range ws {
		want := map[string]int64{"a": 3, "b": 2}[w.TenantID]
		if w.Jobs != want || time.Since(w.Oldest) > time.Minute {
			t.Fatalf("%+v, want %d jobs, queued just now", w, want)
		}
	}
	rel := release(t, c, Room{Tokens: 100, Requests: math.Inf(1), MaxOutstanding: 100})
	if len(rel) != 1 {
		t.Fatalf("released %d", len(rel))
	}
	// The task was lost between the release and the enqueue.
	if err := in.in.DeleteTask(c.Namespace().Queue(Jobs), rel[0].ID); err != nil {
		t.Fatal(err)
	}
	if n, err := c.RequeueStale(ctx, scope, 0); err != nil || n != 1 {
		t.Fatalf("RequeueStale = %d, %v", n, err)
	}
	if st, _ := in.JobTaskState(ctx, rel[0].ID); st != TaskPending {
		t.Fatalf("stale job's task is %s, want pending again", st)
	}
	if _, out, _ := c.Waiting(ctx, scope); out != 0 {
		t.Fatalf("%d still out after RequeueStale", out)
	}
}

// The fair queue's time is its scripts' (redisclock): an injected clock
// decides how long a job waited, when it was queued and when a released
// job is stale.
func TestFairQueueClock(t *testing.T) {
	t.Parallel()
	c, in := fairSetup(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	c.fair.clock = func() time.Time { return now }
	push(t, c, "a", Default, 1, 100, 1)
	ws, _, err := c.Waiting(ctx, scope)
	if err != nil || len(ws) != 1 || !ws[0].Oldest.Equal(t0) {
		t.Fatalf("waiting %+v, %v; want queued at %v", ws, err, t0)
	}
	now = t0.Add(3 * time.Second)
	rel := release(t, c, unlimited)
	if len(rel) != 1 || rel[0].Waited != 3*time.Second {
		t.Fatalf("released %+v, want one that waited 3s", rel)
	}
	if err := in.in.DeleteTask(c.Namespace().Queue(Jobs), rel[0].ID); err != nil {
		t.Fatal(err)
	}
	now = now.Add(29 * time.Second)
	if n, err := c.RequeueStale(ctx, scope, 30*time.Second); err != nil || n != 0 {
		t.Fatalf("RequeueStale after 29s = %d, %v; want 0", n, err)
	}
	now = now.Add(2 * time.Second)
	if n, err := c.RequeueStale(ctx, scope, 30*time.Second); err != nil || n != 1 {
		t.Fatalf("RequeueStale after 31s = %d, %v; want 1", n, err)
	}
	if st, _ := in.JobTaskState(ctx, rel[0].ID); st != TaskPending {
		t.Fatalf("stale job's task is %s, want pending again", st)
	}
}

// The fair queue's scripts keep to one Cluster slot: every key they touch,
// the per-tenant lists too, carries the scope's hash tag.
func TestFairQueueOnACluster(t *testing.T) {
	t.Parallel()
	cc := testutil.StartRedisCluster(t)
	f := newFair(cc, rkeys.New("cl"))
	ctx := context.Background()
	var refs []JobRef
	for i := range 20 {
		refs = append(refs, JobRef{ID: fmt.Sprintf("job_%d", i), Priority: Default, Scope: scope, TenantID: fmt.Sprintf("t%d", i%3), Cost: 10})
	}
	if n, err := f.push(ctx, scope, refs); err != nil || n != 20 {
		t.Fatalf("push on a cluster: %d, %v", n, err)
	}
	keys := []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairMembers(scope), f.keys.FairOut(scope)}
	v, err := fairReleaseScript.Run(ctx, cc, keys, redisclock.Arg(nil), f.keys.FairQueue(scope), fairTTL.Milliseconds(),
		"inf", "inf", 100, "1", "0", fairWeights).Slice()
	if err != nil || len(v) != 1+5*20 || v[0] != int64(1) {
		t.Fatalf("release on a cluster: %d values, %v", len(v), err)
	}
}
