package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/bench/internal/benchtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs both scenarios small: a batch with invalid lines end to end,
// and an output file served by a dispatcher process, with their checks. The
// memory bounds are the full run's business (internal/batch's tests check
// the streaming at a few thousand lines).
func TestRun(t *testing.T) {
	t.Parallel()
	args := []string{"-lines", "260", "-invalid-per-100", "50", "-concurrency", "10", "-output-lines", "300", "-answer-bytes", "100",
		"-max-growth", "0", "-timeout", "2m"}
	benchtest.Run(t, run, args,
		"invalid: 260 lines (110 invalid", "ok     invalid: exact counts", "ok     invalid: the batch completed", "ok     invalid: the errors list the first 100 refusals and count the rest",
		"ok     invalid: the output file", "ok     invalid: the error file", "output: 300 lines validated", "the dispatcher's resident memory",
		"ok     output: every line served once", "ok     output: the dispatcher's peak resident memory under -max-rss", "all 9 checks passed")
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	benchtest.BadFlags(t, run, [][]string{{"-scenarios", "invalid,nope"}, {"-scenarios", ","}, {"-lines", "1"}, {"-invalid-per-100", "100"},
		{"-output-lines", "0"}, {"-answer-bytes", "-1"}, {"-max-rss", "0"}, {"-max-growth", "-0.1"}, {"-concurrency", "0"}, {"-timeout", "0s"}, {"extra"}})
}
