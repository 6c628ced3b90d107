package api_test

import (
	"context"
	"testing"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/queue"
)

// A cancelled job is a terminal state like any other: its webhook is sent.
func TestCancelledJobSendsItsWebhook(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("standard")
	ctx := context.Background()
	webhookTask := func(id string) queue.TaskState {
		st, err := a.Inspector.WebhookTaskState(ctx, "job", id)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	hooked := a.Do("POST", "/v1/jobs", key, map[string]any{"webhook_url": "https://example.com/hook",
		"body": apptest.ChatBody("x", "", 5)}).Map(t)["id"].(string)
	plain := a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("y", "", 5)}).Map(t)["id"].(string)
	for _, id := range []string{hooked, plain} {
		if r := a.Do("DELETE", "/v1/jobs/"+id, key, nil); r.Status != 200 {
			t.Fatalf("cancel %s: %d", id, r.Status)
		}
	}
	if st := webhookTask(hooked); st != queue.TaskPending {
		t.Fatalf("the cancelled job's webhook task is %s, want pending", st)
	}
	if st := webhookTask(plain); st != queue.TaskMissing {
		t.Fatalf("a job without a webhook has a webhook task: %s", st)
	}
	// Cancelling again changes nothing and sends nothing more.
	if r := a.Do("DELETE", "/v1/jobs/"+hooked, key, nil); r.Status != 200 {
		t.Fatalf("second cancel: %d", r.Status)
	}
}
