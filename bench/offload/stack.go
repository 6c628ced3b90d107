package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/cost"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/offload"
)

// policyYAML has one simulated provider (an OpenAI kind: it offers the
// Batch API) and one model at $2 and $8 per million tokens: a call's cost in
// micro-dollars is then a whole number at the normal price (2 a prompt
// token, 8 a completion token) and at the batch price, which is half by
// default (1 and 4), so the batch price is exactly half of every call's.
// Tier plain runs its batches through llmq's own path, bulk offloads them,
// interactive is tenant C's.
const policyYAML = `
providers:
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, timeout: 30s}
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 2, output_per_mtok: 8}
    limits: {rpm: {{RPM}}, tpm: {{TPM}}}
    max_output_tokens: 1024
tiers:
  - {name: plain, daily_budget_usd: 10000, priority: default, on_exhausted: defer, api_rps: 1000}
  - {name: bulk, daily_budget_usd: 10000, priority: default, on_exhausted: defer, api_rps: 1000, batch_offload: auto}
  - {name: interactive, daily_budget_usd: 10000, priority: default, on_exhausted: defer, api_rps: 1000}
`

// stack is one fresh llmq in this process, as a dispatcher and a worker run
// it (the API on a loopback listener, the scheduler, the batch sweeper, the
// offloader, a worker), over a Postgres schema, a Redis key prefix and a
// simulated provider of its own.
type stack struct {
	app   *app.App
	sim   *sim.TestServer
	url   string
	meter *meter
	hc    *http.Client
	admin *client.Client

	closers benchenv.Closers
}

func (s *stack) close() { s.closers.Close() }

// simConfig is the simulated provider of every run: the synchronous path
// at the model's limits, with some latency; batches at o.BatchLPS lines a
// second. Every completion is the same share of its max_tokens, so a
// line's usage depends on its body alone, not on when or on which path it
// ran (by default the simulator draws each call's length from its request
// number, which differs between the runs).
func (o *options) simConfig() sim.Config {
	return sim.Config{Limits: sim.Limits{RPM: o.RPM, TPM: o.TPM}, DefaultMaxTokens: 1024,
		Latency: o.Latency, Jitter: o.Jitter, CompletionMin: o.Completion, CompletionMax: o.Completion,
		Batch: sim.BatchConfig{LinesPerSecond: o.BatchLPS}}
}

func openStack(ctx context.Context, o *options, logger *slog.Logger) (s *stack, err error) {
	s = &stack{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.sim = sim.Start(o.simConfig())
	s.closers = append(s.closers, s.sim.Close)

	// The offloader polls a provider batch every tenth of its age, within
	// -poll and 5 s (a dispatcher's defaults are 5 s and 5 min, for batches
	// that take hours).
	l, err := inproc.Open(ctx, inproc.Options{Backends: o.Backends, Name: "offload", Policy: policyYAML, SimURL: s.sim.BaseURL,
		RPM: o.RPM, TPM: o.TPM, Environ: benchenv.Environ{Concurrency: o.Concurrency, ShutdownTimeout: 5 * time.Second},
		Parts: app.Parts{Offload: offload.Options{PollMin: o.Poll, PollMax: max(o.Poll, 5*time.Second), RetryAfter: 5 * time.Second, SweepInterval: o.Poll / 2}},
		OnRedis: func(rdb *redis.Client) {
			s.meter = &meter{rt: cost.CountRoundTrips(rdb), cpu: cost.NewCPUReader(rdb, o.DatabaseURL)}
		}}, logger, &s.closers)
	if err != nil {
		return nil, err
	}
	a := l.App
	s.app = a

	// A dispatcher's background work: the scheduler, the batch sweeper and
	// the offloader.
	s.closers = append(s.closers, inproc.Loops(a.Scheduler().Run, a.Batches.Run, a.Offload.Run))
	url, closeAPI, err := inproc.ServeAPI(a)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closeAPI)
	s.url = url

	// A worker, as the normal path needs (the offloaded one sends nothing
	// through it unless the provider leaves lines undone).
	shutdown, err := inproc.StartWorker(a)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, shutdown)

	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	s.closers = append(s.closers, tr.CloseIdleConnections)
	s.hc = &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	if s.admin, err = client.New(s.url, "", client.WithAdminToken(benchenv.AdminToken), client.WithHTTPClient(s.hc)); err != nil {
		return nil, err
	}
	return s, nil
}

// tenant makes a tenant of tier with a key, and returns the tenant's id and
// a client of that key.
func (s *stack) tenant(ctx context.Context, name, tier string) (string, string, *client.Client, error) {
	return benchenv.Tenant(ctx, s.admin, name, tier, client.WithHTTPClient(s.hc))
}
