// Command batchscale runs llmq's batches at the sizes their promises are
// made for, each scenario on a fresh llmq in this process (the API on a
// loopback listener, the scheduler, the batch sweeper, a worker) over a
// Postgres schema, a Redis key prefix and a simulated provider of its own:
//
//  1. invalid: a batch of -lines lines (10,000), 3 in every 100 of them
//     invalid, of every kind validation refuses, runs end to end. Its counts
//     are exact; its errors list its first 100 refusals and counts the rest;
//     the output file holds every valid line once, in input order, answered
//     200 with its own request's answer; the error file every refused line,
//     in order, with its line number and reason; each file is the size it
//     announces; the jobs ran in the batch queue.
//  2. output: the output file of a batch of -output-lines lines (50,000),
//     every job succeeded with an answer of -answer-bytes (3,000; written to
//     Postgres in one statement, since the provider's calls are not what it
//     measures), about 157 MB, is served by a dispatcher process built from
//     the tree. Every line arrives, in input order, and the bytes the file
//     announces; the dispatcher's peak resident memory (VmHWM) stays under
//     -max-rss, and grows while it serves the file by less than -max-growth
//     of the file's size: the file is streamed from Postgres a page of jobs
//     at a time, never held whole.
//
// The program exits 1 when a check fails. internal/batch's tests check the
// same at a few thousand lines; the figures and the command are in
// docs/BENCHMARKS.md.
//
//	go -C bench run ./batchscale
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/checks"
)

func main() { benchenv.Main("batchscale", run) }

// The scenarios, in the order they run.
const (
	scenarioInvalid = "invalid"
	scenarioOutput  = "output"
)

// options are the command's flags.
type options struct {
	Scenarios     []string
	Lines         int
	InvalidPer100 int
	OutputLines   int
	AnswerBytes   int
	MaxRSS        int64 // bytes
	MaxGrowth     float64
	Concurrency   int
	Dispatcher    string
	Timeout       time.Duration
	benchenv.Backends
}

func parseOptions(args []string, out io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("batchscale", flag.ContinueOnError)
	fs.SetOutput(out)
	scenarios := fs.String("scenarios", scenarioInvalid+","+scenarioOutput, "the scenarios to run, comma separated: invalid, output")
	fs.IntVar(&o.Lines, "lines", 10000, "invalid: lines of the batch")
	fs.IntVar(&o.InvalidPer100, "invalid-per-100", 3, "invalid: invalid lines in every 100 (never the first)")
	fs.IntVar(&o.OutputLines, "output-lines", 50000, "output: lines of the batch whose output file is served")
	fs.IntVar(&o.AnswerBytes, "answer-bytes", 3000, "output: bytes of each line's answer")
	maxRSS := fs.Int("max-rss", 200, "output: the most resident memory the dispatcher may reach, in MiB")
	fs.Float64Var(&o.MaxGrowth, "max-growth", 0.25, "output: the most the dispatcher's resident memory may grow while it serves the file, as a share of the file's size (0: not checked)")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "invalid: worker concurrency")
	fs.StringVar(&o.Dispatcher, "dispatcher", "", "output: the dispatcher binary to run (default: built from ./cmd/dispatcher)")
	o.Backends.Flags(fs, "each scenario")
	fs.DurationVar(&o.Timeout, "timeout", 15*time.Minute, "longest wait for one batch to end")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.MaxRSS = int64(*maxRSS) << 20
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if s != scenarioInvalid && s != scenarioOutput {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (invalid, output)", s)
		}
		if !slices.Contains(o.Scenarios, s) {
			o.Scenarios = append(o.Scenarios, s)
		}
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case len(o.Scenarios) == 0:
		return nil, errors.New("-scenarios: none given")
	case o.Lines < 2:
		return nil, fmt.Errorf("-lines must be at least 2, got %d", o.Lines)
	case o.InvalidPer100 < 0 || o.InvalidPer100 > 99:
		return nil, fmt.Errorf("-invalid-per-100 must be within [0, 99], got %d", o.InvalidPer100)
	case o.OutputLines < 1:
		return nil, fmt.Errorf("-output-lines must be at least 1, got %d", o.OutputLines)
	case o.AnswerBytes < 0:
		return nil, fmt.Errorf("-answer-bytes must not be negative, got %d", o.AnswerBytes)
	case *maxRSS < 1:
		return nil, fmt.Errorf("-max-rss must be at least 1 MiB, got %d", *maxRSS)
	case o.MaxGrowth < 0:
		return nil, fmt.Errorf("-max-growth must not be negative, got %v", o.MaxGrowth)
	case o.Concurrency < 1:
		return nil, fmt.Errorf("-concurrency must be at least 1, got %d", o.Concurrency)
	case o.Timeout <= 0:
		return nil, fmt.Errorf("-timeout must be positive, got %v", o.Timeout)
	}
	if err := o.Backends.Check(); err != nil {
		return nil, err
	}
	return o, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseOptions(args, out)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fmt.Fprintf(out, "batchscale: scenarios %s; GOMAXPROCS %d\n", strings.Join(o.Scenarios, ", "), runtime.GOMAXPROCS(0))
	var c checks.List
	for _, s := range o.Scenarios {
		switch s {
		case scenarioInvalid:
			err = runInvalid(ctx, o, logger, out, &c)
		case scenarioOutput:
			err = runOutput(ctx, o, logger, out, &c)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return c.Report(out)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
