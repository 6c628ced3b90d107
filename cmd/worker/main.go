// Command worker runs llmq's jobs: an asynq server that takes a rate-limit
// permit and a budget reservation before every provider call. It serves
// /healthz and /readyz on LLMQ_LISTEN_ADDR, and /metrics on
// LLMQ_METRICS_ADDR.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/cmdline"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	app.QuietRedis(os.Environ(), os.Stderr)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	cmdline.Exit("worker", err)
}

func usage() string {
	return `usage: worker [-h | --version]
  Runs llmq's jobs from the queues until SIGINT or SIGTERM, then gives the
  calls in flight LLMQ_SHUTDOWN_TIMEOUT. Serves /healthz and /readyz on
  LLMQ_LISTEN_ADDR and /metrics on LLMQ_METRICS_ADDR. It takes no flags:
  it is configured by its environment.

` + config.EnvHelp(config.RoleWorker) + `

Provider API keys come from the variables the policy's providers name
(api_key_env); a missing one stops the worker before it takes a job.

Exit status: 0 stopped, 1 failed (one line on stderr says why), 2 bad usage.`
}

// run starts a worker and blocks until ctx ends, then shuts down: in-flight
// jobs get LLMQ_SHUTDOWN_TIMEOUT to finish; the rest go back to their queue
// without counting as failures.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	if done, err := cmdline.ParseProgram(fs, args, stdout, usage(), "llmq worker"); done {
		return err
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
	rec, stopRec, err := a.StartRecorder(ctx)
	if err != nil {
		return err
	}
	defer stopRec()

	ln, err := net.Listen("tcp", env.ListenAddr)
	if err != nil {
		return fmt.Errorf("LLMQ_LISTEN_ADDR: %w", err)
	}
	defer ln.Close()
	mln, err := net.Listen("tcp", env.MetricsAddr)
	if err != nil {
		return fmt.Errorf("LLMQ_METRICS_ADDR: %w", err)
	}
	ms := app.MetricsServer(rec.Handler())
	go func() { _ = ms.Serve(mln) }()
	defer ms.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		// One line per service: "redis: ok", "database: connection refused".
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var body strings.Builder
		status := http.StatusOK
		for _, c := range a.ReadyChecks() {
			reason := "ok"
			if err := c.Check(ctx); err != nil {
				reason, status = api.NotReadyReason(err), http.StatusServiceUnavailable
			}
			fmt.Fprintf(&body, "%s: %s\n", c.Name, reason)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body.String())
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	srv, handlers, err := a.WorkerServer(worker.Options{})
	if err != nil {
		return err
	}
	if err := srv.Start(handlers); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	// Every worker can release the jobs waiting in the fair queue: one at a
	// time does, so jobs flow whichever processes run.
	defer app.Background(ctx, a.Scheduler().Run)()
	fmt.Fprintf(stdout, "worker running (concurrency %d, health on http://%s, metrics on http://%s/metrics)\n",
		env.WorkerConcurrency, ln.Addr(), mln.Addr())
	logger.Info("worker started", "concurrency", env.WorkerConcurrency)
	<-ctx.Done()
	logger.Info("worker stopping", "grace", env.ShutdownTimeout)
	srv.Shutdown()
	return nil
}
