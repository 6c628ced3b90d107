package worker_test

import (
	"testing"

	"github.com/llmq/llmq/internal/worker"
)

// Dequeuers default to one per 16 of Concurrency, never more than
// Concurrency.
func TestServerDequeuers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ concurrency, dequeuers, want int }{
		{0, 0, 3}, {50, 0, 3}, {15, 0, 1}, {1, 0, 1}, {64, 0, 4}, {4, 100, 4}, {50, 2, 2},
	} {
		srv := worker.NewServer(nil, worker.ServerOptions{Concurrency: c.concurrency, Dequeuers: c.dequeuers})
		if got := srv.Dequeuers(); got != c.want {
			t.Errorf("Concurrency %d, Dequeuers %d: %d dequeuers, want %d", c.concurrency, c.dequeuers, got, c.want)
		}
	}
}
