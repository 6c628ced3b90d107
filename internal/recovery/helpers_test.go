package recovery_test

import (
	"testing"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/store"
)

// archive moves the job's task to asynq's archive, as asynq does when a
// task's retries are used up.
func archive(t *testing.T, a *apptest.App, j *store.Job) {
	t.Helper()
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	if err := in.ArchiveTask(a.Queue.Namespace().Queue(j.Queue), j.ID); err != nil {
		t.Fatal(err)
	}
}
