package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/cost"
	"github.com/llmq/llmq/internal/testutil"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/worker"
)

// policyYAML has one simulated provider (base_url filled in) and one model
// and tier whose limits are far above what two cores can push: the run
// measures the pipeline, not rate limiting or budgets (both are still
// taken and settled for every job, as always).
const policyYAML = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 10s
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 10000000, tpm: 10000000000}
    max_output_tokens: 1024
tiers:
  - name: bench
    daily_budget_usd: 1000000
    priority: default
    on_exhausted: defer
    api_rps: 1000000
`

// llmqRun is one llmq over a schema and a Redis namespace of its own, its
// API on a loopback listener and its workers running, calling the
// simulator.
type llmqRun struct {
	o      *options
	app    *app.App
	meter  *meter
	target *target
	tenant string
}

// open starts everything and returns what stops it, in reverse order.
func (r *llmqRun) open(ctx context.Context, simURL string, logger *slog.Logger) (_ func(), err error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()

	dsn, drop, err := testutil.NewSchema(ctx, r.o.DatabaseURL, "bench_")
	if err != nil {
		return nil, err
	}
	closers = append(closers, drop)

	rdb, rt, err := newRedis(ctx, r.o.RedisURL, r.o.RedisDB)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = rdb.Close() })
	r.meter = &meter{rt: rt, cpu: cost.NewCPUReader(rdb, r.o.DatabaseURL)}

	dir, err := os.MkdirTemp("", "llmq-bench-")
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = os.RemoveAll(dir) })
	policyPath, err := benchenv.WritePolicy(dir, policyYAML, simURL, 0, 0) // its limits never bind
	if err != nil {
		return nil, err
	}

	redisURL, err := withRedisDB(r.o.RedisURL, r.o.RedisDB)
	if err != nil {
		return nil, err
	}
	ns := "bench-" + testutil.RandomHex(4)
	environ := benchenv.Environ{RedisURL: redisURL, DatabaseURL: dsn, PolicyPath: policyPath, Namespace: ns,
		Concurrency: r.o.perServer(), ShutdownTimeout: 5 * time.Second}.List()
	a, err := app.OpenEnviron(ctx, environ, config.RoleDispatcher, logger, app.Parts{Redis: rdb})
	if err != nil {
		return nil, err
	}
	closers = append(closers, a.Close)
	closers = append(closers, func() { testutil.PurgeRedis(rdb, a.Queue.Namespace().Queues(), a.Keys.Prefix()) })
	r.app = a

	// The dispatcher runs the scheduler that releases jobs from the fair
	// queue into asynq's queues; llmq's stack is not whole without it.
	sctx, stopScheduler := context.WithCancel(context.Background())
	schedDone := make(chan struct{})
	go func() { a.Scheduler().Run(sctx); close(schedDone) }()
	closers = append(closers, func() { stopScheduler(); <-schedDone })

	srv, err := a.API()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs, err := api.NewHTTPServer(srv, api.ServerOptions{}) // the dispatcher's server and limits
	if err != nil {
		return nil, err
	}
	go func() { _ = hs.Serve(ln) }()
	closers = append(closers, func() { _ = hs.Close() })

	r.target = newTarget("http://"+ln.Addr().String(), benchenv.AdminToken, 2*r.o.Producers)
	closers = append(closers, r.target.close)

	if err := r.createTenant(ctx); err != nil {
		return nil, err
	}
	for range r.o.Servers {
		srv, mux, err := a.WorkerServer(worker.Options{})
		if err != nil {
			return nil, err
		}
		if err := srv.Start(mux); err != nil {
			return nil, err
		}
		closers = append(closers, srv.Shutdown)
	}
	return closeAll, nil
}

// createTenant makes the run's tenant and its key through the admin API.
func (r *llmqRun) createTenant(ctx context.Context) error {
	status, body, err := r.target.do(ctx, "POST", "/admin/v1/tenants", []byte(`{"name":"bench","tier":"bench"}`))
	if err != nil {
		return err
	}
	var t struct {
		ID string `json:"id"`
	}
	if status != http.StatusCreated || json.Unmarshal(body, &t) != nil {
		return fmt.Errorf("create tenant: %d %s", status, body)
	}
	status, body, err = r.target.do(ctx, "POST", "/admin/v1/tenants/"+t.ID+"/keys", nil)
	if err != nil {
		return err
	}
	var k struct {
		Key string `json:"key"`
	}
	if status != http.StatusCreated || json.Unmarshal(body, &k) != nil || k.Key == "" {
		return fmt.Errorf("create key: %d %s", status, body)
	}
	r.tenant, r.target.key = t.ID, k.Key
	return nil
}

// withRedisDB returns rawURL with its database number replaced by db.
func withRedisDB(rawURL string, db int) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("-redis: %w", err)
	}
	u.Path = "/" + strconv.Itoa(db)
	return u.String(), nil
}

// startProfiles starts a CPU profile, an execution trace and an allocation
// profile to the files named (any may be ""), and returns what stops them
// and writes them; it may be called more than once.
func startProfiles(cpuPath, tracePath, memPath string) (stop func(), err error) {
	var stops []func()
	stopAll := func() {
		for _, s := range stops {
			s()
		}
		stops = nil
	}
	start := func(flag, path string, begin func(io.Writer) error, end func()) error {
		if path == "" {
			return nil
		}
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		}
		if err := begin(f); err != nil {
			_ = f.Close()
			return fmt.Errorf("%s: %w", flag, err)
		}
		stops = append(stops, func() { end(); _ = f.Close() })
		return nil
	}
	if err := start("-cpuprofile", cpuPath, pprof.StartCPUProfile, pprof.StopCPUProfile); err != nil {
		return nil, err
	}
	if err := start("-trace", tracePath, trace.Start, trace.Stop); err != nil {
		stopAll()
		return nil, err
	}
	// The allocs profile counts from the process start: the bare asynq
	// run and the warm-ups are in it too, a few percent of the whole.
	var mem io.Writer
	if err := start("-memprofile", memPath, func(w io.Writer) error { mem = w; return nil },
		func() { _ = pprof.Lookup("allocs").WriteTo(mem, 0) }); err != nil {
		stopAll()
		return nil, err
	}
	return stopAll, nil
}
