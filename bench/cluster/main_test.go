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

// TestRun runs the benchmark small: both topologies, the placement line,
// the means.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-jobs", "60", "-warmup", "10", "-producers", "4", "-concurrency", "8", "-rounds", "1"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"round 1  one node", "round 1  cluster", "placement: tenants' budget days", "mean     cluster", "µs in all"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-jobs", "0"}, {"-models", "0"}, {"-tenants", "0"}, {"-global-cap-usd", "-1"}, {"-warmup", "-1"}, {"extra"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}
