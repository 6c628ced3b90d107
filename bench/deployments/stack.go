package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/bench/internal/procs"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// deployment is one of the model's three deployments: a simulated account
// behind a proxy that can refuse its connections.
type deployment struct {
	provider, upstream string
	rpm, tpm           int64
	azure              bool
	srv                *sim.TestServer
	px                 *proxy
}

// name is the deployment's name in llmq (its limiter scope).
func (d *deployment) name() string { return d.provider + "/" + d.upstream }

// newDeployments are the three deployments, not yet started.
func newDeployments() []*deployment {
	return []*deployment{
		{provider: "org-a", upstream: "gpt-4o", rpm: 600, tpm: 60_000},
		{provider: "org-b", upstream: "gpt-4o", rpm: 300, tpm: 30_000},
		{provider: "azure-east", upstream: "gpt-4o-east", rpm: 120, tpm: 20_000, azure: true},
	}
}

// simConfig is a deployment's simulated account: its limits, OpenAI's
// admission (prompt + max_tokens kept), a realistic latency, and for the
// Azure one Azure's headers (10% of them nonsense, as bench/ratelimit's
// azure-10s) with its limits also enforced over fixed 10 s windows.
func (d *deployment) simConfig() sim.Config {
	c := sim.Config{Limits: sim.Limits{RPM: d.rpm, TPM: d.tpm}, Latency: 300 * time.Millisecond, Jitter: 400 * time.Millisecond,
		DefaultMaxTokens: 1024}
	if d.azure {
		c.RateHeaders, c.HeaderNoise = sim.HeadersAzure, 0.1
		c.ShortWindow = sim.ShortWindow{Period: 10 * time.Second, Kind: sim.WindowFixed}
	}
	return c
}

// proxy forwards TCP connections to a simulator; while down, it resets each
// connection as it comes (the account refuses connections) and notes when.
type proxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	attempts []time.Time
}

func startProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// url is the proxy's root URL.
func (p *proxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *proxy) handle(c net.Conn) {
	if p.down.Load() {
		p.mu.Lock()
		p.attempts = append(p.attempts, time.Now())
		p.mu.Unlock()
		reset(c)
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		reset(c)
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	reset(c)
	_ = up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// setDown takes the account down (every open connection is reset, new ones
// too) or brings it back.
func (p *proxy) setDown(down bool) {
	p.down.Store(down)
	if !down {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		reset(c)
	}
}

// attemptsSince returns the connections reset since t.
func (p *proxy) attemptsSince(t time.Time) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Time
	for _, a := range p.attempts {
		if !a.Before(t) {
			out = append(out, a)
		}
	}
	return out
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.setDown(true)
}

// reset closes c at once with a TCP reset.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// policyYAML is the run's policy: gpt-4o on the three deployments (orders
// and fallbacks filled in by the scenario), gpt-4o-solo on the same three
// without a fallback (shared scopes: equal limits), and gpt-4o-mini, the
// fallback, on an account of its own with room to spare. The Azure
// deployment costs more.
const policyYAML = `
providers:
  - {name: org-a, base_url: "{{P0}}/v1", api_key_env: SIM_API_KEY, timeout: 30s}
  - {name: org-b, base_url: "{{P1}}/v1", api_key_env: SIM_API_KEY, timeout: 30s}
  - {name: azure-east, kind: azure, api_version: "2024-10-21", base_url: "{{P2}}", api_key_env: SIM_API_KEY, timeout: 30s}
  - {name: spare, base_url: "{{FB}}/v1", api_key_env: SIM_API_KEY, timeout: 30s}
models:
  - name: gpt-4o
    price: {input_per_mtok: 2.50, output_per_mtok: 10.00}
    max_output_tokens: 1024
    deployments: &three
      - {provider: org-a, upstream: gpt-4o, limits: {rpm: 600, tpm: 60000}, order: {{O0}}}
      - {provider: org-b, upstream: gpt-4o, limits: {rpm: 300, tpm: 30000}, order: {{O1}}}
      - {provider: azure-east, upstream: gpt-4o-east, limits: {rpm: 120, tpm: 20000}, order: {{O2}}, price: {input_per_mtok: 2.75, output_per_mtok: 11.00}}
    fallbacks: [gpt-4o-mini]
  - name: gpt-4o-solo
    price: {input_per_mtok: 2.50, output_per_mtok: 10.00}
    max_output_tokens: 1024
    deployments: *three
  - name: gpt-4o-mini
    provider: spare
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 6000, tpm: 1000000}
    max_output_tokens: 1024
tiers:
  - name: bench
    daily_budget_usd: 1000000
    priority: default
    on_exhausted: defer
    api_rps: 1000000
`

// stack is one scenario's running system.
type stack struct {
	o      *options
	deps   []*deployment
	spare  *sim.TestServer
	app    *app.App
	dsn    string
	tenant string
	procs  []*procs.Process
	smp    *sampler
	close  benchenv.Closers
}

// startStack starts the simulators and proxies, the scenario's llmq (schema,
// Redis namespace, policy with orders) and its worker processes.
func startStack(ctx context.Context, o *options, orders [3]int, bin string, logger *slog.Logger) (_ *stack, err error) {
	s := &stack{o: o, deps: newDeployments()}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	repl := []string{}
	for i, d := range s.deps {
		d.srv = sim.Start(d.simConfig())
		s.close = append(s.close, d.srv.Close)
		if d.px, err = startProxy(strings.TrimPrefix(d.srv.URL, "http://")); err != nil {
			return nil, err
		}
		s.close = append(s.close, d.px.close)
		repl = append(repl, fmt.Sprintf("{{P%d}}", i), d.px.url(), fmt.Sprintf("{{O%d}}", i), strconv.Itoa(orders[i]))
	}
	s.spare = sim.Start(sim.Config{Limits: sim.Limits{RPM: 6000, TPM: 1_000_000}, Latency: 300 * time.Millisecond, Jitter: 400 * time.Millisecond})
	s.close = append(s.close, s.spare.Close)
	repl = append(repl, "{{FB}}", s.spare.URL)

	// The policy's placeholders are this program's own, replaced here.
	backends := benchenv.Backends{RedisURL: o.RedisURL, RedisDB: o.RedisDB, DatabaseURL: o.DatabaseURL}
	l, err := inproc.Open(ctx, inproc.Options{Backends: backends, Name: "dep", Policy: strings.NewReplacer(repl...).Replace(policyYAML),
		Environ: benchenv.Environ{Concurrency: o.Concurrency, ShutdownTimeout: 2 * time.Second,
			Extra: []string{"LLMQ_LOG_LEVEL=warn", "LLMQ_LOG_FORMAT=text"}}}, logger, &s.close)
	if err != nil {
		return nil, err
	}
	a, environ := l.App, l.Environ
	s.app, s.dsn = a, l.DSN
	t, err := a.Store.TenantInsert(ctx, &store.TenantInsertParams{Name: "bench", Tier: "bench"})
	if err != nil {
		return nil, err
	}
	s.tenant = t.ID
	s.procs, err = procs.StartN(ctx, o.Processes, bin, environ, "worker running")
	s.close = append(s.close, func() { procs.StopAll(s.procs) })
	if err != nil {
		return nil, err
	}
	s.smp = startSampler(s.deps)
	s.close = append(s.close, s.smp.finish)
	return s, nil
}

// stop stops everything, the last started first.
func (s *stack) stop() { s.close.Close() }

// request is the body of job i of model: a short prompt and max_tokens 50,
// so that a call costs about 100 tokens as the provider counts it, and
// org-a and org-b bind on both their limits at once.
func request(model string, i int) []byte {
	return fmt.Appendf(nil, `{"model":%q,"max_tokens":50,"messages":[{"role":"user","content":"Request %d of the backlog: summarise the quarterly report of the northern region in three plain sentences for the board, please."}]}`, model, i)
}

// insert stores n jobs of model and puts them in the model's fair queue,
// as the API does.
func (s *stack) insert(ctx context.Context, model string, first, n int) error {
	pol := s.app.Policy.Current()
	jobs := make([]*store.JobInsertParams, n)
	for i := range jobs {
		body := request(model, first+i)
		est, err := s.app.Admission.Estimate(context.WithoutCancel(ctx), pol, nil, "", llm.EndpointChat, body)
		if err != nil {
			return err
		}
		jobs[i] = &store.JobInsertParams{TenantID: s.tenant, CustomID: strconv.Itoa(first + i), Endpoint: llm.EndpointChat,
			Model: model, Request: body, Queue: queue.Default, EstPromptTokens: est.PromptTokens, EstMaxTokens: est.MaxTokens,
			EstCost: est.WorstCase}
	}
	ids, err := s.app.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: jobs})
	if err != nil {
		return err
	}
	refs := make([]queue.JobRef, len(ids))
	for i, id := range ids {
		refs[i] = admission.Ref(pol, id, queue.Default, s.tenant, model, jobs[i].EstPromptTokens+jobs[i].EstMaxTokens, 1)
	}
	_, err = s.app.Queue.EnqueueJobs(ctx, refs)
	return err
}

// waiting is how many jobs of model wait in its fair queue.
func (s *stack) waiting(ctx context.Context, model string) (int64, error) {
	m, _ := s.app.Policy.Current().Model(model)
	ws, _, err := s.app.Queue.Waiting(ctx, m.Queue())
	var n int64
	for _, w := range ws {
		n += w.Jobs
	}
	return n, err
}

// produce keeps each model's fair queue at least at depth jobs (backlog,
// rate 0) or adds rate jobs a second spread over the models, until ctx
// ends.
func (s *stack) produce(ctx context.Context, models []string, depth int64, rate float64, next *atomic.Int64) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	owed := 0.0
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, m := range models {
			n := 0
			if rate > 0 {
				owed += rate / 10 / float64(len(models))
				n = int(owed)
				owed -= float64(n)
			} else if k%3 == 0 {
				w, err := s.waiting(ctx, m)
				if err != nil {
					return err
				}
				n = int(max(depth-w, 0))
			}
			if n > 0 {
				if err := s.insert(ctx, m, int(next.Add(int64(n)))-n, n); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
		}
	}
}

// jobCounts are the scenario's jobs by outcome, read from its schema.
type jobCounts struct {
	total, succeeded, failed, unfinished int64
	byServed                             map[string]int64 // "model deployment" of succeeded jobs
	costMismatch                         []string         // ledger rows not at their deployment's price
	ledgerRows                           int64
}

func (s *stack) countJobs(ctx context.Context) (*jobCounts, error) {
	u, err := url.Parse(s.dsn)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, testutil.PlainDSN(u.String()))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	c := &jobCounts{byServed: map[string]int64{}}
	if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed'),
		count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'cancelled')) FROM jobs`).Scan(&c.total, &c.succeeded, &c.failed, &c.unfinished); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT l.model, l.deployment, l.prompt_tokens, l.cached_tokens, l.completion_tokens, l.cost_micros, j.cost_micros
		FROM usage_ledger l JOIN jobs j ON j.id = l.job_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	pol := s.app.Policy.Current()
	for rows.Next() {
		var model, dep string
		var prompt, cached, completion, cost, jobCost int64
		if err := rows.Scan(&model, &dep, &prompt, &cached, &completion, &cost, &jobCost); err != nil {
			return nil, err
		}
		c.ledgerRows++
		c.byServed[model+" "+dep]++
		m, ok := pol.Model(model)
		var want int64 = -1
		if ok {
			if r, ok := m.Route(dep); ok {
				want = int64(r.Price.Cost(money.Tokens{Prompt: prompt, Cached: cached, Completion: completion}))
			}
		}
		if cost != want || jobCost != want {
			c.costMismatch = append(c.costMismatch, fmt.Sprintf("%s on %s: ledger %d, job %d, usage at its price %d", model, dep, cost, jobCost, want))
		}
	}
	return c, rows.Err()
}
