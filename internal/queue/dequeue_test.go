package queue

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/testutil"
)

// dequeueTrips counts the dequeue scripts that reach Redis for one
// namespace's job queues: asynq's own and the one DequeueClient sends, and
// how many of the latter found no task.
type dequeueTrips struct {
	ns                    Namespace
	asynqs, ours, nothing atomic.Int64
}

func (c *dequeueTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *dequeueTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *dequeueTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if len(args) < 4 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
			return err
		}
		first, _ := args[3].(string)
		if !strings.HasPrefix(first, "asynq:{"+string(c.ns)+":") || !strings.HasSuffix(first, ":pending") {
			return err
		}
		switch args[1] {
		case asynqDequeueScript.Hash():
			c.asynqs.Add(1)
		case dequeueScript.Hash():
			c.ours.Add(1)
			if err == redis.Nil {
				c.nothing.Add(1)
			}
		}
		return err
	}
}

// runJobs enqueues n tasks to queue q of ns, runs them through an asynq
// server over client with the job queues' weights, and returns the ids in
// the order they ran. check runs in the handler, with the task's id.
func runJobs(t *testing.T, rdb *redis.Client, client redis.UniversalClient, ns Namespace, q string, n int, check func(id string)) []string {
	t.Helper()
	ac := asynq.NewClientFromRedisClient(rdb)
	for i := range n {
		id := fmt.Sprintf("job_%03d", i)
		if _, err := ac.Enqueue(asynq.NewTask(TypeJob, []byte(`{"job_id":"`+id+`"}`)), asynq.TaskID(id), asynq.Queue(ns.Queue(q))); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu  sync.Mutex
		ran []string
	)
	srv := asynq.NewServerFromRedisClient(client, asynq.Config{
		Concurrency: 1, Queues: ns.JobWeights(), TaskCheckInterval: 50 * time.Millisecond,
		LogLevel: asynq.ErrorLevel, ShutdownTimeout: time.Second,
	})
	if err := srv.Start(asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
		id, err := ParseJobPayload(task)
		if err != nil {
			return err
		}
		if check != nil {
			check(id)
		}
		mu.Lock()
		ran = append(ran, id)
		mu.Unlock()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) >= n })
	srv.Shutdown()
	return ran
}

func dequeueSetup(t *testing.T) (*redis.Client, Namespace, *dequeueTrips) {
	rdb := testutil.Redis(t, redisDB)
	ns := Namespace(testutil.Prefix(t))
	trips := &dequeueTrips{ns: ns}
	rdb.AddHook(trips)
	t.Cleanup(func() { testutil.PurgeRedis(rdb, ns.Queues(), "") })
	return rdb, ns, trips
}

// A job dequeuer's client takes a task of the lowest-weighted queue in one
// round trip: asynq alone tries the empty queues before it, one round trip
// each, 2.4 on average. The task is made active with its lease, as asynq's
// script does, so a worker that dies with it leaves it to be recovered.
func TestDequeueClientTakesATaskInOneRoundTrip(t *testing.T) {
	t.Parallel()
	const n = 40
	rdb, ns, trips := dequeueSetup(t)
	lease := "asynq:{" + ns.Queue(Batch) + "}:lease"
	ran := runJobs(t, rdb, ns.DequeueClient(rdb), ns, Batch, n, func(id string) {
		if _, err := rdb.ZScore(context.Background(), lease, id).Result(); err != nil {
			t.Errorf("running %s has no lease: %v", id, err)
		}
	})
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("job_%03d", i)
	}
	if !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want each of %d once in order", ran, n)
	}
	if got := trips.asynqs.Load(); got != 0 {
		t.Fatalf("%d of asynq's own dequeue scripts reached Redis: asynq's script is no longer the one asynqDequeueScript holds", got)
	}
	ours, nothing := trips.ours.Load(), trips.nothing.Load()
	if ours-nothing != n {
		t.Fatalf("%d dequeues found a task, want %d", ours-nothing, n)
	}
	// Only the idle polls after the last task find nothing.
	if nothing > 5 {
		t.Fatalf("%d dequeues found nothing, want only the few idle polls at the end", nothing)
	}

	// The baseline: asynq's client tries the empty queues too.
	rdb, ns, trips = dequeueSetup(t)
	runJobs(t, rdb, rdb, ns, Batch, n, nil)
	if got := trips.asynqs.Load(); got < 2*n {
		t.Fatalf("plain asynq sent %d dequeue scripts for %d tasks; the test no longer tells the clients apart", got, n)
	}
}

// A paused queue's tasks stay, as with asynq's own dequeue; the others'
// run.
func TestDequeueClientSkipsAPausedQueue(t *testing.T) {
	t.Parallel()
	rdb, ns, _ := dequeueSetup(t)
	in := asynq.NewInspectorFromRedisClient(rdb)
	if err := in.PauseQueue(ns.Queue(Critical)); err != nil {
		t.Fatal(err)
	}
	ac := asynq.NewClientFromRedisClient(rdb)
	for i := range 5 {
		id := fmt.Sprintf("crit_%d", i)
		if _, err := ac.Enqueue(asynq.NewTask(TypeJob, []byte(`{"job_id":"`+id+`"}`)), asynq.TaskID(id), asynq.Queue(ns.Queue(Critical))); err != nil {
			t.Fatal(err)
		}
	}
	ran := runJobs(t, rdb, ns.DequeueClient(rdb), ns, Low, 5, nil)
	for _, id := range ran {
		if strings.HasPrefix(id, "crit_") {
			t.Fatalf("%s ran from a paused queue", id)
		}
	}
	info, err := in.GetQueueInfo(ns.Queue(Critical))
	if err != nil || info.Pending != 5 {
		t.Fatalf("paused queue holds %v pending, %v; want 5", info, err)
	}
}

// The queues are tried in asynq's order: the one asynq chose first, then
// each of the others next in proportion to its weight among those left.
func TestDequeueClientOrder(t *testing.T) {
	t.Parallel()
	ns := Namespace("ord")
	d := ns.DequeueClient(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})).(*dequeueClient)
	defer d.Close()
	const draws = 20000
	second := map[string]int{}
	for range draws {
		o := d.order(ns.Queue(Critical))
		if len(o) != len(Priorities) || o[0] != ns.Queue(Critical) {
			t.Fatalf("order %v: want the chosen queue first, then the others once each", o)
		}
		seen := map[string]bool{}
		for _, q := range o {
			if seen[q] {
				t.Fatalf("order %v tries %s twice", o, q)
			}
			seen[q] = true
		}
		second[o[1]]++
	}
	// after critical (8): default 4, low 2, batch 1 of 7
	for q, w := range map[string]float64{Default: 4, Low: 2, Batch: 1} {
		if got, want := float64(second[ns.Queue(q)])/draws, w/7; math.Abs(got-want) > 0.02 {
			t.Errorf("%s second in %.3f of the orders, want %.3f", q, got, want)
		}
	}
}

// A Cluster client is given back as it is: its queues are in other slots.
func TestDequeueClientLeavesAClusterAlone(t *testing.T) {
	t.Parallel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	if got := Namespace("c").DequeueClient(cc); got != redis.UniversalClient(cc) {
		t.Fatalf("DequeueClient(cluster) = %T, want the cluster client itself", got)
	}
}
