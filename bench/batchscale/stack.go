package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/llm/sim"
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

	closers benchenv.Closers
}

func (s *stack) close() { s.closers.Close() }

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

	l, err := inproc.Open(ctx, inproc.Options{Backends: o.Backends, Name: "batchscale", Policy: policyYAML, SimURL: s.sim.BaseURL,
		RPM: 10_000_000, TPM: 1_000_000_000, Environ: benchenv.Environ{Concurrency: max(concurrency, 1), ShutdownTimeout: 5 * time.Second}},
		logger, &s.closers)
	if err != nil {
		return nil, err
	}
	a := l.App
	s.app, s.dsn, s.environ = a, l.DSN, l.Environ

	// A dispatcher's background work: the scheduler and the batch sweeper.
	s.closers = append(s.closers, inproc.Loops(a.Scheduler().Run, a.Batches.Run))
	url, closeAPI, err := inproc.ServeAPI(a)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closeAPI)
	s.url = url
	if concurrency > 0 {
		shutdown, err := inproc.StartWorker(a)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, shutdown)
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
	return benchenv.Tenant(ctx, s.admin, name, "standard", client.WithHTTPClient(s.hc))
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
