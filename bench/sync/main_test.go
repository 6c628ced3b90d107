package main

import (
	"testing"

	"github.com/llmq/llmq/bench/internal/benchtest"
)

// TestRun runs the benchmark small: both paths, streamed and not, and the
// under-load row with a backlog that outlasts it.
func TestRun(t *testing.T) {
	args := []string{"-n", "5", "-load-clients", "8", "-load-for", "1s", "-load-rpm", "120", "-load-backlog", "300",
		"-load-providers", "azure-10s"}
	benchtest.Run(t, run, args,
		"non-streamed call, p50", "first streamed chunk, p50", "provider 429s", "sync share of calls",
		"under load, a provider with Azure's headers")
}

func TestBadFlags(t *testing.T) {
	benchtest.BadFlags(t, run, [][]string{{"-n", "0"}, {"extra"}, {"-load-providers", "minute,nosuch"}})
}
