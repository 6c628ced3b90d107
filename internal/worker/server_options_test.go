package worker_test

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/worker"
)

// A bad option is an error naming the field, and no server.
func TestServerOptionsValidate(t *testing.T) {
	t.Parallel()
	srv, err := worker.NewServer(nil, worker.ServerOptions{Concurrency: -1})
	if err == nil || srv != nil || !strings.Contains(err.Error(), "ServerOptions.Concurrency") {
		t.Fatalf("NewServer: %v, %v; want an error naming ServerOptions.Concurrency", srv, err)
	}
}

// Dequeuers default to one per 16 of Concurrency, never more than
// Concurrency, and a negative count is an error naming the field.
func TestServerDequeuers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ concurrency, dequeuers, want int }{
		{0, 0, 3}, {50, 0, 3}, {15, 0, 1}, {1, 0, 1}, {64, 0, 4}, {4, 100, 4}, {50, 2, 2},
	} {
		srv, err := worker.NewServer(nil, worker.ServerOptions{Concurrency: c.concurrency, Dequeuers: c.dequeuers})
		if err != nil {
			t.Fatal(err)
		}
		if got := srv.Dequeuers(); got != c.want {
			t.Errorf("Concurrency %d, Dequeuers %d: %d dequeuers, want %d", c.concurrency, c.dequeuers, got, c.want)
		}
	}
	srv, err := worker.NewServer(nil, worker.ServerOptions{Dequeuers: -1})
	if err == nil || srv != nil || !strings.Contains(err.Error(), "ServerOptions.Dequeuers") {
		t.Fatalf("NewServer: %v, %v; want an error naming ServerOptions.Dequeuers", srv, err)
	}
}
