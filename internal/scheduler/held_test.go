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
// releases no job into the held room, so once the jobs already released
// have their permits the next refill is the request's.
func TestHeldRoomGoesFirst(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.submit("a", "gpt-4o-mini", queue.Default, 2000, 250, 1)
	w.run(20*time.Second, 100*time.Millisecond) // at the limit: 4 jobs a second
	m, _ := w.a.Policy.Current().Model("gpt-4o-mini")
	scope := m.Routes()[0].Deployment.Name()
	ctx := context.Background()
	if err := w.p.Hold(ctx, scope, "sync-1", queue.Default, 250, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if tok, req, err := w.p.Held(ctx, scope); err != nil || tok != 250 || req != 1 {
		t.Fatalf("held %v %v %v", tok, req, err)
	}
	for _, c := range []struct {
		priority string
		above    bool
	}{{queue.Critical, false}, {queue.Default, false}, {queue.Low, true}, {queue.Batch, true}} {
		if above, err := w.p.HeldAbove(ctx, scope, c.priority); err != nil || above != c.above {
			t.Errorf("HeldAbove(%s) = %v, %v; want %v", c.priority, above, err, c.above)
		}
	}
	outstanding := int64(len(w.held))
	before := w.tokens["a"]
	waited := time.Duration(0)
	for ; ; waited += 100 * time.Millisecond {
		if waited > 3*time.Second {
			t.Fatalf("with its room held, the request waited %s behind the backlog", waited)
		}
		w.run(100*time.Millisecond, 100*time.Millisecond)
		res, err := w.tb.Reserve(ctx, admission.Scope(m.Routes()[0]), limiter.Cost{Requests: 1, Tokens: 250})
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			break
		}
	}
	// Ahead of it went only jobs released before the hold: at most what
	// was outstanding, and the one tick's release that raced it.
	if ahead := (w.tokens["a"] - before) / 250; ahead > outstanding+4 {
		t.Errorf("%d async jobs got permits while the request waited %s (%d were outstanding)", ahead, waited, outstanding)
	}
	if err := w.p.Unhold(ctx, scope, "sync-1"); err != nil {
		t.Fatal(err)
	}
	if tok, _, err := w.p.Held(ctx, scope); err != nil || tok != 0 {
		t.Fatalf("after Unhold: %v %v", tok, err)
	}
	// Given back, the room goes to the backlog again.
	before = w.tokens["a"]
	w.run(2*time.Second, 100*time.Millisecond)
	if w.tokens["a"] == before {
		t.Error("no async job ran after the hold was given back")
	}
}
