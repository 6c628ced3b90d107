package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/testutil"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// adminToken guards the run's admin API, which only the run itself reaches.
const adminToken = "bench-admin-token-0123456789"

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

// jobBody is what every producer POSTs: a small chat request.
var jobBody = []byte(`{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello to the pipeline."}],"max_tokens":16}}`)

// llmqRun is one llmq over a schema and a Redis namespace of its own, its
// API on a loopback listener, and the simulated provider.
type llmqRun struct {
	o      *options
	app    *app.App
	meter  *meter
	url    string
	client *http.Client
	key    string
	tenant string
}

// runLLMQ measures llmq end to end (POSTs to the last job succeeded, with
// workers running), then POSTs alone with no workers.
func runLLMQ(ctx context.Context, o *options, logger *slog.Logger) (e2e, api *measurement, err error) {
	r := &llmqRun{o: o}
	closeAll, err := r.open(ctx, logger)
	if err != nil {
		return nil, nil, err
	}
	defer closeAll()

	if e2e, err = r.endToEnd(ctx); err != nil {
		return nil, nil, err
	}
	if api, err = r.apiAlone(ctx); err != nil {
		return nil, nil, err
	}
	return e2e, api, nil
}

// open starts everything and returns what stops it, in reverse order.
func (r *llmqRun) open(ctx context.Context, logger *slog.Logger) (_ func(), err error) {
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
	r.meter = &meter{rt: rt, cpu: newCPUReader(rdb, r.o.DatabaseURL)}

	ss := sim.Start(sim.Config{Limits: sim.Limits{RPM: 10_000_000, TPM: 10_000_000_000}, DefaultMaxTokens: 1024})
	closers = append(closers, ss.Close)

	dir, err := os.MkdirTemp("", "llmq-bench-")
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = os.RemoveAll(dir) })
	policyPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(strings.ReplaceAll(policyYAML, "{{SIM}}", ss.BaseURL)), 0o600); err != nil {
		return nil, err
	}

	redisURL, err := withRedisDB(r.o.RedisURL, r.o.RedisDB)
	if err != nil {
		return nil, err
	}
	ns := "bench-" + testutil.RandomHex(4)
	environ := []string{
		"LLMQ_REDIS_URL=" + redisURL,
		"LLMQ_DATABASE_URL=" + dsn,
		"LLMQ_POLICY=" + policyPath,
		"LLMQ_ADMIN_TOKEN=" + adminToken,
		"LLMQ_KEY_PREFIX=" + ns,
		"LLMQ_QUEUE_NAMESPACE=" + ns,
		"LLMQ_LISTEN_ADDR=127.0.0.1:0",
		"LLMQ_WORKER_CONCURRENCY=" + strconv.Itoa(r.o.perServer()),
		"LLMQ_SHUTDOWN_TIMEOUT=5s",
		"SIM_API_KEY=bench",
	}
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

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := api.NewHTTPServer(a.API(), api.ServerOptions{}) // the dispatcher's server and limits
	go func() { _ = hs.Serve(ln) }()
	closers = append(closers, func() { _ = hs.Close() })
	r.url = "http://" + ln.Addr().String()

	// Go's default keeps 2 idle connections per host: the other producers
	// would dial a new connection for every POST.
	tr := &http.Transport{MaxIdleConns: r.o.Producers, MaxIdleConnsPerHost: r.o.Producers}
	closers = append(closers, tr.CloseIdleConnections)
	r.client = &http.Client{Transport: tr, Timeout: 30 * time.Second}

	if err := r.createTenant(ctx); err != nil {
		return nil, err
	}
	return closeAll, nil
}

// endToEnd runs the warm-up, then Jobs jobs from the first POST to the last
// success, and checks that every one succeeded.
func (r *llmqRun) endToEnd(ctx context.Context) (*measurement, error) {
	var fin finishes
	for range r.o.Servers {
		srv, mux := r.app.WorkerServer(worker.Options{})
		mux.Use(fin.middleware)
		if err := srv.Start(mux); err != nil {
			return nil, err
		}
		defer srv.Shutdown()
	}

	warm := fin.start(r.o.Warmup)
	if _, err := r.post(ctx, r.o.Warmup); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if err := warm.wait(ctx, r.o.Timeout); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}

	stopProfile, err := startProfiles(r.o.CPUProfile, r.o.Trace, r.o.MemProfile)
	if err != nil {
		return nil, err
	}
	defer stopProfile()
	u := r.meter.read(ctx)
	f := fin.start(r.o.Jobs)
	start := time.Now()
	res, err := r.post(ctx, r.o.Jobs)
	if err != nil {
		return nil, err
	}
	if err := f.wait(ctx, r.o.Timeout); err != nil {
		return nil, err
	}
	m := &measurement{jobs: r.o.Jobs, elapsed: f.at.Sub(start), post: res.lat, postSpan: res.span}
	m.usage = r.meter.since(ctx, u)
	m.busy = time.Duration(f.busy.Load())
	stopProfile()
	if err := r.verify(ctx, res.ids); err != nil {
		return nil, err
	}
	return m, nil
}

// apiAlone POSTs Jobs jobs with no worker running: the API's own latency.
// The jobs stay queued; the run's queues are deleted at the end.
func (r *llmqRun) apiAlone(ctx context.Context) (*measurement, error) {
	u := r.meter.read(ctx)
	res, err := r.post(ctx, r.o.Jobs)
	if err != nil {
		return nil, err
	}
	m := &measurement{jobs: r.o.Jobs, elapsed: res.span, post: res.lat, postSpan: res.span}
	m.usage = r.meter.since(ctx, u)
	return m, nil
}

// posted is what a round of POSTs returned.
type posted struct {
	ids  []string
	lat  latencies
	span time.Duration // first POST sent to last answer read
}

// post POSTs n jobs from the producers, timing each round trip.
func (r *llmqRun) post(ctx context.Context, n int) (*posted, error) {
	res := &posted{ids: make([]string, n), lat: make(latencies, n)}
	start := time.Now()
	defer func() { res.span = time.Since(start) }()
	err := produce(ctx, n, r.o.Producers, func(ctx context.Context, i int) error {
		t0 := time.Now()
		status, body, err := r.do(ctx, "POST", "/v1/jobs", "Bearer "+r.key, jobBody)
		res.lat[i] = time.Since(t0)
		if err != nil {
			return err
		}
		if status != http.StatusAccepted {
			return fmt.Errorf("POST /v1/jobs: %d %s", status, body)
		}
		var job struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(body, &job); err != nil || job.ID == "" {
			return fmt.Errorf("POST /v1/jobs: no job id in %s", body)
		}
		res.ids[i] = job.ID
		return nil
	})
	return res, err
}

func (r *llmqRun) do(ctx context.Context, method, path, auth string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, r.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// createTenant makes the run's tenant and its key through the admin API.
func (r *llmqRun) createTenant(ctx context.Context) error {
	status, body, err := r.do(ctx, "POST", "/admin/v1/tenants", "Bearer "+adminToken, []byte(`{"name":"bench","tier":"bench"}`))
	if err != nil {
		return err
	}
	var t struct {
		ID string `json:"id"`
	}
	if status != http.StatusCreated || json.Unmarshal(body, &t) != nil {
		return fmt.Errorf("create tenant: %d %s", status, body)
	}
	status, body, err = r.do(ctx, "POST", "/admin/v1/tenants/"+t.ID+"/keys", "Bearer "+adminToken, nil)
	if err != nil {
		return err
	}
	var k struct {
		Key string `json:"key"`
	}
	if status != http.StatusCreated || json.Unmarshal(body, &k) != nil || k.Key == "" {
		return fmt.Errorf("create key: %d %s", status, body)
	}
	r.tenant, r.key = t.ID, k.Key
	return nil
}

// verify checks that every job of ids succeeded, reading the tenant's
// succeeded jobs a thousand at a time once the run is over.
func (r *llmqRun) verify(ctx context.Context, ids []string) error {
	succeeded := make(map[string]bool, len(ids)+r.o.Warmup)
	after := ""
	for {
		page, more, err := r.app.Store.JobList(ctx, &store.JobListParams{
			TenantID: r.tenant, Status: store.JobSucceeded, After: after, Limit: 1000})
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		for _, j := range page {
			succeeded[j.ID] = true
		}
		if !more || len(page) == 0 {
			break
		}
		after = page[len(page)-1].ID
	}
	missing := 0
	example := ""
	for _, id := range ids {
		if !succeeded[id] {
			missing++
			example = id
		}
	}
	if missing > 0 {
		j, err := r.app.Store.JobGetByID(ctx, example)
		if err != nil {
			return fmt.Errorf("verify: %d of %d jobs did not succeed; job %s: %w", missing, len(ids), example, err)
		}
		return fmt.Errorf("verify: %d of %d jobs did not succeed; job %s is %s (error %v)", missing, len(ids), example, j.Status, j.Error)
	}
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
