package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/queue"
)

// A synchronous request that holds its room in the fair queue gets a permit
// ahead of a backlog of async jobs on a model at its limits: the scheduler
// releases nothing into the held room, so once the jobs already released
// have their permits the next refill is the request's. Without the hold the
// released jobs take every refill, and the request waits on.
func TestHeldRoomGoesFirst(t *testing.T) {
	t.Parallel()
	for _, hold := range []bool{false, true} {
		w := newWorld(t)
		w.submit("a", "gpt-4o-mini", queue.Default, 2000, 250, 1)
		w.run(20*time.Second, 100*time.Millisecond) // at the limit: 4 jobs a second
		m, _ := w.a.Policy.Current().Model("gpt-4o-mini")
		scope := admission.ScopeName(m)
		ctx := context.Background()
		if hold {
			if err := w.a.Queue.Hold(ctx, scope, "sync-1", 250, 1, time.Minute); err != nil {
				t.Fatal(err)
			}
			if tok, req, err := w.a.Queue.Held(ctx, scope); err != nil || tok != 250 || req != 1 {
				t.Fatalf("held %v %v %v", tok, req, err)
			}
		}
		waited := time.Duration(0)
		for ; waited < 3*time.Second; waited += 100 * time.Millisecond {
			w.run(100*time.Millisecond, 100*time.Millisecond)
			res, err := w.tb.Reserve(ctx, admission.Scope(m), limiter.Cost{Requests: 1, Tokens: 250})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				break
			}
		}
		if hold && waited > 1500*time.Millisecond {
			t.Errorf("with its room held, the request waited %s behind the backlog", waited)
		}
		if !hold && waited < 3*time.Second {
			t.Errorf("without a hold the request got a permit after %s: the test shows nothing", waited)
		}
		if hold {
			if err := w.a.Queue.Unhold(ctx, scope, "sync-1"); err != nil {
				t.Fatal(err)
			}
			if tok, _, err := w.a.Queue.Held(ctx, scope); err != nil || tok != 0 {
				t.Fatalf("after Unhold: %v %v", tok, err)
			}
		}
	}
}
