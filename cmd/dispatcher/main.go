// Command dispatcher serves llmq's HTTP API (jobs, batches, usage, admin),
// its dashboard and metrics.
//
//	dispatcher [serve]   the API, configured by LLMQ_* variables
package main

import (
	"context"
	"errors"
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

const usage = `usage: dispatcher [serve]
  serve   serve the HTTP API (the default), configured by LLMQ_* variables`

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
	go a.Policy.Watch(ctx, logger)
	go a.Batches.Run(ctx)
	go a.Reconciler(recovery.Options{}).Run(ctx)

	ln, err := net.Listen("tcp", env.ListenAddr)
	if err != nil {
		return fmt.Errorf("LLMQ_LISTEN_ADDR: %w", err)
	}
	// One registry per process: the API's events, the shared state read at
	// scrape time, and asynq's queues; /dashboard, /monitoring/ and
	// /metrics sit beside the API.
	rec := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, Logger: logger})
	a.Observer, a.APIObserver = rec, rec
	rctx, stopRec := context.WithCancel(context.WithoutCancel(ctx))
	recDone := make(chan struct{})
	go func() { rec.Run(rctx); close(recDone) }()
	// It records until the drained requests are counted, and flushes
	// before Redis closes.
	defer func() { stopRec(); <-recDone }()
	srv := a.API()
	mon, err := dashboard.MountApp(srv, a, rec, dashboard.Options{})
	if err != nil {
		return err
	}
	defer mon.Close()
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Fprintf(stdout, "llmq dispatcher listening on http://%s\n", ln.Addr())
	logger.Info("dispatcher started", "addr", ln.Addr().String())

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), env.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
