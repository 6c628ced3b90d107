package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the whole benchmark small: both pipelines, verification of
// every job, the tables.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-jobs", "60", "-warmup", "10", "-producers", "4", "-concurrency", "8"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"bare asynq", "llmq end to end", "ratio llmq/bare", "CPU time per job", "API alone (no workers)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-jobs", "0"}, {"-servers", "0"}, {"-concurrency", "2", "-servers", "3"}, {"extra"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

func TestPercentile(t *testing.T) {
	l := latencies{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}.sorted()
	for q, want := range map[float64]int64{0.5: 5, 0.9: 9, 0.99: 10, 1: 10, 0.1: 1} {
		if got := l.percentile(q); int64(got) != want {
			t.Errorf("percentile(%v) = %d, want %d", q, got, want)
		}
	}
}
