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
