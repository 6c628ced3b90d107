package redisbatch

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	// Idle runners live longer here, so a loaded machine's pause between
	// two Runs does not end them and make the test see new ones.
	const idle = 2 * time.Second
	setIdle := func(d time.Duration) {
		idleSteps.mu.Lock()
		idleSteps.after = d
		idleSteps.mu.Unlock()
	}
	setIdle(idle)
	t.Cleanup(func() { setIdle(0) })
	var ran atomic.Int64
	// A step's goroutine goes idle just after Run returns. Each step waits
	// for the others to start, so none can go idle and be taken again for
	// a later step of the same Run.
	run := func() []*stepRunner {
		var started sync.WaitGroup
		started.Add(3)
		step := func(context.Context) {
			ran.Add(1)
			started.Done()
			started.Wait()
		}
		Run(context.Background(), step, step, step)
		testutil.Eventually(t, idle/2, func() bool { return len(idleRunners()) == 2 })
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
	testutil.Eventually(t, 3*idle, func() bool { return len(idleRunners()) == 0 })
}

func sameRunners(a, b []*stepRunner) bool {
	return len(a) == len(b) && ((a[0] == b[0] && a[1] == b[1]) || (a[0] == b[1] && a[1] == b[0]))
}
