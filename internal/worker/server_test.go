package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

// Webhook deliveries run in a server of their own: with every delivery
// slot held by a receiver that does not answer, a job still runs in the
// worker's only job slot, and the job dequeuer never takes a delivery.
func TestWebhooksDoNotHoldJobSlots(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, redisDB)
	ns := queue.Namespace(testutil.Prefix(t))
	srv := worker.NewServer(rdb, worker.ServerOptions{
		Concurrency: 1, WebhookConcurrency: 1, Namespace: ns, PollInterval: 20 * time.Millisecond, ShutdownTimeout: time.Second,
	})
	release, delivering, ran := make(chan struct{}), make(chan string, 2), make(chan struct{}, 1)
	jobs := asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	})
	webhooks := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		delivering <- string(task.Payload())
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	if err := srv.Start(worker.Mux(jobs, webhooks)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(release)
		srv.Shutdown()
	})
	client := asynq.NewClientFromRedisClient(rdb)
	enqueue := func(typ, q, payload string) {
		t.Helper()
		if _, err := client.Enqueue(asynq.NewTask(typ, []byte(payload)), asynq.Queue(ns.Queue(q))); err != nil {
			t.Fatal(err)
		}
	}

	enqueue(queue.TypeWebhook, queue.Webhooks, "first")
	select {
	case p := <-delivering:
		if p != "first" {
			t.Fatalf("delivering %q, want the first", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the webhook server never took the delivery")
	}
	// The delivery slot is held. A second delivery and a job come: the
	// job runs; the delivery waits for the slot.
	enqueue(queue.TypeWebhook, queue.Webhooks, "second")
	enqueue(queue.TypeJob, queue.Jobs, `{"job_id":"job"}`)
	select {
	case <-ran:
	case p := <-delivering:
		t.Fatalf("delivery %q started while the only delivery slot is held", p)
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not run while a webhook delivery hung")
	}
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(ns.Queue(queue.Webhooks))
	if err != nil {
		t.Fatal(err)
	}
	if info.Pending != 1 || info.Active != 1 {
		t.Fatalf("webhooks queue: %d pending, %d active; want the second pending behind the first", info.Pending, info.Active)
	}
}
