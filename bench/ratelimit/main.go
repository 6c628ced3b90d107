// Command ratelimit measures how much of a provider's tokens-per-minute llmq
// uses, and how often the provider answers 429, when many worker processes
// share one rate limit. In one run it drives the simulated provider
// (internal/llm/sim) with the same request mix, one scenario after another,
// each against a fresh simulator:
//
//  1. llmq with the policy's limits equal to the provider's: real worker
//     processes (cmd/worker) over a test llmq of the run's own, with the
//     queue kept full;
//  2. the same with the policy at twice the provider's limits, so the limits
//     learned from x-ratelimit-limit-* headers and the 429 pauses have to
//     bring the workers down to the real ones;
//  3. baseline "retry": callers grouped as processes calling the provider in
//     a loop with no limiter, sleeping the provider's retry-after on a 429;
//  4. baseline "local": the same groups, each enforcing the full limits with
//     an in-memory token bucket of its own, as single-process scripts do.
//
// It prints, side by side, the share of the provider's TPM the calls used
// (tokens the provider's bucket kept: prompt plus completion), the share of
// calls answered 429, calls and jobs per second, for the first minute and for
// the steady state after it. The numbers and the command that produced them
// are in docs/BENCHMARKS.md.
//
//	go run ./bench/ratelimit            # about 13 minutes
//	go run ./bench/ratelimit -quick     # 30 s per scenario
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	Duration    time.Duration
	Warmup      time.Duration
	Quick       bool
	Processes   int
	Concurrency int
	RPM, TPM    int64
	Latency     time.Duration
	Jitter      time.Duration
	Seed        uint64
	Scenarios   []string
	Interval    time.Duration
	RedisURL    string
	RedisDB     int
	DatabaseURL string
	WorkerBin   string
	LogDir      string
}

// The scenarios, in the order they run.
const (
	scLLMQ      = "llmq"
	scLLMQ2x    = "llmq-2x"
	scRetry     = "retry"
	scLocal     = "local"
	allScenario = scLLMQ + "," + scLLMQ2x + "," + scRetry + "," + scLocal
)

func parseOptions(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("ratelimit", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.DurationVar(&o.Duration, "duration", 3*time.Minute, "length of each scenario")
	fs.DurationVar(&o.Warmup, "warmup", time.Minute, "start of the steady state within each scenario (the first minute is reported apart)")
	fs.BoolVar(&o.Quick, "quick", false, "a short run to try it: -duration 30s -warmup 10s unless given")
	fs.IntVar(&o.Processes, "processes", 4, "worker processes (llmq) or caller groups, each modelling a process (baselines)")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "jobs or callers at once per process")
	// 150,000 TPM is ~2,500 tokens/s, ~6 calls/s of the request mix: 200
	// callers with 300–800 ms of latency could send ~60 times that, so the
	// TPM bucket binds in every scenario while the machine stays mostly idle.
	fs.Int64Var(&o.TPM, "tpm", 150_000, "the provider's tokens per minute (prompt + max_tokens at admission, unused refunded)")
	fs.Int64Var(&o.RPM, "rpm", 1_000, "the provider's requests per minute (set so that TPM, not RPM, binds: the mix needs ~370 RPM at full TPM)")
	fs.DurationVar(&o.Latency, "latency", 300*time.Millisecond, "the provider's base latency")
	fs.DurationVar(&o.Jitter, "jitter", 500*time.Millisecond, "uniform random latency added to -latency")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the request mix and of the simulator's latencies and completion lengths")
	scenarios := fs.String("scenarios", allScenario, "comma-separated scenarios to run, of "+allScenario)
	fs.DurationVar(&o.Interval, "interval", 15*time.Second, "width of the per-scenario timeline's rows (at least 1s)")
	fs.StringVar(&o.RedisURL, "redis", envOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis server (its database number is replaced by -redis-db)")
	fs.IntVar(&o.RedisDB, "redis-db", 10, "Redis database (10 is bench/'s, docs/ARCHITECTURE.md)")
	fs.StringVar(&o.DatabaseURL, "database", envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"Postgres database; each llmq scenario creates a schema of its own there and drops it at the end")
	fs.StringVar(&o.WorkerBin, "worker", "", "worker binary to run (default: go build ./cmd/worker into a temporary directory)")
	fs.StringVar(&o.LogDir, "admissions", "", "write each scenario's admission log as JSON lines into this directory")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.Quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["duration"] {
			o.Duration = 30 * time.Second
		}
		if !set["warmup"] {
			o.Warmup = 10 * time.Second
		}
		if !set["interval"] {
			o.Interval = 5 * time.Second
		}
	}
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(strings.Split(allScenario, ","), s) {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q; use some of %s", s, allScenario)
		}
		if !slices.Contains(o.Scenarios, s) {
			o.Scenarios = append(o.Scenarios, s)
		}
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.Duration <= 0:
		return nil, fmt.Errorf("-duration must be positive, got %v", o.Duration)
	case o.Warmup < 0 || o.Warmup >= o.Duration:
		return nil, fmt.Errorf("-warmup must be within [0, -duration), got %v", o.Warmup)
	case o.Processes < 1:
		return nil, fmt.Errorf("-processes must be at least 1, got %d", o.Processes)
	case o.Concurrency < 1:
		return nil, fmt.Errorf("-concurrency must be at least 1, got %d", o.Concurrency)
	case o.TPM < 2*maxRequestTokens:
		// The 2× policy must still fit the largest request in the real bucket.
		return nil, fmt.Errorf("-tpm must be at least %d (twice the largest request), got %d", 2*maxRequestTokens, o.TPM)
	case o.RPM < 1:
		return nil, fmt.Errorf("-rpm must be at least 1, got %d", o.RPM)
	case o.Latency < 0 || o.Jitter < 0:
		return nil, errors.New("-latency and -jitter must not be negative")
	case o.Interval < time.Second:
		// The simulator's counters are sampled once a second.
		return nil, fmt.Errorf("-interval must be at least 1s, got %v", o.Interval)
	case o.RedisDB < 0:
		return nil, fmt.Errorf("-redis-db must not be negative, got %d", o.RedisDB)
	}
	return o, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// run runs the chosen scenarios one after another and prints the table.
// Missing a target is a result, not an error.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	// Warnings only: a warning during a run (a refused enqueue, a worker's
	// log line about learned limits) is worth seeing next to the numbers.
	logger := slog.New(slog.NewTextHandler(stdout, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if o.LogDir != "" {
		if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
			return fmt.Errorf("-admissions: %w", err)
		}
	}
	mix := newMix(o.Seed)
	fmt.Fprintf(stdout, "ratelimit: provider %d RPM, %d TPM, latency %v + [0, %v); %d processes x %d; %v per scenario, steady state after %v\n",
		o.RPM, o.TPM, o.Latency, o.Jitter, o.Processes, o.Concurrency, o.Duration, o.Warmup)
	fmt.Fprintf(stdout, "request mix: %s\n\n", mix.describe())

	var bin string
	if slices.Contains(o.Scenarios, scLLMQ) || slices.Contains(o.Scenarios, scLLMQ2x) {
		var cleanup func()
		bin, cleanup, err = workerBinary(ctx, o.WorkerBin)
		if err != nil {
			return err
		}
		defer cleanup()
	}

	var results []*result
	for _, sc := range o.Scenarios {
		if err := ctx.Err(); err != nil {
			return err
		}
		started := time.Now()
		fmt.Fprintf(stdout, "%s: %s ...\n", started.Format(time.TimeOnly), scenarioTitle(sc))
		var res *result
		switch sc {
		case scLLMQ:
			res, err = runLLMQ(ctx, o, mix, bin, 1, logger)
		case scLLMQ2x:
			res, err = runLLMQ(ctx, o, mix, bin, 2, logger)
		case scRetry:
			res, err = runBaseline(ctx, o, mix, false)
		case scLocal:
			res, err = runBaseline(ctx, o, mix, true)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", sc, err)
		}
		res.scenario = sc
		if o.LogDir != "" {
			if err := writeAdmissions(o.LogDir, sc, res.log); err != nil {
				return err
			}
		}
		results = append(results, res)
		timeline(stdout, o, res)
	}
	report(stdout, o, results)
	return nil
}

func scenarioTitle(sc string) string {
	switch sc {
	case scLLMQ:
		return "llmq, policy = provider limits"
	case scLLMQ2x:
		return "llmq, policy = 2x provider limits"
	case scRetry:
		return "baseline: retry after retry-after, no limiter"
	case scLocal:
		return "baseline: a local token bucket per process"
	}
	return sc
}
