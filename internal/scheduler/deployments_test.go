package scheduler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/queue"
)

// deploymentsPolicy has a model on two deployments (600 and 300 RPM, 100
// tokens a request at their TPM) with a fallback, and one on the same two
// without.
var deploymentsPolicy = strings.Replace(policy, `models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 600, tpm: 60000}
  - name: gpt-4o
    provider: sim
    price: {input_per_mtok: 2.5, output_per_mtok: 10}
    limits: {rpm: 600, tpm: 60000}`, `  - name: other
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 600, tpm: 60000}
  - name: gpt-4o
    price: {input_per_mtok: 2.5, output_per_mtok: 10}
    deployments: &two
      - {provider: sim, upstream: gpt-4o, limits: {rpm: 600, tpm: 60000}}
      - {provider: other, upstream: gpt-4o, limits: {rpm: 300, tpm: 30000}}
    fallbacks: [gpt-4o-mini]
  - name: gpt-4o-solo
    price: {input_per_mtok: 2.5, output_per_mtok: 10}
    deployments: *two`, 1)

// released counts the jobs the scheduler has put in asynq's queue.
func (w *world) released() int {
	w.t.Helper()
	tasks, err := w.in.ListPendingTasks(w.a.Queue.Namespace().Queue(queue.Jobs), asynq.PageSize(1000))
	if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
		w.t.Fatal(err)
	}
	return len(tasks)
}

// A model on several deployments is released their rooms together; once
// every one is paused, nothing, or its fallback's room when it has one.
func TestDeploymentsRoom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name        string
		model       string
		pause       []string
		least, most int
	}{
		// sim/gpt-4o holds 5 requests at once (its 500 ms burst) and
		// refills 10 in the second of lookahead, other/gpt-4o 2.5 + 5:
		// about 22 jobs of 100 tokens, where one deployment would give 15.
		{name: "together", model: "gpt-4o", least: 20, most: 23},
		{name: "one paused", model: "gpt-4o", pause: []string{"sim/gpt-4o"}, least: 7, most: 8},
		{name: "all paused with a fallback", model: "gpt-4o", pause: []string{"sim/gpt-4o", "other/gpt-4o"}, least: 15, most: 15},
		{name: "all paused without one", model: "gpt-4o-solo", pause: []string{"sim/gpt-4o", "other/gpt-4o"}, least: 0, most: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWorldOf(t, deploymentsPolicy)
			m, _ := w.a.Policy.Current().Model(c.model)
			for _, name := range c.pause {
				r, _ := m.Route(name)
				if err := w.tb.Penalize(ctx, admission.Scope(r), time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			w.submit("a", c.model, queue.Default, 60, 100, 1)
			if err := w.s.Tick(ctx, false); err != nil {
				t.Fatal(err)
			}
			if n := w.released(); n < c.least || n > c.most {
				t.Fatalf("released %d jobs, want %d to %d", n, c.least, c.most)
			}
		})
	}
}
