//go:build unix

package config

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// TestPolicyHolderWatchSIGHUP sends a real SIGHUP to the test process. The
// test subscribes to SIGHUP itself first, so the signal can never take the
// default action (ending the process) whatever the other tests are doing.
func TestPolicyHolderWatchSIGHUP(t *testing.T) {
	t.Parallel()
	guard := make(chan os.Signal, 1)
	signal.Notify(guard, syscall.SIGHUP)
	defer signal.Stop(guard)

	path, h, changes := setup(t, &HolderOptions{PollInterval: time.Hour})
	watch(t, h)
	writePolicy(t, path, policyWithRPS(t, 77))

	// Watch subscribes when its goroutine starts, which the test cannot
	// observe: resend until the reload shows.
	deadline := time.After(wait)
	for {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		select {
		case c := <-changes:
			if standardRPS(c.new) != 77 {
				t.Errorf("new api_rps %d, want 77", standardRPS(c.new))
			}
			return
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("SIGHUP did not reload the policy")
		}
	}
}
