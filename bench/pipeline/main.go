// Command pipeline measures llmq's job pipeline end to end as a client sees
// it, against the stack a team would wire by hand from the same parts
// (handwired.go): in one run, over the same Redis, Postgres and simulated
// provider (zero latency, limits that never bind), the same client code
// POSTs jobs to each over loopback HTTP and polls every job until it
// succeeded (driver.go), for several rounds, and the run reports both rates
// and their ratio per round. Bare asynq (enqueue with a task id, a no-op
// handler) is measured beside them as a floor: it is asynq's cost, not a
// job pipeline's. Then, at a light load (a fixed rate of POSTs with the
// workers running), it reports the latency of POST /v1/jobs on both. The
// numbers and the command that produced them are in docs/BENCHMARKS.md.
//
//	go -C bench run ./pipeline -jobs 3000 -rounds 3
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/internal/llm/sim"
)

func main() { benchenv.Main("pipeline", run) }

// options are the command's flags.
type options struct {
	Jobs        int
	Rounds      int
	LightJobs   int
	LightRate   float64
	Warmup      int
	Concurrency int
	Producers   int
	Servers     int
	Timeout     time.Duration
	CPUProfile  string
	Trace       string
	MemProfile  string
	benchenv.Backends
}

// pollInterval and delayedInterval are llmq's worker's intervals
// (worker.ServerOptions' PollInterval default, and how often its first
// dequeuer moves delayed tasks), given to the hand-wired stack and the bare
// asynq server too so that all find new work equally fast.
const (
	pollInterval    = 50 * time.Millisecond
	delayedInterval = 200 * time.Millisecond
)

func parseOptions(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.IntVar(&o.Jobs, "jobs", 3000, "jobs per measurement")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds; each measures bare asynq, llmq and the hand-wired stack")
	fs.IntVar(&o.LightJobs, "light-jobs", 1000, "jobs POSTed at -light-rate for the latency at light load")
	fs.Float64Var(&o.LightRate, "light-rate", 100, "POSTs per second at light load")
	fs.IntVar(&o.Warmup, "warmup", 200, "jobs run through each pipeline before it is measured (connections, prepared statements)")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "worker concurrency (asynq Concurrency), the same for both pipelines")
	fs.IntVar(&o.Producers, "producers", 20, "goroutines enqueueing or POSTing at once")
	fs.IntVar(&o.Servers, "servers", 1, "asynq servers per pipeline (each dequeues on its own), sharing -concurrency between them")
	o.Backends.Flags(fs, "the run")
	fs.DurationVar(&o.Timeout, "timeout", time.Minute, "longest wait for one measurement to finish")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of llmq's first round to this file")
	fs.StringVar(&o.MemProfile, "memprofile", "", "write an allocation profile, taken when llmq's first round ends, to this file")
	fs.StringVar(&o.Trace, "trace", "", "write an execution trace of llmq's first round to this file (go tool trace)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.Jobs < 1:
		return nil, fmt.Errorf("-jobs must be at least 1, got %d", o.Jobs)
	case o.Rounds < 1:
		return nil, fmt.Errorf("-rounds must be at least 1, got %d", o.Rounds)
	case o.LightJobs < 0:
		return nil, fmt.Errorf("-light-jobs must not be negative, got %d", o.LightJobs)
	case o.LightRate <= 0:
		return nil, fmt.Errorf("-light-rate must be positive, got %v", o.LightRate)
	case o.Warmup < 0:
		return nil, fmt.Errorf("-warmup must not be negative, got %d", o.Warmup)
	case o.Concurrency < 1:
		return nil, fmt.Errorf("-concurrency must be at least 1, got %d", o.Concurrency)
	case o.Servers < 1 || o.Servers > o.Concurrency:
		return nil, fmt.Errorf("-servers must be from 1 to -concurrency (%d), got %d", o.Concurrency, o.Servers)
	case o.Producers < 1:
		return nil, fmt.Errorf("-producers must be at least 1, got %d", o.Producers)
	case o.Timeout <= 0:
		return nil, fmt.Errorf("-timeout must be positive, got %v", o.Timeout)
	}
	if err := o.Backends.Check(); err != nil {
		return nil, err
	}
	return o, nil
}

// perServer is each server's share of the concurrency, rounded up.
func (o *options) perServer() int { return (o.Concurrency + o.Servers - 1) / o.Servers }

// run opens llmq and the hand-wired stack, measures every round, then the
// light load, and prints the tables. Missing the target is a result, not an
// error.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args, stdout)
	if err != nil {
		return err
	}
	// Warnings only: a warning during a run (a failed enqueue, a slow
	// settle) is worth seeing next to the numbers.
	logger := slog.New(slog.NewTextHandler(stdout, &slog.HandlerOptions{Level: slog.LevelWarn}))

	ss := sim.Start(sim.Config{Limits: sim.Limits{RPM: 10_000_000, TPM: 10_000_000_000}, DefaultMaxTokens: 1024})
	defer ss.Close()
	l := &llmqRun{o: o}
	closeLLMQ, err := l.open(ctx, ss.BaseURL, logger)
	if err != nil {
		return fmt.Errorf("llmq: %w", err)
	}
	defer closeLLMQ()
	hw, closeHW, err := openHandWired(ctx, o, ss.BaseURL, logger)
	if err != nil {
		return fmt.Errorf("hand-wired: %w", err)
	}
	defer closeHW()

	stacks := []struct {
		name string
		t    *target
		mt   *meter
	}{{"llmq", l.target, l.meter}, {"hand-wired", hw.target, hw.meter}}
	flat := drive{n: o.Jobs, producers: o.Producers, timeout: o.Timeout}
	for _, s := range stacks {
		w := flat
		w.n = o.Warmup
		if o.Warmup > 0 {
			if _, err := w.run(ctx, s.t); err != nil {
				return fmt.Errorf("%s: warm-up: %w", s.name, err)
			}
		}
	}

	var rounds []round
	for i := range o.Rounds {
		var rd round
		if rd.bare, err = runBare(ctx, o, logger); err != nil {
			return fmt.Errorf("bare asynq: %w", err)
		}
		// The order alternates, so neither stack always runs on what the
		// other left behind (Postgres' dead rows, a warm cache).
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, k := range order {
			s := stacks[k]
			var stop func()
			if k == 0 && i == 0 {
				if stop, err = startProfiles(o.CPUProfile, o.Trace, o.MemProfile); err != nil {
					return err
				}
			}
			m, err := measure(ctx, flat, s.t, s.mt)
			if stop != nil {
				stop()
			}
			if err != nil {
				return fmt.Errorf("%s: round %d: %w", s.name, i+1, err)
			}
			if k == 0 {
				rd.llmq = m
			} else {
				rd.hw = m
			}
		}
		rounds = append(rounds, rd)
	}

	var light [2]*measurement
	if o.LightJobs > 0 {
		paced := drive{n: o.LightJobs, producers: o.Producers, rate: o.LightRate, timeout: o.Timeout}
		for k, s := range stacks {
			if light[k], err = measure(ctx, paced, s.t, s.mt); err != nil {
				return fmt.Errorf("%s: light load: %w", s.name, err)
			}
		}
	}
	report(stdout, o, rounds, light)
	return nil
}

// round is one round's measurements.
type round struct{ bare, llmq, hw *measurement }

// measure drives t once and reads the usage around it.
func measure(ctx context.Context, d drive, t *target, mt *meter) (*measurement, error) {
	u := mt.read(ctx)
	res, err := d.run(ctx, t)
	if err != nil {
		return nil, err
	}
	return &measurement{jobs: res.jobs, elapsed: res.elapsed, post: res.post, postSpan: res.postSpan,
		gets: res.gets, usage: mt.since(ctx, u)}, nil
}
