// Command pipeline measures what llmq's job pipeline costs on top of asynq:
// in one run, over the same Redis and Postgres, it pushes the same number of
// jobs through bare asynq (enqueue with a task id, a handler that does
// nothing) and through llmq end to end (POST /v1/jobs over loopback HTTP,
// in-process workers, the simulated provider with zero latency and limits
// that never bind), and reports both rates, their ratio, and the latency of
// POST /v1/jobs with workers running and with none. The numbers and the
// command that produced them are in docs/BENCHMARKS.md.
//
//	go run ./bench/pipeline -jobs 5000
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
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	Jobs        int
	Warmup      int
	Concurrency int
	Producers   int
	Servers     int
	RedisURL    string
	RedisDB     int
	DatabaseURL string
	Timeout     time.Duration
	CPUProfile  string
	Trace       string
	MemProfile  string
}

// pollInterval is llmq's worker poll interval (worker.ServerOptions'
// default), given to the bare asynq server too so that both find new work
// equally fast.
const pollInterval = 200 * time.Millisecond

func parseOptions(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.IntVar(&o.Jobs, "jobs", 5000, "jobs per measurement")
	fs.IntVar(&o.Warmup, "warmup", 200, "jobs run through each pipeline before it is measured (connections, prepared statements)")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "worker concurrency (asynq Concurrency), the same for both pipelines")
	fs.IntVar(&o.Producers, "producers", 20, "goroutines enqueueing or POSTing at once")
	fs.IntVar(&o.Servers, "servers", 1, "asynq servers per pipeline (each dequeues on its own), sharing -concurrency between them")
	fs.StringVar(&o.RedisURL, "redis", envOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis server (its database number is replaced by -redis-db)")
	fs.IntVar(&o.RedisDB, "redis-db", 10, "Redis database (10 is bench/'s, docs/ARCHITECTURE.md)")
	fs.StringVar(&o.DatabaseURL, "database", envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"Postgres database; the run creates a schema of its own there and drops it at the end")
	fs.DurationVar(&o.Timeout, "timeout", time.Minute, "longest wait for one measurement to finish")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the llmq end-to-end measurement to this file")
	fs.StringVar(&o.MemProfile, "memprofile", "", "write an allocation profile, taken when the llmq end-to-end measurement ends, to this file")
	fs.StringVar(&o.Trace, "trace", "", "write an execution trace of the llmq end-to-end measurement to this file (go tool trace)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.Jobs < 1:
		return nil, fmt.Errorf("-jobs must be at least 1, got %d", o.Jobs)
	case o.Warmup < 0:
		return nil, fmt.Errorf("-warmup must not be negative, got %d", o.Warmup)
	case o.Concurrency < 1:
		return nil, fmt.Errorf("-concurrency must be at least 1, got %d", o.Concurrency)
	case o.Servers < 1 || o.Servers > o.Concurrency:
		return nil, fmt.Errorf("-servers must be from 1 to -concurrency (%d), got %d", o.Concurrency, o.Servers)
	case o.Producers < 1:
		return nil, fmt.Errorf("-producers must be at least 1, got %d", o.Producers)
	case o.RedisDB < 0:
		return nil, fmt.Errorf("-redis-db must not be negative, got %d", o.RedisDB)
	case o.Timeout <= 0:
		return nil, fmt.Errorf("-timeout must be positive, got %v", o.Timeout)
	}
	return o, nil
}

// perServer is each server's share of the concurrency, rounded up.
func (o *options) perServer() int { return (o.Concurrency + o.Servers - 1) / o.Servers }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// run measures bare asynq, then llmq end to end, then the API alone, and
// prints the table. Missing the target is a result, not an error.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	// Warnings only: a warning during a run (a failed enqueue, a slow
	// settle) is worth seeing next to the numbers.
	logger := slog.New(slog.NewTextHandler(stdout, &slog.HandlerOptions{Level: slog.LevelWarn}))

	bare, err := runBare(ctx, o, logger)
	if err != nil {
		return fmt.Errorf("bare asynq: %w", err)
	}
	e2e, api, err := runLLMQ(ctx, o, logger)
	if err != nil {
		return fmt.Errorf("llmq: %w", err)
	}
	report(stdout, o, bare, e2e, api)
	return nil
}
