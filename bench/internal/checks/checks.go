// Package checks holds the verdicts of a benchmark run that checks what it
// measures, each with what was measured, and reports them alike: a line a
// check, "ok" or "FAILED", then the count, and an error when one failed (the
// program then exits 1).
package checks

import (
	"fmt"
	"io"
)

// List is a run's checks, in the order they were made.
type List []Check

// Check is one verdict.
type Check struct {
	What string // what is checked
	OK   bool
	Got  string // what was measured
}

// Add appends the check what, its verdict ok and what was measured, as
// format and a say.
func (l *List) Add(what string, ok bool, format string, a ...any) {
	*l = append(*l, Check{What: what, OK: ok, Got: fmt.Sprintf(format, a...)})
}

// Report prints every check after a blank line, then that all passed; it
// returns an error counting the failed ones when one failed.
func (l List) Report(w io.Writer) error {
	fmt.Fprintln(w)
	failed := 0
	for _, c := range l {
		mark := "ok    "
		if !c.OK {
			mark = "FAILED"
			failed++
		}
		fmt.Fprintf(w, "%s %s: %s\n", mark, c.What, c.Got)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(l))
	}
	fmt.Fprintf(w, "\nall %d checks passed\n", len(l))
	return nil
}
