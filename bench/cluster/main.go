// Command cluster measures llmq's job pipeline (bench/pipeline's shape:
// jobs POSTed over loopback HTTP by concurrent producers, run by in-process
// workers against a simulated provider that answers at once) with jobs
// spread over several models and tenants, once on one Redis node and once
// on a three-master Redis Cluster, in the same run: jobs per second, and
// the CPU each Redis server (each shard) spent per job. Each model is its
// own limiter scope and fair queue, and each tenant's budget day its own
// hash, under their own hash tags, so on a cluster they spread over the
// shards; asynq's jobs queue and the global budget day (under
// -global-cap-usd) each live on one. The numbers and the command are in
// docs/BENCHMARKS.md.
//
//	go -C bench run ./cluster -jobs 4000 -rounds 3
//
// The cluster is the one scripts/services starts (TEST_REDIS_CLUSTER_URL);
// on one machine its three servers share its cores with the single node's
// runs, the workers and the API, so the cluster's jobs/s here says what its
// routing costs, not what three hosts would reach.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/redisconn"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

func main() { benchenv.Main("cluster", run) }

type options struct {
	Jobs, Rounds, Models, Tenants, Concurrency, Producers, Warmup int
	GlobalCapUSD                                                  float64
	Single, Cluster, DatabaseURL                                  string
	Timeout                                                       time.Duration
}

func parseOptions(args []string, out io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.IntVar(&o.Jobs, "jobs", 4000, "jobs per measurement")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds; each measures one node, then the cluster")
	fs.IntVar(&o.Models, "models", 8, "models the jobs spread over, each its own limiter scope and fair queue")
	fs.IntVar(&o.Tenants, "tenants", 8, "tenants the jobs spread over, each its own budget day")
	fs.Float64Var(&o.GlobalCapUSD, "global-cap-usd", 0, "the policy's global daily cap (0: none; then no job touches the global day)")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "worker concurrency")
	fs.IntVar(&o.Producers, "producers", 20, "goroutines POSTing at once")
	fs.IntVar(&o.Warmup, "warmup", 200, "jobs run before each measurement")
	fs.StringVar(&o.Single, "redis", benchenv.EnvOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/10"), "the one-node Redis")
	fs.StringVar(&o.Cluster, "cluster", benchenv.EnvOr("TEST_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303"),
		"the Redis Cluster (scripts/services starts one)")
	fs.StringVar(&o.DatabaseURL, "database", benchenv.EnvOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"Postgres; each measurement makes a schema of its own and drops it")
	fs.DurationVar(&o.Timeout, "timeout", 3*time.Minute, "longest wait for one measurement")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.Jobs < 1 || o.Rounds < 1 || o.Models < 1 || o.Tenants < 1 || o.Concurrency < 1 || o.Producers < 1 || o.Warmup < 0:
		return nil, errors.New("-jobs, -rounds, -models, -tenants, -concurrency and -producers must be at least 1, -warmup not negative")
	case !(o.GlobalCapUSD >= 0):
		return nil, errors.New("-global-cap-usd must not be negative")
	}
	return o, nil
}

// policy has one simulated provider and o.Models models on it, each its own
// upstream name (so its own scope), with limits that never bind.
func (o *options) policy() string {
	var b strings.Builder
	b.WriteString("providers:\n  - {name: sim, base_url: \"{{SIM}}\", api_key_env: SIM_API_KEY, timeout: 10s}\nmodels:\n")
	for i := range o.Models {
		fmt.Fprintf(&b, "  - {name: model-%d, provider: sim, upstream: gpt-4o-mini-%d, price: {input_per_mtok: 0.15, output_per_mtok: 0.60},"+
			" limits: {rpm: 10000000, tpm: 10000000000}, max_output_tokens: 1024}\n", i, i)
	}
	b.WriteString("tiers:\n  - {name: bench, daily_budget_usd: 1000000, priority: default, on_exhausted: defer, api_rps: 1000000}\n")
	fmt.Fprintf(&b, "global_daily_budget_usd: %g\n", o.GlobalCapUSD)
	return b.String()
}

// result is one measurement.
type result struct {
	topology string
	jobsPerS float64
	// shardCPU is each Redis server's CPU per job, by address.
	shardCPU map[string]time.Duration
	// placement says, on a cluster, which shard holds what.
	placement string
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseOptions(args, out)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	provider := sim.Start(sim.Config{Limits: sim.Limits{RPM: 100000000, TPM: 100000000000}, Echo: true, DefaultMaxTokens: 16})
	defer provider.Close()
	fmt.Fprintf(out, "%d jobs over %d models and %d tenants (global cap $%g), concurrency %d, %d producers; one node %s, cluster %s\n",
		o.Jobs, o.Models, o.Tenants, o.GlobalCapUSD, o.Concurrency, o.Producers, o.Single, o.Cluster)
	var results []result
	for round := 1; round <= o.Rounds; round++ {
		for _, t := range []struct{ name, url string }{{"one node", o.Single}, {"cluster", o.Cluster}} {
			r, err := measure(ctx, o, t.name, t.url, provider.BaseURL, logger)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, t.name, err)
			}
			results = append(results, r)
			fmt.Fprintf(out, "round %d  %-8s  %7.0f jobs/s  Redis CPU per job: %s\n", round, t.name, r.jobsPerS, formatShards(r.shardCPU))
			if r.placement != "" && round == 1 {
				fmt.Fprintf(out, "         placement: %s\n", r.placement)
			}
		}
	}
	for _, name := range []string{"one node", "cluster"} {
		var rate float64
		cpu := map[string]time.Duration{}
		n := 0
		for _, r := range results {
			if r.topology != name {
				continue
			}
			n++
			rate += r.jobsPerS
			for a, d := range r.shardCPU {
				cpu[a] += d
			}
		}
		for a := range cpu {
			cpu[a] /= time.Duration(n)
		}
		fmt.Fprintf(out, "mean     %-8s  %7.0f jobs/s  Redis CPU per job: %s\n", name, rate/float64(n), formatShards(cpu))
	}
	return nil
}

func formatShards(m map[string]time.Duration) string {
	addrs := make([]string, 0, len(m))
	var total time.Duration
	for a, d := range m {
		addrs = append(addrs, a)
		total += d
	}
	sort.Strings(addrs)
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		parts[i] = fmt.Sprintf("%s %dµs", a, m[a].Microseconds())
	}
	return fmt.Sprintf("%dµs in all (%s)", total.Microseconds(), strings.Join(parts, ", "))
}

// measure runs warmup and then o.Jobs jobs through a fresh llmq on the
// Redis at redisURL.
func measure(ctx context.Context, o *options, name, redisURL, simURL string, logger *slog.Logger) (result, error) {
	res := result{topology: name}
	ropts, err := redisconn.Parse(redisURL)
	if err != nil {
		return res, err
	}
	rdb := ropts.NewClient()
	defer rdb.Close()
	dsn, drop, err := testutil.NewSchema(ctx, o.DatabaseURL, "bench_")
	if err != nil {
		return res, err
	}
	defer drop()
	dir, err := os.MkdirTemp("", "llmq-bench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	policyPath, err := benchenv.WritePolicy(dir, o.policy(), simURL, 0, 0)
	if err != nil {
		return res, err
	}
	ns := "bench-" + testutil.RandomHex(4)
	environ := benchenv.Environ{RedisURL: redisURL, DatabaseURL: dsn, PolicyPath: policyPath, Namespace: ns,
		Concurrency: o.Concurrency, ShutdownTimeout: 5 * time.Second}.List()
	a, err := apptest.OpenEnviron(ctx, environ, config.RoleDispatcher, logger, app.Parts{Redis: rdb})
	if err != nil {
		return res, err
	}
	defer a.Close()
	defer testutil.PurgeRedis(rdb, a.Queue.Namespace().Queues(), a.Keys.Prefix())

	stopScheduler := inproc.Loops(a.Scheduler().Run)
	defer stopScheduler()
	url, closeAPI, err := inproc.ServeAPI(a)
	if err != nil {
		return res, err
	}
	defer closeAPI()
	shutdown, err := inproc.StartWorker(a)
	if err != nil {
		return res, err
	}
	defer shutdown()

	c := &client{base: url, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * o.Producers}}}
	tenants := make([]string, o.Tenants)
	for i := range tenants {
		if tenants[i], err = c.tenant(ctx); err != nil {
			return res, err
		}
	}
	day := time.Now().UTC().Format(time.DateOnly)
	done := func() (int64, error) {
		var n int64
		for _, t := range tenants {
			rows, err := a.Store.UsageReport(ctx, &store.UsageReportParams{Day: day, TenantID: t})
			if err != nil {
				return n, err
			}
			for _, r := range rows {
				n += r.Requests
			}
		}
		return n, nil
	}
	if err := c.post(ctx, o, o.Warmup, 0, o.Models); err != nil {
		return res, err
	}
	if err := waitFor(ctx, o.Timeout, done, int64(o.Warmup)); err != nil {
		return res, fmt.Errorf("warmup: %w", err)
	}
	before := shardCPU(ctx, rdb)
	start := time.Now()
	if err := c.post(ctx, o, o.Jobs, o.Warmup, o.Models); err != nil {
		return res, err
	}
	if err := waitFor(ctx, o.Timeout, done, int64(o.Warmup+o.Jobs)); err != nil {
		return res, err
	}
	elapsed := time.Since(start)
	after := shardCPU(ctx, rdb)
	res.placement = placement(ctx, a, rdb, o.Models, tenants)
	res.jobsPerS = float64(o.Jobs) / elapsed.Seconds()
	res.shardCPU = map[string]time.Duration{}
	for addr, t := range after {
		res.shardCPU[addr] = (t - before[addr]) / time.Duration(o.Jobs)
	}
	return res, nil
}

// placement names the shard of the tenants' budget days, of the global
// day, of asynq's jobs queue and of
// each model's limiter scope and fair queue ("" on one node).
func placement(ctx context.Context, a *app.App, rdb redis.UniversalClient, models int, tenants []string) string {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	at := func(key string) string {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return "?"
		}
		return m.Options().Addr
	}
	perShard := map[string]int{}
	for i := range models {
		perShard[at(a.Keys.LimiterScope(fmt.Sprintf("sim/gpt-4o-mini-%d", i)))]++
	}
	budgets := map[string]int{}
	for _, t := range tenants {
		budgets[at(a.Keys.BudgetTenant("2026-01-01", t))]++
	}
	return fmt.Sprintf("tenants' budget days %v, global day %s, jobs queue %s, model scopes %v", budgets, at(a.Keys.BudgetGlobal("2026-01-01")),
		at("asynq:{"+a.Queue.Namespace().Queue("jobs")+"}:pending"), perShard)
}

// shardCPU reads each Redis server's CPU time (every master's on a cluster).
func shardCPU(ctx context.Context, rdb redis.UniversalClient) map[string]time.Duration {
	out := map[string]time.Duration{}
	var mu sync.Mutex
	read := func(ctx context.Context, c *redis.Client) error {
		if d, ok := testutil.RedisCPU(ctx, c); ok {
			mu.Lock()
			out[c.Options().Addr] = d
			mu.Unlock()
		}
		return nil
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, read)
	} else if c, ok := rdb.(*redis.Client); ok {
		_ = read(ctx, c)
	}
	return out
}

func waitFor(ctx context.Context, timeout time.Duration, count func() (int64, error), want int64) error {
	deadline := time.Now().Add(timeout)
	for {
		n, err := count()
		if err == nil && n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d jobs done after %v (%v)", n, want, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// client is the producers' side of the API, with a key of each tenant.
type client struct {
	base string
	keys []string
	http *http.Client
}

func (c *client) do(ctx context.Context, method, path, token string, body any) (int, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	return resp.StatusCode, rb, err
}

// tenant makes one of the run's tenants and a key of it, and returns the
// tenant's id.
func (c *client) tenant(ctx context.Context) (string, error) {
	status, body, err := c.do(ctx, "POST", "/admin/v1/tenants", benchenv.AdminToken, map[string]string{"name": fmt.Sprintf("bench-%d", len(c.keys)), "tier": "bench"})
	var t struct{ ID string }
	if err != nil || status != http.StatusCreated || json.Unmarshal(body, &t) != nil {
		return "", fmt.Errorf("create tenant: %d %s %v", status, body, err)
	}
	status, body, err = c.do(ctx, "POST", "/admin/v1/tenants/"+t.ID+"/keys", benchenv.AdminToken, nil)
	var k struct{ Key string }
	if err != nil || status != http.StatusCreated || json.Unmarshal(body, &k) != nil {
		return "", fmt.Errorf("create key: %d %s %v", status, body, err)
	}
	c.keys = append(c.keys, k.Key)
	return t.ID, nil
}

// post POSTs n jobs, numbered from first, round robin over the models and
// then the tenants.
func (c *client) post(ctx context.Context, o *options, n, first, models int) error {
	var wg sync.WaitGroup
	errs := make(chan error, o.Producers)
	next := make(chan int)
	for range o.Producers {
		wg.Go(func() {
			for i := range next {
				body := map[string]any{"custom_id": fmt.Sprintf("req-%d", i), "body": map[string]any{
					"model":      fmt.Sprintf("model-%d", i%models),
					"messages":   []map[string]string{{"role": "user", "content": fmt.Sprintf("job %d", i)}},
					"max_tokens": 16,
				}}
				status, rb, err := c.do(ctx, "POST", "/v1/jobs", c.keys[(i/models)%len(c.keys)], body)
				if err != nil || status != http.StatusAccepted {
					errs <- fmt.Errorf("POST job %d: %d %s %v", i, status, rb, err)
					for range next {
					}
					return
				}
			}
		})
	}
	for i := first; i < first+n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}
