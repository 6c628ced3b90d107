package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.Bool("worker", false, "")
		return fs
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}, {"-worker", "help"}} {
		var out strings.Builder
		if err := Parse(newFS(), args, &out, "usage: x\n"); !errors.Is(err, ErrHelpShown) || out.String() != "usage: x\n" {
			t.Errorf("%v: %v, printed %q; want the help and ErrHelpShown", args, err, out.String())
		}
	}
	for _, args := range [][]string{{"-nope"}, {"now"}, {"-worker", "extra"}} {
		var out strings.Builder
		err := Parse(newFS(), args, &out, "usage: x")
		if ExitCode(err) != ExitUsage || out.String() != "" || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v (exit %d), printed %q; want a one-line usage error", args, err, ExitCode(err), out.String())
		}
	}
	if err := Parse(newFS(), []string{"-worker"}, &strings.Builder{}, ""); err != nil {
		t.Errorf("-worker: %v", err)
	}
	if ExitCode(nil) != 0 || ExitCode(errors.New("x")) != 1 || ExitCode(fmt.Errorf("w: %w", Usagef("u"))) != ExitUsage {
		t.Error("ExitCode")
	}
}
