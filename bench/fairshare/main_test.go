package main

import (
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/bench/internal/benchtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs four scenarios small, against a fast simulator: both
// stacks, the measurements, the table. The targets are the full run's
// business, not the test's; work-conserving and priorities measure as the
// weighted share does, and only take longer. Each scenario is a run of its
// own, the four at once whatever -test.parallel says: most of their time is
// waits (a run's CPU is about a third of its time).
func TestRun(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	for _, sc := range []struct {
		name string
		want []string
	}{
		{"isolation", []string{"isolation: A has 100 jobs"}},
		{"batch", []string{"isolation, batches"}},
		{"share", []string{"weighted share"}},
		{"models", []string{"across models", "wasted dequeues"}},
	} {
		wg.Go(func() {
			t.Run(sc.name, func(t *testing.T) { testRun(t, sc.name, sc.want) })
		})
	}
	wg.Wait()
}

// testRun runs scenario small, and checks its output has wants.
func testRun(t *testing.T, scenario string, wants []string) {
	args := []string{"-scenarios", scenario, "-latency", "20ms", "-jitter", "20ms", "-concurrency", "10",
		"-backlog", "100", "-b-jobs", "2", "-batch-a", "100", "-batch-b", "3",
		"-settle", "1s", "-cap", "8s", "-share-window", "3s"}
	out := benchtest.Run(t, run, args, wants...)
	// The fair stack's isolation holds even this small: B's jobs do not
	// wait behind A's backlog.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "| isolation: A has") && strings.Contains(strings.Split(line, "|")[2], "not done") {
			t.Errorf("the fair stack did not finish B's jobs: %s", line)
		}
	}
}

func TestBadFlags(t *testing.T) {
	benchtest.BadFlags(t, run, [][]string{{"-rpm", "0"}, {"-scenarios", "isolation,nosuch"}, {"-cap", "0s"}, {"-backlog", "0"}, {"extra"}})
}

func TestInterleave(t *testing.T) {
	a, b := &tenant{ID: "a"}, &tenant{ID: "b"}
	got := interleave(small.of(a, modelA).times(2), small.of(b, modelA).times(6))
	var order strings.Builder
	for _, sp := range got {
		order.WriteString(sp.Tenant.ID)
	}
	if order.String() != "bbabbbab" && order.String() != "babbbabb" {
		t.Errorf("interleave = %s, want each a among three b", order.String())
	}
}

func TestSlidingWindows(t *testing.T) {
	t0 := time.Unix(0, 0)
	if ws := slidingWindows(t0, t0.Add(30*time.Second), time.Minute, 5*time.Second); len(ws) != 1 || !ws[0].To.Equal(t0.Add(30*time.Second)) {
		t.Errorf("short span: %v", ws)
	}
	if ws := slidingWindows(t0, t0.Add(70*time.Second), time.Minute, 5*time.Second); len(ws) != 3 || !ws[2].From.Equal(t0.Add(10*time.Second)) {
		t.Errorf("70 s: %v", ws)
	}
}
