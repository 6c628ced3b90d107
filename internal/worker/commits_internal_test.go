package worker

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// TestCommitsGroup: results that arrive while a leader is on its way to
// commit share its commit, and every run gets its own job's outcome.
func TestCommitsGroup(t *testing.T) {
	t.Parallel()
	db, err := store.Open(t.Context(), testutil.Postgres(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ten, err := db.TenantInsert(t.Context(), &store.TenantInsertParams{Name: "t", Tier: "standard"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	jobs := make([]string, n)
	for i := range jobs {
		j, _, err := db.JobInsert(t.Context(), &store.JobInsertParams{TenantID: ten.ID, Endpoint: "/v1/chat/completions",
			Model: "gpt-4o-mini", Request: json.RawMessage(`{"model":"gpt-4o-mini"}`), Queue: "default"})
		if err != nil {
			t.Fatal(err)
		}
		jobs[i] = j.ID
	}

	c := &commits{db: db}
	// The leader waits until every other run has queued: they must all go
	// in its commit.
	first := true
	c.beforeCommit = func() {
		if !first {
			return
		}
		first = false
		deadline := time.Now().Add(10 * time.Second)
		for {
			c.mu.Lock()
			queued := len(c.queue)
			c.mu.Unlock()
			if queued == n || time.Now().After(deadline) {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	for i, id := range jobs {
		wg.Go(func() {
			res, err := c.complete(context.Background(), &store.JobCompleteParams{ID: id, Day: "2026-03-01", Cost: 1,
				PromptTokens: int64(i)})
			if err != nil || !res.Completed || !res.Charged {
				t.Errorf("job %d: %+v, %v", i, res, err)
			}
		})
	}
	wg.Wait()
	if c.groups != 1 {
		t.Errorf("%d results in %d commits, want 1", n, c.groups)
	}
	for i, id := range jobs {
		j, err := db.JobGetByID(t.Context(), id)
		if err != nil || j.Status != store.JobSucceeded || j.PromptTokens != int64(i) {
			t.Fatalf("job %d after its commit: %+v, %v", i, j, err)
		}
	}
	if _, err := c.complete(context.Background(), &store.JobCompleteParams{ID: "job_missing", Day: "2026-03-01"}); err == nil {
		t.Fatal("a missing job completed")
	}
}
