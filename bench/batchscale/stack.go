package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

// policyYAML has one simulated provider and one model whose limits are far
// above what a scenario sends, so a batch runs as fast as the worker goes.
const policyYAML = `
providers:
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, timeout: 30s}
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: {{RPM}}, tpm: {{TPM}}}
    max_output_tokens: 1024
tiers:
  - {name: standard, daily_budget_usd: 1000, priority: default, on_exhausted: defer, api_rps: 1000}
`

// stack is one fresh llmq in this process, as a dispatcher and a worker run
// it (the API on a loopback listener, the scheduler, the batch sweeper and,
// with workers, a worker), over a Postgres schema, a Redis key prefix and a
// simulated provider of its own.
type stack struct {
	app     *app.App
	sim     *sim.TestServer
	url     string
	dsn     string   // the schema's database URL
	environ []string // the llmq environment, for processes started beside it
	hc      *http.Client
	admin   *client.Client

	closers []func()
}

func (s *stack) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// openStack starts a stack; concurrency 0 starts no worker, so the jobs stay
// queued.
func openStack(ctx context.Context, o *options, concurrency int, logger *slog.Logger) (s *stack, err error) {
	s = &stack{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	// Every answer is its request's "user" field (the line's custom_id)
	// and a few words, so the output tells whose answer each line holds.
	s.sim = sim.Start(sim.Config{DefaultMaxTokens: 1024, Echo: true, CompletionMin: 0.01, CompletionMax: 0.05})
	s.closers = append(s.closers, s.sim.Close)

	dsn, drop, err := testutil.NewSchema(ctx, o.DatabaseURL, "bench_")
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, drop)
	s.dsn = dsn
	rdb, redisURL, err := benchenv.Redis(ctx, o.RedisURL, o.RedisDB)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { _ = rdb.Close() })
	dir, err := os.MkdirTemp("", "llmq-bench-batchscale-")
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { _ = os.RemoveAll(dir) })
	policyPath, err := benchenv.WritePolicy(dir, policyYAML, s.sim.BaseURL, 10_000_000, 1_000_000_000)
	if err != nil {
		return nil, err
	}
	s.environ = benchenv.Environ{RedisURL: redisURL, DatabaseURL: dsn, PolicyPath: policyPath, Namespace: "bench-" + testutil.RandomHex(4),
		Concurrency: max(concurrency, 1), ShutdownTimeout: 5 * time.Second}.List()
	a, err := app.OpenEnviron(ctx, s.environ, config.RoleDispatcher, logger, app.Parts{Redis: rdb})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, a.Close)
	s.closers = append(s.closers, func() { testutil.PurgeRedis(rdb, a.Queue.Namespace().Queues(), a.Keys.Prefix()) })
	s.app = a

	// A dispatcher's background work: the scheduler and the batch sweeper.
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Scheduler().Run(bg) })
	wg.Go(func() { a.Batches.Run(bg) })
	s.closers = append(s.closers, func() { stopBG(); wg.Wait() })

	srv, err := a.API()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs, err := api.NewHTTPServer(srv, api.ServerOptions{})
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	go func() { _ = hs.Serve(ln) }()
	s.closers = append(s.closers, func() { _ = hs.Close() })
	s.url = "http://" + ln.Addr().String()

	if concurrency > 0 {
		wsrv, mux, err := a.WorkerServer(worker.Options{})
		if err != nil {
			return nil, err
		}
		if err := wsrv.Start(mux); err != nil {
			return nil, err
		}
		s.closers = append(s.closers, wsrv.Shutdown)
	}

	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}
	s.closers = append(s.closers, tr.CloseIdleConnections)
	s.hc = &http.Client{Transport: tr, Timeout: 10 * time.Minute}
	if s.admin, err = client.New(s.url, "", client.WithAdminToken(benchenv.AdminToken), client.WithHTTPClient(s.hc)); err != nil {
		return nil, err
	}
	return s, nil
}

// tenant makes a tenant of tier standard with a key, and returns the
// tenant's id, the key and a client of it.
func (s *stack) tenant(ctx context.Context, name string) (string, string, *client.Client, error) {
	t, err := s.admin.Admin.CreateTenant(ctx, &client.TenantCreateParams{Name: name, Tier: "standard"})
	if err != nil {
		return "", "", nil, err
	}
	k, err := s.admin.Admin.CreateKey(ctx, t.ID)
	if err != nil {
		return "", "", nil, err
	}
	c, err := client.New(s.url, k.Key, client.WithHTTPClient(s.hc))
	return t.ID, k.Key, c, err
}

// wait polls the batch every 100 ms until done holds or it ends, and
// returns it with when it was first seen past validating (zero if never).
func wait(ctx context.Context, o *options, c *client.Client, id string, done func(*client.Batch) bool) (*client.Batch, time.Time, error) {
	deadline := time.Now().Add(o.Timeout)
	var validated time.Time
	for {
		b, err := c.Batches.Get(ctx, id)
		if err != nil {
			return nil, validated, err
		}
		if validated.IsZero() && b.Status != "validating" {
			validated = time.Now()
		}
		if done(b) || b.Finished() {
			return b, validated, nil
		}
		if time.Now().After(deadline) {
			return b, validated, fmt.Errorf("batch %s is %s after %v (counts %+v)", id, b.Status, o.Timeout, b.RequestCounts)
		}
		select {
		case <-ctx.Done():
			return nil, validated, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
