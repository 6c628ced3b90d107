// Command dispatcher serves llmq's HTTP API (jobs, batches, usage, admin),
// its dashboard and metrics.
//
//	dispatcher [serve]      the API, configured by LLMQ_* variables
//	dispatcher dev          everything in one process on a bare machine
//	dispatcher healthcheck  exit 0 if the server on LLMQ_LISTEN_ADDR is ready
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dashboard"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/recovery"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
}

const usage = `usage: dispatcher [serve|dev|healthcheck]
  serve        serve the HTTP API (the default), configured by LLMQ_* variables
  dev          run all of llmq in one process on a bare machine (dispatcher dev -h)
  healthcheck  exit 0 if the dispatcher or worker on LLMQ_LISTEN_ADDR answers /readyz`

func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		if len(args) > 0 {
			return fmt.Errorf("serve takes no arguments, got %q\n%s", args, usage)
		}
		return serve(ctx, environ, stdout, stderr)
	case "dev":
		return dev(ctx, args, environ, stdout, stderr)
	case "healthcheck":
		if len(args) > 0 {
			return fmt.Errorf("healthcheck takes no arguments, got %q\n%s", args, usage)
		}
		return healthcheck(ctx, environ, stdout)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

// serve runs the API until ctx ends, then drains in-flight requests.
func serve(ctx context.Context, environ []string, stdout, stderr io.Writer) error {
	env, logger, err := app.LoadEnv(environ, config.RoleDispatcher, stderr)
	if err != nil {
		return err
	}
	a, err := app.Open(ctx, env, logger, app.Parts{LookupEnv: app.LookupIn(environ)})
	if err != nil {
		return err
	}
	defer a.Close()
	ln, err := net.Listen("tcp", env.ListenAddr)
	if err != nil {
		return fmt.Errorf("LLMQ_LISTEN_ADDR: %w", err)
	}
	rec, stopRec := startRecorder(ctx, a, logger)
	defer stopRec()
	fmt.Fprintf(stdout, "llmq dispatcher listening on http://%s\n", ln.Addr())
	return serveApp(ctx, a, rec, ln, logger, serveOptions{})
}

// startRecorder makes the process's metrics recorder (one registry per
// process) and sets it as the observer of the app's API and workers, so it
// must run before any worker is built. stop flushes it: call it after the
// workers and the HTTP server have stopped, before the app closes Redis.
func startRecorder(ctx context.Context, a *app.App, logger *slog.Logger) (rec *metrics.Recorder, stop func()) {
	rec = metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, Logger: logger})
	a.Observer, a.APIObserver = rec, rec
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { rec.Run(rctx); close(done) }()
	return rec, func() { cancel(); <-done }
}

// serveOptions are what the dispatcher and the embedded default serve
// differently.
type serveOptions struct {
	// reconciler tunes the reconciler of jobs Redis lost.
	reconciler recovery.Options
	// mount adds handlers beside the API (the embedded simulator).
	mount func(mux *http.ServeMux)
}

// serveApp serves a's API, /dashboard, /monitoring/ and /metrics on ln, and
// runs the policy watcher, the batch sweeper and the reconciler, until ctx
// ends; then it drains in-flight requests for LLMQ_SHUTDOWN_TIMEOUT.
func serveApp(ctx context.Context, a *app.App, rec *metrics.Recorder, ln net.Listener, logger *slog.Logger, o serveOptions) error {
	go a.Policy.Watch(ctx, logger)
	go a.Batches.Run(ctx)
	go a.Reconciler(o.reconciler).Run(ctx)

	srv := a.API()
	mon, err := dashboard.MountApp(srv, a, rec, dashboard.Options{})
	if err != nil {
		return err
	}
	defer mon.Close()
	if o.mount != nil {
		o.mount(srv.Mux())
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	logger.Info("dispatcher started", "addr", ln.Addr().String())

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), a.Env.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
