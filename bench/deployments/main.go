// Command deployments measures llmq routing one model's backlog over three
// deployments, each its own simulated provider account behind a proxy that
// can take it down: 600 RPM / 60,000 TPM, 300 / 30,000, and 120 / 20,000
// with Azure's rate-limit headers and its limits also enforced over fixed
// 10 s windows. llmq's real worker processes (cmd/worker, 4 × 50 by default)
// run the jobs; a producer keeps the model's fair queue full through the
// path the API takes (job rows, then the fair queue the scheduler releases
// by the deployments' room). Scenarios, each on fresh simulators, schema
// and Redis namespace:
//
//	sum       the three deployments of one order: together at the sum of
//	          their limits, each by its own count, with few 429s
//	order     org-a of order 1, the others of order 2: at a load org-a can
//	          take alone, the others get (next to) nothing; with a backlog,
//	          org-a stays at its limit and the others take the rest
//	outage    org-a refuses connections for a while mid-run: no job fails,
//	          no call reaches it (bar one probe at a time) a second after it
//	          failed, the others stay at their limits, and it is back at its
//	          limit soon after it recovers
//	fallback  every deployment down for a while: jobs of the model with a
//	          fallback finish on it at its price, jobs of a model on the same
//	          deployments without one wait, and none fails
//
// and the baseline, a client-side router without llmq (LiteLLM's
// simple-shuffle: a deployment at random in proportion to its TPM, and
// after a 429 or a failure, a sleep and another pick), as "router" (the sum
// scenario's load) and "router-outage" (the outage scenario's).
//
// In every scenario, each ledger row's cost is checked against the usage of
// its job at the price of the deployment (and model) that answered, to the
// micro-dollar. The numbers and the command are in docs/BENCHMARKS.md.
//
//	go -C bench run ./deployments            # about 20 minutes
//	go -C bench run ./deployments -quick     # about 4 minutes
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/procs"
)

func main() { benchenv.Main("deployments", run) }

// options are the command's flags.
type options struct {
	Scenarios   []string
	Warmup      time.Duration // before the steady window is measured
	Measure     time.Duration // the steady window
	Outage      time.Duration // how long deployments are down
	Processes   int
	Concurrency int
	RedisURL    string
	RedisDB     int
	DatabaseURL string
	WorkerBin   string
}

var allScenarios = []string{"sum", "order", "outage", "fallback", "router", "router-outage"}

func parseOptions(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("deployments", flag.ContinueOnError)
	scenarios := fs.String("scenarios", strings.Join(allScenarios, ","), "scenarios to run, comma-separated: "+strings.Join(allScenarios, ", "))
	quick := fs.Bool("quick", false, "shorter windows: warmup 15s, measure 45s")
	fs.DurationVar(&o.Warmup, "warmup", 60*time.Second, "time before the steady window")
	fs.DurationVar(&o.Measure, "measure", 2*time.Minute, "length of the steady window")
	fs.DurationVar(&o.Outage, "outage", 30*time.Second, "how long deployments are down (outage, fallback)")
	fs.IntVar(&o.Processes, "processes", 4, "worker processes")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "jobs each worker process runs at once")
	fs.StringVar(&o.RedisURL, "redis", benchenv.EnvOr("TEST_REDIS_URL", "redis://127.0.0.1:6379"), "Redis URL")
	fs.IntVar(&o.RedisDB, "redis-db", 13, "Redis database of the run")
	fs.StringVar(&o.DatabaseURL, "database", benchenv.EnvOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL (each scenario gets its own schema)")
	fs.StringVar(&o.WorkerBin, "worker", "", "worker binary (default: built from ./cmd/worker)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *quick {
		o.Warmup, o.Measure = 15*time.Second, 45*time.Second
	}
	for s := range strings.SplitSeq(*scenarios, ",") {
		if !slices.Contains(allScenarios, s) {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (want %s)", s, strings.Join(allScenarios, ", "))
		}
		o.Scenarios = append(o.Scenarios, s)
	}
	if o.Processes < 1 || o.Concurrency < 1 || o.Warmup <= 0 || o.Measure <= 0 || o.Outage <= 0 {
		return nil, fmt.Errorf("-processes, -concurrency, -warmup, -measure and -outage must be more than 0")
	}
	return o, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	bin, cleanup, err := procs.WorkerBinary(ctx, o.WorkerBin)
	if err != nil {
		return err
	}
	defer cleanup()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fmt.Fprintf(out, "deployments: %d worker processes x %d, warmup %v, steady window %v, outage %v\n\n",
		o.Processes, o.Concurrency, o.Warmup, o.Measure, o.Outage)
	failed := 0
	for _, name := range o.Scenarios {
		began := time.Now()
		var r *report
		var err error
		if strings.HasPrefix(name, "router") {
			r, err = runRouter(ctx, o, name == "router-outage")
		} else {
			r, err = runScenario(ctx, o, name, bin, logger)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(out, "== %s (%s)\n", name, time.Since(began).Round(time.Second))
		for _, l := range r.lines {
			fmt.Fprintln(out, "  "+l)
		}
		for _, c := range r.checks {
			mark := "met"
			if !c.ok {
				mark, failed = "MISSED", failed+1
			}
			fmt.Fprintf(out, "  %-7s %s\n", mark, c.what)
		}
		fmt.Fprintln(out)
	}
	if failed > 0 {
		return fmt.Errorf("%d target(s) missed", failed)
	}
	return nil
}
