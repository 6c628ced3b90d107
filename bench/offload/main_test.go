package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/bench/internal/benchtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the benchmark small: the normal run (tenant C sending for
// its first 300 ms), the offloaded one with C's synchronous calls
// throughout, their checks (every line once in the output, none run twice,
// half the spend to the micro-dollar, no 429 for C at its rate) and the
// table.
func TestRun(t *testing.T) {
	t.Parallel()
	args := []string{"-lines", "200", "-rpm", "12000", "-tpm", "1200000", "-sync-rpm", "3000", "-batch-lps", "200", "-latency", "5ms", "-jitter", "10ms",
		"-poll", "200ms", "-quiet=false", "-sync-normal", "300ms", "-timeout", "1m"}
	benchtest.Run(t, run, args,
		"CPU process a line", "Redis round trips a line", "tenant C during the offloaded run",
		"tenant C during the normal run", "tenant C stops with", "ok     offloaded: spend x 2 = the normal run's spend, to the micro-dollar", "ok     offloaded: tenant C saw no 429",
		"all 14 checks passed")
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	benchtest.BadFlags(t, run, [][]string{{"-lines", "0"}, {"-rpm", "0"}, {"-sync-rpm", "-1"}, {"-batch-lps", "0"}, {"-completion", "0"},
		{"-completion", "1.5"}, {"-poll", "0s"}, {"-sync-normal", "-1s"}, {"-concurrency", "0"}, {"extra"}})
}
