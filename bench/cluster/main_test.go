package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/bench/internal/benchtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the benchmark small: both topologies, the placement line,
// the means.
func TestRun(t *testing.T) {
	benchtest.Run(t, run, []string{"-jobs", "60", "-warmup", "10", "-producers", "4", "-concurrency", "8", "-rounds", "1"},
		"round 1  one node", "round 1  cluster", "placement: tenants' budget days", "mean     cluster", "µs in all")
}

func TestBadFlags(t *testing.T) {
	benchtest.BadFlags(t, run, [][]string{{"-jobs", "0"}, {"-models", "0"}, {"-tenants", "0"}, {"-global-cap-usd", "-1"}, {"-warmup", "-1"}, {"extra"}})
}
