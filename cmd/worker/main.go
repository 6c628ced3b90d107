// Command worker runs llmq's jobs: an asynq server that takes a rate-limit
// permit and a budget reservation before every provider call. It serves
// /healthz, /readyz and /metrics on LLMQ_LISTEN_ADDR.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// run starts a worker and blocks until ctx ends, then shuts down: in-flight
// jobs get LLMQ_SHUTDOWN_TIMEOUT to finish; the rest go back to their queue
// without counting as failures.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q; the worker is configured by LLMQ_* variables", args)
	}
	env, logger, err := app.LoadEnv(environ, config.RoleWorker, stderr)
	if err != nil {
		return err
	}
	lookup := app.LookupIn(environ)
	// A missing provider key stops the worker instead of failing every job,
	// and is told before connecting to anything.
	policy, err := config.NewPolicyHolder(env.Policy, nil)
	if err != nil {
		return err
	}
	if err := policy.Current().CheckAPIKeys(lookup); err != nil {
		return err
	}
	a, err := app.Open(ctx, env, logger, app.Parts{Policy: policy, LookupEnv: lookup})
	if err != nil {
		return err
	}
	defer a.Close()
	go a.Policy.Watch(ctx, logger)
	// The worker's events go to a registry of its own, served on /metrics
	// (Prometheus sums the workers). It records until the jobs finishing in
	// the shutdown grace period are counted, and flushes before Redis closes.
	rec := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, Logger: logger})
	a.Observer = rec
	rctx, stopRec := context.WithCancel(context.WithoutCancel(ctx))
	recDone := make(chan struct{})
	go func() { rec.Run(rctx); close(recDone) }()
	defer func() { stopRec(); <-recDone }()

	ln, err := net.Listen("tcp", env.ListenAddr)
	if err != nil {
		return fmt.Errorf("LLMQ_LISTEN_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("GET /metrics", rec.Handler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.Ready(r.Context()); err != nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	srv, handlers := a.WorkerServer(worker.Options{})
	if err := srv.Start(handlers); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	fmt.Fprintf(stdout, "worker running (concurrency %d, health on http://%s)\n", env.WorkerConcurrency, ln.Addr())
	logger.Info("worker started", "concurrency", env.WorkerConcurrency)
	<-ctx.Done()
	logger.Info("worker stopping", "grace", env.ShutdownTimeout)
	srv.Shutdown()
	return nil
}
