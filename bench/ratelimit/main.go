// Command ratelimit measures how much of a provider's tokens-per-minute llmq
// uses, and how often the provider answers 429, when many worker processes
// share one rate limit, whatever the provider's arithmetic. In one run it
// drives the simulated provider (internal/llm/sim) one scenario after
// another, each against a fresh simulator in its mode: the rows of issue
// 12's table with llmq's real worker processes (cmd/worker) over a test
// llmq of the run's own, the queue kept full,
//
//	keep         the provider keeps prompt + max_tokens charged (OpenAI's
//	             documented admission), policy = its limits
//	refund       it gives the unused tokens back at completion
//	tokens-1.6x  it counts prompts 1.6 times what llmq's tokenizer counts,
//	             with long prompts and small max_tokens
//	2x-keep      the policy at twice its limits, keeping max_tokens
//	2x-refund    the same, refunding
//	shared       another application uses 30% of the account's TPM
//
// and the two baselines against the provider that keeps max_tokens charged:
// "retry" (callers grouped as processes, no limiter, sleeping the
// retry-after of a 429) and "local" (each group enforcing the full limits
// with an in-memory token bucket of its own, as single-process scripts do).
//
// With -responses, a share of every scenario's requests goes to the
// Responses API (POST /v1/responses) instead of chat completions: the same
// words as its input and max_tokens as its max_output_tokens, held to the
// same targets; "-responses 0,0.5" runs each scenario chat-only, then with
// half its requests as Responses, side by side in one table.
//
// It prints each scenario's timeline, then a table: the share of the
// provider's TPM used (the tokens its bucket kept, net of refunds, and the
// external application's), the share of calls answered 429, calls per
// second, for the first minute and the steady state, against the issue's
// targets, and what llmq learned in each scenario. The numbers and the
// command that produced them are in docs/BENCHMARKS.md.
//
//	go -C bench run ./ratelimit            # about 22 minutes
//	go -C bench run ./ratelimit -quick     # 30 s per scenario
//	go -C bench run ./ratelimit -responses 0,0.5   # each scenario chat-only, then mixed
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/procs"
	"github.com/llmq/llmq/internal/llm"
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
	Scenarios   []scenario
	Responses   []float64 // shares of requests sent to the Responses API, one run of each scenario per share
	Interval    time.Duration
	benchenv.Backends
	WorkerBin string
	LogDir    string
}

func parseOptions(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("ratelimit", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.DurationVar(&o.Duration, "duration", 150*time.Second, "length of each scenario")
	fs.DurationVar(&o.Warmup, "warmup", 90*time.Second, "start of the steady state within each scenario (the first minute is reported apart)")
	fs.BoolVar(&o.Quick, "quick", false, "a short run to try it: -duration 30s -warmup 10s -interval 5s unless given")
	fs.IntVar(&o.Processes, "processes", 4, "worker processes (llmq) or caller groups, each modelling a process (baselines)")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "jobs or callers at once per process")
	// 60,000 TPM is ~110 calls a minute of the usual mix charged prompt +
	// max_tokens: 200 callers with 200-800 ms of latency could send ~150
	// times that, so the TPM bucket binds in every scenario.
	fs.Int64Var(&o.TPM, "tpm", 60_000, "the provider's tokens per minute (charged at admission as each scenario's provider counts)")
	fs.Int64Var(&o.RPM, "rpm", 600, "the provider's requests per minute (TPM binds first: the usual mix needs ~150 RPM at full TPM)")
	fs.DurationVar(&o.Latency, "latency", 200*time.Millisecond, "the provider's base latency")
	fs.DurationVar(&o.Jitter, "jitter", 600*time.Millisecond, "uniform random latency added to -latency")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the request mix and of the simulator's latencies and completion lengths")
	names := fs.String("scenarios", scenarioNames(), "comma-separated scenarios to run, in this order, of "+scenarioNames())
	shares := fs.String("responses", "0", "comma-separated shares (0 to 1) of requests sent to the Responses API (/v1/responses) instead of chat completions; each scenario runs once per share, in this order")
	fs.DurationVar(&o.Interval, "interval", 15*time.Second, "width of the per-scenario timeline's rows (at least 1s)")
	o.Backends.Flags(fs, "each llmq scenario")
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
	for _, name := range strings.Split(*names, ",") {
		name = strings.TrimSpace(name)
		sc, ok := findScenario(name)
		if !ok {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q; use some of %s", name, scenarioNames())
		}
		if !slices.ContainsFunc(o.Scenarios, func(s scenario) bool { return s.name == sc.name }) {
			o.Scenarios = append(o.Scenarios, sc)
		}
	}
	for _, f := range strings.Split(*shares, ",") {
		share, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(share >= 0 && share <= 1) {
			return nil, fmt.Errorf("-responses: each share must be a number within [0, 1], got %q", f)
		}
		if !slices.Contains(o.Responses, share) {
			o.Responses = append(o.Responses, share)
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
	case o.RPM < 1:
		return nil, fmt.Errorf("-rpm must be at least 1, got %d", o.RPM)
	case o.Latency < 0 || o.Jitter < 0:
		return nil, errors.New("-latency and -jitter must not be negative")
	case o.Interval < time.Second:
		// The simulator's counters are sampled once a second.
		return nil, fmt.Errorf("-interval must be at least 1s, got %v", o.Interval)
	}
	if err := o.Backends.Check(); err != nil {
		return nil, err
	}
	for _, sc := range o.Scenarios {
		// The 2x policy must still fit the largest request, as the
		// provider counts it, in the real bucket.
		if need := 2 * sc.shape.maxRequest(sc.factor()); o.TPM < need {
			return nil, fmt.Errorf("-tpm must be at least %d for scenario %s (twice its largest request as the provider counts it), got %d", need, sc.name, o.TPM)
		}
		// The simulator's external application keeps at most 5 s of its
		// calls waiting: less than one call and it never sends any.
		if x := sc.external(o.TPM); x > 0 && x/12 < externalCallTokens {
			return nil, fmt.Errorf("-tpm must be at least %.0f for scenario %s (its external application sends calls of %d tokens), got %d",
				12*externalCallTokens/sc.externalShare, sc.name, externalCallTokens, o.TPM)
		}
	}
	return o, nil
}

// runs are the scenarios to run, in order: each once per share of
// Responses API requests.
func (o *options) runs() []scenario {
	var out []scenario
	for _, sc := range o.Scenarios {
		for _, share := range o.Responses {
			sc.responses = share
			out = append(out, sc)
		}
	}
	return out
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
	fmt.Fprintf(stdout, "ratelimit: provider %d RPM, %d TPM, latency %v + [0, %v); %d processes x %d; %v per scenario, steady state after %v\n",
		o.RPM, o.TPM, o.Latency, o.Jitter, o.Processes, o.Concurrency, o.Duration, o.Warmup)
	described := map[string]bool{}
	for _, sc := range o.Scenarios {
		d := newMix(o.Seed, sc.shape, 0).describe(sc.factor())
		if described[d] {
			continue
		}
		described[d] = true
		var who []string
		for _, s := range o.Scenarios {
			if s.shape == sc.shape && s.factor() == sc.factor() {
				who = append(who, s.name)
			}
		}
		fmt.Fprintf(stdout, "request mix of %s: %s\n", strings.Join(who, ", "), d)
	}
	if slices.ContainsFunc(o.Responses, func(f float64) bool { return f > 0 }) {
		fmt.Fprintf(stdout, "Responses API: in a run labelled \"(N%% Responses)\", each request of the mix goes to %s with that chance (drawn per request, the same requests in every scenario), its words as the input, its max_tokens as max_output_tokens\n",
			llm.EndpointResponses)
	}
	fmt.Fprintln(stdout)

	var bin string
	if slices.ContainsFunc(o.Scenarios, func(s scenario) bool { return s.caller == callerLLMQ }) {
		var cleanup func()
		bin, cleanup, err = procs.WorkerBinary(ctx, o.WorkerBin)
		if err != nil {
			return err
		}
		defer cleanup()
	}

	var results []*result
	for _, sc := range o.runs() {
		if err := ctx.Err(); err != nil {
			return err
		}
		started := time.Now()
		fmt.Fprintf(stdout, "%s: %s: %s ...\n", started.Format(time.TimeOnly), sc.label(), sc.title())
		mix := newMix(o.Seed, sc.shape, sc.responses)
		var res *result
		if sc.caller == callerLLMQ {
			res, err = runLLMQ(ctx, o, sc, mix, bin, logger)
		} else {
			res, err = runBaseline(ctx, o, sc, mix)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", sc.label(), err)
		}
		res.scenario = sc
		if o.LogDir != "" {
			if err := writeAdmissions(o.LogDir, sc.fileName(), res.log); err != nil {
				return err
			}
		}
		results = append(results, res)
		timeline(stdout, o, res)
	}
	report(stdout, o, results)
	return nil
}
