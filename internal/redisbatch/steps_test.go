package redisbatch

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/llmq/llmq/internal/testutil"
)

func idleRunners() []*stepRunner {
	idleSteps.mu.Lock()
	defer idleSteps.mu.Unlock()
	return append([]*stepRunner(nil), idleSteps.runners...)
}

// Not parallel: it counts the package's idle step goroutines, which the
// parallel tests would share.
func TestStepGoroutinesAreKeptAndEnd(t *testing.T) {
	testutil.Eventually(t, 5*stepIdle, func() bool { return len(idleRunners()) == 0 })
	var ran atomic.Int64
	step := func(context.Context) { ran.Add(1) }
	// A step's goroutine goes idle just after Run returns.
	run := func() []*stepRunner {
		Run(context.Background(), step, step, step)
		testutil.Eventually(t, stepIdle/2, func() bool { return len(idleRunners()) == 2 })
		return idleRunners()
	}
	first := run() // the first step runs in the caller
	for range 10 {
		if got := run(); !sameRunners(got, first) {
			t.Fatalf("a later Run left idle %p, want the first Run's %p again", got, first)
		}
	}
	if got := ran.Load(); got != 33 {
		t.Fatalf("%d steps ran, want 33", got)
	}
	// idle ones end: goleak (TestMain) checks none is left at the end
	testutil.Eventually(t, 5*stepIdle, func() bool { return len(idleRunners()) == 0 })
}

func sameRunners(a, b []*stepRunner) bool {
	return len(a) == len(b) && ((a[0] == b[0] && a[1] == b[1]) || (a[0] == b[1] && a[1] == b[0]))
}
