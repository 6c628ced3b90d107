// Package cmdline holds what the server programs (dispatcher, worker,
// llmq-sim) share on their command lines: bad usage is an error of its own
// that exits 2, help and --version print to stdout and exit 0, and every
// other failure exits 1 with one line naming the program.
package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/llmq/llmq/internal/buildinfo"
)

// ExitUsage is the exit status of bad usage (as llmq's CLI and flag's own).
const ExitUsage = 2

// UsageError is a command line the program cannot run.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// ExitCode is the exit status of err: 0 for nil, ExitUsage for a
// *UsageError, 1 for anything else.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return ExitUsage
	}
	return 1
}

// Exit ends program after its run returned err: nothing for nil, else one
// line "program: err" on stderr and the exit status ExitCode says.
func Exit(program string, err error) {
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, program+": "+err.Error())
	os.Exit(ExitCode(err))
}

// IsHelp reports whether arg asks for help.
func IsHelp(arg string) bool { return slices.Contains([]string{"-h", "-help", "--help", "help"}, arg) }

// IsVersion reports whether arg asks for the version.
func IsVersion(arg string) bool {
	return slices.Contains([]string{"-version", "--version", "version"}, arg)
}

// PrintVersion writes program's version line to w.
func PrintVersion(w io.Writer, program string) {
	fmt.Fprintln(w, buildinfo.String(program))
}

// Parse parses args with fs, whose output is discarded: help (-h, --help)
// prints help to stdout and returns ErrHelpShown, and a bad flag or a
// positional argument is a *UsageError that says where help is.
func Parse(fs *flag.FlagSet, args []string, stdout io.Writer, help string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, strings.TrimRight(help, "\n"))
			return ErrHelpShown
		}
		return Usagef("%s: %v (-h lists the flags)", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		if IsHelp(fs.Arg(0)) {
			fmt.Fprintln(stdout, strings.TrimRight(help, "\n"))
			return ErrHelpShown
		}
		return Usagef("%s takes no arguments, got %q (-h shows its usage)", fs.Name(), fs.Args())
	}
	return nil
}

// ErrHelpShown ends a command whose help was printed: the program exits 0.
var ErrHelpShown = errors.New("help shown")

// ParseProgram is Parse of a program without commands, whose first
// argument may ask for its version: done says the program is to return err
// (nil once its help or version was printed).
func ParseProgram(fs *flag.FlagSet, args []string, stdout io.Writer, help, program string) (done bool, err error) {
	if len(args) > 0 && IsVersion(args[0]) {
		PrintVersion(stdout, program)
		return true, nil
	}
	if err := Parse(fs, args, stdout, help); !errors.Is(err, ErrHelpShown) {
		return err != nil, err
	}
	return true, nil
}
