// Package benchtest holds what the tests of the benchmark programs under
// bench/ share: a program run small with its output checked, and its bad
// flags refused.
package benchtest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// RunFunc is a benchmark program's run: it runs the program with args,
// printing to out.
type RunFunc = func(ctx context.Context, args []string, out io.Writer) error

// Run runs run with args and fails t unless it returns no error and its
// output holds each of want. It returns the output.
func Run(t *testing.T, run RunFunc, args []string, want ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(t.Context(), args, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	return out.String()
}

// BadFlags fails t for each of args that run does not refuse.
func BadFlags(t *testing.T, run RunFunc, args [][]string) {
	t.Helper()
	for _, a := range args {
		if err := run(t.Context(), a, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", a)
		}
	}
}
