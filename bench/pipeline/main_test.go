package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/bench/internal/benchtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the whole benchmark small: every stack, the client's polls
// to every job's success, the light load, the tables.
func TestRun(t *testing.T) {
	benchtest.Run(t, run, []string{"-jobs", "60", "-warmup", "10", "-producers", "4", "-concurrency", "8", "-rounds", "2", "-light-jobs", "20", "-light-rate", "200"},
		"llmq/hand-wired", "bare asynq", "target llmq/hand-wired", "CPU this process", "llmq, round 2 (flat out)", "hand-wired, light load (200/s)", "llmq at light load: p50")
}

func TestBadFlags(t *testing.T) {
	benchtest.BadFlags(t, run, [][]string{{"-jobs", "0"}, {"-rounds", "0"}, {"-light-rate", "0"}, {"-servers", "0"}, {"-concurrency", "2", "-servers", "3"}, {"extra"}})
}

func TestPercentile(t *testing.T) {
	l := latencies{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}.sorted()
	for q, want := range map[float64]int64{0.5: 5, 0.9: 9, 0.99: 10, 1: 10, 0.1: 1} {
		if got := l.percentile(q); int64(got) != want {
			t.Errorf("percentile(%v) = %d, want %d", q, got, want)
		}
	}
}
