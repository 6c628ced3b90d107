// Command dispatcher serves llmq's HTTP API (jobs, batches, usage, admin),
// its dashboard and metrics.
//
//	dispatcher [serve]      the API, configured by LLMQ_* variables
//	dispatcher dev          everything in one process on a bare machine
//	dispatcher migrate      up, down or status of the database's schema
//	dispatcher healthcheck  exit 0 if the server on LLMQ_LISTEN_ADDR is ready
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/cmdline"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dashboard"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/recovery"
	"github.com/llmq/llmq/internal/retention"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	app.QuietRedis(os.Environ(), os.Stderr)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	cmdline.Exit("dispatcher", err)
}

const usage = `usage: dispatcher [COMMAND] [FLAGS]
  serve        serve the HTTP API, dashboard and /metrics (the default),
               configured by LLMQ_* variables (dispatcher serve -h lists them)
  dev          run all of llmq in one process on a bare machine (dispatcher dev -h)
  migrate      up|down|status: apply, revert or list the schema's migrations
               (LLMQ_DATABASE_URL); serve and the workers never migrate
  healthcheck  exit 0 if the dispatcher (or, with -worker, the worker) on
               LLMQ_LISTEN_ADDR answers /readyz
  version      print the version (also --version)
  help         print this help (also -h, --help)

Exit status: 0 done, 1 failed (one line on stderr says why), 2 bad usage.`

func serveUsage() string {
	return `usage: dispatcher serve
  Serves llmq's HTTP API, /dashboard and /monitoring/ on LLMQ_LISTEN_ADDR,
  /metrics for Prometheus on LLMQ_METRICS_ADDR, and runs the reconciler and
  the batch sweeper, until SIGINT or SIGTERM. It takes no flags.

` + config.EnvHelp(config.RoleDispatcher) + `

Provider API keys come from the variables the policy's providers name
(api_key_env); the dispatcher reads them only through the policy.`
}

func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && (!strings.HasPrefix(args[0], "-") || cmdline.IsHelp(args[0]) || cmdline.IsVersion(args[0])) {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch {
	case cmd == "serve":
		if err = cmdline.Parse(flag.NewFlagSet("serve", flag.ContinueOnError), args, stdout, serveUsage()); err == nil {
			return serve(ctx, environ, stdout, stderr)
		}
	case cmd == "dev":
		err = dev(ctx, args, environ, stdout, stderr)
	case cmd == "migrate":
		err = migrate(ctx, args, environ, stdout, stderr)
	case cmd == "healthcheck":
		err = healthcheck(ctx, args, environ, stdout)
	case cmdline.IsHelp(cmd):
		if len(args) > 0 && !cmdline.IsHelp(args[0]) { // help COMMAND
			return run(ctx, []string{args[0], "-h"}, environ, stdout, stderr)
		}
		fmt.Fprintln(stdout, usage)
		return nil
	case cmdline.IsVersion(cmd):
		cmdline.PrintVersion(stdout, "llmq dispatcher")
		return nil
	default:
		return cmdline.Usagef("unknown command %q (dispatcher help lists the commands)", cmd)
	}
	if errors.Is(err, cmdline.ErrHelpShown) {
		return nil
	}
	return err
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
	defer ln.Close()
	mln, err := net.Listen("tcp", env.MetricsAddr)
	if err != nil {
		return fmt.Errorf("LLMQ_METRICS_ADDR: %w", err)
	}
	defer mln.Close()
	rec, stopRec, err := a.StartRecorder(ctx)
	if err != nil {
		return err
	}
	defer stopRec()
	fmt.Fprintf(stdout, "llmq dispatcher listening on http://%s (metrics on http://%s/metrics)\n", ln.Addr(), mln.Addr())
	return serveApp(ctx, a, rec, ln, logger, serveOptions{metrics: mln})
}

// serveOptions are what the embedded default serves differently.
type serveOptions struct {
	reconciler recovery.Options
	// mount adds handlers beside the API (the embedded simulator).
	mount func(mux *http.ServeMux)
	// metrics, when set, serves /metrics without credentials.
	metrics net.Listener
}

// serveApp serves a's API, /dashboard, /monitoring/ and /metrics on ln, and
// runs the dispatcher's background work, until ctx ends; then it drains
// in-flight requests for LLMQ_SHUTDOWN_TIMEOUT.
func serveApp(ctx context.Context, a *app.App, rec *metrics.Recorder, ln net.Listener, logger *slog.Logger, o serveOptions) error {
	go a.Policy.Watch(ctx, logger)
	go a.Batches.Run(ctx)
	go a.Offload.Run(ctx)
	go a.Reconciler(o.reconciler).Run(ctx)
	go a.Purger().Run(ctx, retention.Interval)
	schedCtx, stopScheduler := context.WithCancel(ctx)
	schedDone := make(chan struct{})
	go func() { a.Scheduler().Run(schedCtx); close(schedDone) }()
	// The scheduler's last release is enqueued before the app closes.
	defer func() { stopScheduler(); <-schedDone }()

	srv, err := a.API()
	if err != nil {
		return err
	}
	mon, err := dashboard.MountApp(srv, a, rec, dashboard.Options{})
	if err != nil {
		return err
	}
	defer mon.Close()
	if o.mount != nil {
		o.mount(srv.Mux())
	}
	hs := api.NewHTTPServer(srv, api.ServerOptions{})
	errc := make(chan error, 2)
	go func() { errc <- hs.Serve(ln) }()
	if o.metrics != nil {
		ms := app.MetricsServer(rec.Handler())
		go func() { errc <- ms.Serve(o.metrics) }()
		defer ms.Close()
	}
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
