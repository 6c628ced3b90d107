package recovery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// archive moves the job's task to asynq's archive, as asynq does when a
// task's retries are used up.
func archive(t *testing.T, a *apptest.App, j *store.Job) {
	t.Helper()
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	if err := in.ArchiveTask(a.Queue.Namespace().Queue(queue.Jobs), j.ID); err != nil {
		t.Fatal(err)
	}
}

// archiveAsWorkerLost has a server deliver j's task once and end that
// delivery as asynq's recoverer ends one whose worker died (its lease
// expired), archiving the task.
func archiveAsWorkerLost(t *testing.T, a *apptest.App, j *store.Job) {
	t.Helper()
	q := a.Queue.Namespace().Queue(queue.Jobs)
	srv := asynq.NewServerFromRedisClient(a.Redis, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1},
		TaskCheckInterval: 20 * time.Millisecond, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc(queue.TypeJob, func(context.Context, *asynq.Task) error {
		return fmt.Errorf("%w: %w", asynq.ErrLeaseExpired, asynq.SkipRetry)
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	testutil.Eventually(t, 10*time.Second, func() bool {
		st, _ := a.Inspector.JobTaskState(t.Context(), j.ID)
		return st == queue.TaskArchived
	})
}
