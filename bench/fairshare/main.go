// Command fairshare measures fair share between tenants (issue 14): in one
// run, each scenario runs on two llmq stacks side by side, each with its
// own simulated provider at the same limits (600 RPM / 60,000 TPM by
// default), its own Postgres schema and Redis prefix, in-process workers
// and the API over loopback HTTP: one with the fair queue and its
// scheduler, one in today's single-queue order (app.Parts.SingleQueue:
// every job goes to asynq's queue as it arrives). It prints, per target of
// the issue, the fair stack's figure, the baseline's, and whether the
// target was met. The numbers and the command are in docs/BENCHMARKS.md.
//
//	go -C bench run ./fairshare             # ~10 minutes
//	go -C bench run ./fairshare -quick      # ~5 minutes, smaller backlogs and windows (too short for the targets of share and priorities)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
)

func main() { benchenv.Main("fairshare", run) }

// options are the command's flags.
type options struct {
	Scenarios      string
	RPM, TPM       int64
	Latency        time.Duration
	Jitter         time.Duration
	Concurrency    int
	Backlog        int
	BJobs          int
	BatchA         int
	BatchB         int
	Settle         time.Duration
	Cap            time.Duration
	ShareWindow    time.Duration
	ConserveWindow time.Duration
	Quick          bool
	benchenv.Backends
}

// allScenarios are the scenarios, in the order they run.
var allScenarios = []string{"isolation", "batch", "share", "conserving", "models", "priorities"}

func parseOptions(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("fairshare", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.StringVar(&o.Scenarios, "scenarios", strings.Join(allScenarios, ","), "scenarios to run, comma-separated")
	fs.Int64Var(&o.RPM, "rpm", 600, "the model's requests per minute, at the simulator and in the policy")
	fs.Int64Var(&o.TPM, "tpm", 60000, "the model's tokens per minute, at the simulator and in the policy")
	fs.DurationVar(&o.Latency, "latency", 200*time.Millisecond, "the simulator's least latency")
	fs.DurationVar(&o.Jitter, "jitter", 600*time.Millisecond, "uniform latency added to -latency")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "worker concurrency of each stack (LLMQ_WORKER_CONCURRENCY's default)")
	fs.IntVar(&o.Backlog, "backlog", 2000, "isolation: tenant A's queued jobs")
	fs.IntVar(&o.BJobs, "b-jobs", 20, "isolation and across models: tenant B's jobs")
	fs.IntVar(&o.BatchA, "batch-a", 5000, "batch isolation: lines of tenant A's batch")
	fs.IntVar(&o.BatchB, "batch-b", 50, "batch isolation: lines of tenant B's batch")
	fs.DurationVar(&o.Settle, "settle", 20*time.Second, "how long a flood runs before anything is measured (the provider's full buckets drain)")
	fs.DurationVar(&o.Cap, "cap", 60*time.Second, "longest wait for tenant B's jobs or batch (the baseline's usually)")
	fs.DurationVar(&o.ShareWindow, "share-window", 70*time.Second, "weighted share: the measured span, in sliding minutes")
	fs.DurationVar(&o.ConserveWindow, "conserve-window", 30*time.Second, "work-conserving and priorities: the measured span")
	fs.BoolVar(&o.Quick, "quick", false, "smaller backlogs and shorter windows (flags given explicitly still win)")
	o.Backends.Flags(fs, "each stack")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.Quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		quick := map[string]func(){
			"backlog": func() { o.Backlog = 1500 }, "batch-a": func() { o.BatchA = 2000 }, "batch-b": func() { o.BatchB = 20 },
			"settle": func() { o.Settle = 10 * time.Second }, "cap": func() { o.Cap = 30 * time.Second },
			"share-window": func() { o.ShareWindow = 30 * time.Second }, "conserve-window": func() { o.ConserveWindow = 20 * time.Second },
		}
		for name, f := range quick {
			if !set[name] {
				f()
			}
		}
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.RPM < 1 || o.TPM < 1:
		return nil, fmt.Errorf("-rpm and -tpm must be at least 1, got %d and %d", o.RPM, o.TPM)
	case o.Latency < 0 || o.Jitter < 0:
		return nil, fmt.Errorf("-latency and -jitter must not be negative, got %v and %v", o.Latency, o.Jitter)
	case o.Concurrency < 1:
		return nil, fmt.Errorf("-concurrency must be at least 1, got %d", o.Concurrency)
	case o.Backlog < 1 || o.BJobs < 1 || o.BatchA < 1 || o.BatchB < 1:
		return nil, fmt.Errorf("-backlog, -b-jobs, -batch-a and -batch-b must be at least 1")
	case o.Settle < 0:
		return nil, fmt.Errorf("-settle must not be negative, got %v", o.Settle)
	case o.Cap <= 0 || o.ShareWindow <= 0 || o.ConserveWindow <= 0:
		return nil, fmt.Errorf("-cap, -share-window and -conserve-window must be positive")
	}
	for _, s := range strings.Split(o.Scenarios, ",") {
		if !contains(allScenarios, s) {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (known: %s)", s, strings.Join(allScenarios, ", "))
		}
	}
	if err := o.Backends.Check(); err != nil {
		return nil, err
	}
	return o, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// run runs the scenarios asked for, one after another, and prints the
// table. Missing a target is a result, not an error.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args, stdout)
	if err != nil {
		return err
	}
	stdout = &lockedWriter{w: stdout}
	// Warnings only: one during a run is worth seeing next to the numbers.
	logger := slog.New(quietHandler{slog.NewTextHandler(stdout, &slog.HandlerOptions{Level: slog.LevelWarn})})
	fmt.Fprintf(stdout, "fairshare: %d RPM, %d TPM, latency %v–%v, %d workers per stack; scenarios %s\n",
		o.RPM, o.TPM, o.Latency, o.Latency+o.Jitter, o.Concurrency, o.Scenarios)
	var rows []row
	for _, name := range strings.Split(o.Scenarios, ",") {
		began := time.Now()
		rs, err := runScenario(ctx, o, logger, name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(stdout, "  %s: %.0f s\n", name, time.Since(began).Seconds())
		rows = append(rows, rs...)
	}
	report(stdout, rows)
	return nil
}

func runScenario(ctx context.Context, o *options, logger *slog.Logger, name string) ([]row, error) {
	withO := func(fn func(context.Context, *options, *stack) (*latencyResult, error)) func(context.Context, *stack) (*latencyResult, error) {
		return func(ctx context.Context, s *stack) (*latencyResult, error) { return fn(ctx, o, s) }
	}
	withOS := func(fn func(context.Context, *options, *stack) (*shareResult, error)) func(context.Context, *stack) (*shareResult, error) {
		return func(ctx context.Context, s *stack) (*shareResult, error) { return fn(ctx, o, s) }
	}
	switch name {
	case "isolation":
		f, b, err := pair(ctx, o, logger, withO(isolation))
		if err != nil {
			return nil, err
		}
		return isolationRows(o, f, b), nil
	case "batch":
		f, b, err := pair(ctx, o, logger, withO(batchIsolation))
		if err != nil {
			return nil, err
		}
		return batchRows(o, f, b), nil
	case "share":
		f, b, err := pair(ctx, o, logger, withOS(weightedShare))
		if err != nil {
			return nil, err
		}
		return shareRows(f, b), nil
	case "conserving":
		var rows []row
		for _, n := range []int{1, 10} {
			f, b, err := pair(ctx, o, logger, withOS(conserving(n)))
			if err != nil {
				return nil, err
			}
			rows = append(rows, conservingRow(n, f, b))
		}
		return rows, nil
	case "models":
		f, b, err := pair(ctx, o, logger, withO(acrossModels))
		if err != nil {
			return nil, err
		}
		return modelRows(o, f, b), nil
	case "priorities":
		f, b, err := pair(ctx, o, logger, withOS(priorityOrder))
		if err != nil {
			return nil, err
		}
		return priorityRows(f, b), nil
	}
	return nil, fmt.Errorf("unknown scenario %q", name)
}
