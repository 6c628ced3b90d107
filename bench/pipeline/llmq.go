package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/cost"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/internal/app"
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
	var closers benchenv.Closers
	closeAll := closers.Close
	defer func() {
		if err != nil {
			closeAll()
		}
	}()

	l, err := inproc.Open(ctx, inproc.Options{Backends: r.o.Backends, Name: "pipeline", Policy: policyYAML, SimURL: simURL, // its limits never bind
		Environ: benchenv.Environ{Concurrency: r.o.perServer(), ShutdownTimeout: 5 * time.Second},
		OnRedis: func(rdb *redis.Client) {
			r.meter = &meter{rt: cost.CountRoundTrips(rdb), cpu: cost.NewCPUReader(rdb, r.o.DatabaseURL)}
		}}, logger, &closers)
	if err != nil {
		return nil, err
	}
	a := l.App
	r.app = a

	// The dispatcher runs the scheduler that releases jobs from the fair
	// queue into asynq's queues; llmq's stack is not whole without it.
	closers = append(closers, inproc.Loops(a.Scheduler().Run))
	url, closeAPI, err := inproc.ServeAPI(a) // the dispatcher's server and limits
	if err != nil {
		return nil, err
	}
	closers = append(closers, closeAPI)

	r.target = newTarget(url, benchenv.AdminToken, 2*r.o.Producers)
	closers = append(closers, r.target.close)

	if err := r.createTenant(ctx); err != nil {
		return nil, err
	}
	for range r.o.Servers {
		shutdown, err := inproc.StartWorker(a)
		if err != nil {
			return nil, err
		}
		closers = append(closers, shutdown)
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
