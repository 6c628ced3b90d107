package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestRun runs the benchmark small: both paths, streamed and not, and the
// under-load row with a backlog that outlasts it.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	args := []string{"-n", "5", "-load-clients", "8", "-load-for", "1s", "-load-rpm", "120", "-load-backlog", "300",
		"-load-providers", "azure-10s"}
	if err := run(t.Context(), args, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"non-streamed call, p50", "first streamed chunk, p50", "provider 429s", "sync share of calls",
		"under load, a provider with Azure's headers"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-n", "0"}, {"extra"}, {"-load-providers", "minute,nosuch"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}
