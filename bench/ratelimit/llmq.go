package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/bench/internal/procs"
	"github.com/llmq/llmq/internal/testutil"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// policyYAML has one simulated provider (base_url filled in), the one model
// with the scenario's limits, and a tier whose budget never binds (the
// budget is still reserved and settled for every job, as always).
const policyYAML = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 30s
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: {{RPM}}, tpm: {{TPM}}}
    max_output_tokens: 1024
tiers:
  - name: bench
    daily_budget_usd: 1000000
    priority: default
    on_exhausted: defer
    api_rps: 1000000
`

// runLLMQ runs one llmq scenario: a fresh simulator in the scenario's
// mode, schema and Redis namespace, a policy at sc.policy times the
// provider's limits, Processes worker processes of Concurrency each, and a
// producer keeping the queue full, for Duration.
func runLLMQ(ctx context.Context, o *options, sc scenario, mix *mix, bin string, logger *slog.Logger) (_ *result, err error) {
	srv := startSim(o, sc)
	defer srv.Close()

	var closers benchenv.Closers
	defer closers.Close()
	l, err := inproc.Open(ctx, inproc.Options{Backends: o.Backends, Name: "rl", Policy: policyYAML, SimURL: srv.BaseURL,
		RPM: sc.policy * o.RPM, TPM: sc.policy * o.TPM,
		Environ: benchenv.Environ{Concurrency: o.Concurrency,
			// The scenario is measured by then: jobs still waiting for a
			// permit need not keep the next one waiting.
			ShutdownTimeout: 2 * time.Second,
			Extra:           []string{"LLMQ_LOG_LEVEL=warn", "LLMQ_LOG_FORMAT=text"},
		}}, logger, &closers)
	if err != nil {
		return nil, err
	}
	a, rdb, dsn, environ := l.App, l.Redis, l.DSN, l.Environ

	tenant, err := a.Store.TenantInsert(ctx, &store.TenantInsertParams{Name: "bench", Tier: "bench"})
	if err != nil {
		return nil, err
	}
	p := &producer{app: a, mix: mix, tenant: tenant.ID, target: 2 * o.Processes * o.Concurrency,
		in: asynq.NewInspectorFromRedisClient(rdb), qname: a.Queue.Namespace().Queue(queue.Jobs)}
	// The first jobs are stored before the workers start and enqueued once
	// they all run, so the scenario's clock starts with every worker idle
	// and the queue full at once.
	first, err := p.insert(ctx, p.target)
	if err != nil {
		return nil, err
	}

	workers, err := procs.StartN(ctx, o.Processes, bin, environ, "worker running")
	defer func() { procs.StopAll(workers) }()
	if err != nil {
		return nil, err
	}

	smp := startSampler(srv)
	if _, err := a.Queue.EnqueueJobs(ctx, first); err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	pctx, stopProducer := context.WithCancel(ctx)
	defer stopProducer()
	perr := make(chan error, 1)
	go func() { perr <- p.keepFull(pctx) }()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	levels := make(chan []levelSample, 1)
	m, _ := a.Policy.Current().Model(model)
	go func() {
		levels <- watchLimiter(wctx, a, m, smp.start, 250*time.Millisecond)
	}()

	timer := time.NewTimer(o.Duration)
	select {
	case <-ctx.Done():
		timer.Stop()
		stopProducer()
		<-perr
		return nil, ctx.Err()
	case err := <-perr:
		timer.Stop()
		stopProducer()
		return nil, fmt.Errorf("producer: %w", err)
	case <-timer.C:
	}
	res := &result{start: smp.start, duration: o.Duration, samples: smp.finish()}
	stopWatch()
	res.llmqLevels = <-levels
	// What the scope learned, as the workers left it at the end.
	if res.learned, err = inspectScope(ctx, a, m); err != nil {
		return nil, err
	}
	stopProducer()
	if err := <-perr; err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("producer: %w", err)
	}
	procs.StopAll(workers)
	for i, pr := range workers {
		if notes := workerNotes(pr.Out.String()); notes != "" {
			res.notes = append(res.notes, fmt.Sprintf("worker %d logged: %s", i+1, notes))
		}
	}
	workers = nil

	if err := countJobs(ctx, dsn, smp.start, res); err != nil {
		return nil, err
	}
	res.log = srv.Admissions(0)
	res.dropped = srv.Stats().LogDropped
	res.notes = append(res.notes, fmt.Sprintf("%d jobs enqueued, queue kept at >= %d pending", p.next, p.target))
	return res, nil
}

// learned is what llmq's scope for the model learned from the provider's
// answers, read with the limiter's Inspect.
type learned struct {
	policy      config.Limits // the policy's limits of the model
	tpm, rpm    *limiter.BucketLearning
	calibration limiter.Calibration
	distrusted  bool
}

// inspectScope reads what the model's scope learned, with the limits the
// provider announced.
func inspectScope(ctx context.Context, a *app.App, m *config.Model) (*learned, error) {
	li, err := a.Limiter.Inspect(ctx, a.Pacer.Scope(ctx, m.Routes()[0]))
	if err != nil {
		return nil, err
	}
	l := &learned{policy: m.Routes()[0].Limits, calibration: li.Calibration, distrusted: li.Distrusted}
	for i := range li.Buckets {
		switch b := &li.Buckets[i]; b.Name {
		case "tpm":
			l.tpm = b
		case "rpm":
			l.rpm = b
		}
	}
	return l, nil
}

// producer keeps the scenario's queue full: jobs are stored and enqueued
// the way the API does it (store row with llmq's estimate, then the task),
// in bulk, so producing never limits the workers.
type producer struct {
	app    *app.App
	mix    *mix
	tenant string
	target int
	in     *asynq.Inspector
	qname  string
	next   int // the next request of the mix
}

// insert stores the next n requests of the mix as jobs and returns their
// refs, not yet enqueued.
func (p *producer) insert(ctx context.Context, n int) ([]queue.JobRef, error) {
	pol := p.app.Policy.Current()
	jobs := make([]*store.JobInsertParams, n)
	for i := range jobs {
		// The end of the run stops the producer between two jobs: the
		// estimate's read of the calibration is not cut off (the pacer
		// would log each cancelled read).
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, err := p.mix.request(p.next)
		if err != nil {
			return nil, err
		}
		est, err := p.app.Admission.Estimate(context.WithoutCancel(ctx), pol, nil, "", r.endpoint, r.body)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", p.next, err)
		}
		jobs[i] = &store.JobInsertParams{
			TenantID: p.tenant, CustomID: strconv.Itoa(p.next), Endpoint: r.endpoint, Model: est.Model.Name,
			Request: r.body, Queue: queue.Default, EstPromptTokens: est.PromptTokens, EstMaxTokens: est.MaxTokens,
			EstCost: est.WorstCase,
		}
		p.next++
	}
	ids, err := p.app.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: jobs})
	if err != nil {
		return nil, fmt.Errorf("insert jobs: %w", err)
	}
	refs := make([]queue.JobRef, len(ids))
	for i, id := range ids {
		refs[i] = queue.JobRef{ID: id, Priority: queue.Default}
	}
	return refs, nil
}

// keepFull tops the queue up to target pending tasks four times a second
// until ctx ends.
func (p *producer) keepFull(ctx context.Context) error {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := p.topUp(ctx); err != nil {
			// The end of the run may cut off a write in flight, which
			// then fails with its closed connection, not ctx's error:
			// the run's end, not a failure.
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
}

// topUp stores and enqueues jobs until target tasks are pending.
func (p *producer) topUp(ctx context.Context) error {
	info, err := p.in.GetQueueInfo(p.qname)
	if err != nil {
		return fmt.Errorf("queue info: %w", err)
	}
	if n := p.target - info.Pending; n > 0 {
		refs, err := p.insert(ctx, n)
		if err != nil {
			return err
		}
		if _, err := p.app.Queue.EnqueueJobs(ctx, refs); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
	}
	return nil
}

// countJobs reads, from the scenario's schema, when jobs succeeded, how many
// of them were Responses API calls, how many failed, how many received a 429
// and the most 429s one job received.
func countJobs(ctx context.Context, dsn string, start time.Time, res *result) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, testutil.PlainDSN(u.String()))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT finished_at FROM jobs WHERE status = 'succeeded'`)
	if err != nil {
		return err
	}
	finished, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return err
	}
	for _, f := range finished {
		res.completions = append(res.completions, f.Sub(start))
	}
	slices.Sort(res.completions)
	return conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE rate_limited > 0),
		coalesce(max(rate_limited), 0), count(*) FILTER (WHERE status = 'succeeded' AND endpoint = $1) FROM jobs`,
		llm.EndpointResponses).Scan(&res.failed, &res.with429, &res.most429, &res.responsesDone)
}

var jobID = regexp.MustCompile(`job_[0-9a-z]+`)

// workerNotes summarises a worker's log: each distinct message with how
// often it came.
func workerNotes(out string) string {
	counts := map[string]int{}
	var order []string
	for line := range strings.Lines(out) {
		_, msg, ok := strings.Cut(line, "msg=")
		if !ok {
			continue
		}
		if m, err := strconv.QuotedPrefix(msg); err == nil {
			msg = m
		} else {
			msg, _, _ = strings.Cut(msg, " ")
		}
		// Shutdown lines name each task; counted together they say how
		// many jobs went back to the queue.
		msg = jobID.ReplaceAllString(msg, "job_…")
		if counts[msg] == 0 {
			order = append(order, msg)
		}
		counts[msg]++
	}
	parts := make([]string, len(order))
	for i, m := range order {
		parts[i] = fmt.Sprintf("%s x%d", m, counts[m])
	}
	return strings.Join(parts, "; ")
}

// levelSample is llmq's own TPM bucket for the model at one moment.
type levelSample struct {
	at    time.Duration // since the scenario's start, by Redis TIME
	level float64       // tokens it holds (the room it sees)
}

// watchLimiter reads llmq's TPM bucket of model m every period until ctx
// ends, as the limiter itself sees it (Inspect: its learned capacity,
// refill and the calls in flight), so the run can set it beside the
// provider's bucket at the same moments: a bucket that holds more than the
// provider's lets calls through that the provider must refuse.
func watchLimiter(ctx context.Context, a *app.App, m *config.Model, start time.Time, period time.Duration) []levelSample {
	var out []levelSample
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		// A reading is short: the end of the run need not cut one off
		// (the pacer would log the cancelled read of the learned limits).
		rctx := context.WithoutCancel(ctx)
		li, err := a.Limiter.Inspect(rctx, a.Pacer.Scope(rctx, m.Routes()[0]))
		if err != nil {
			continue
		}
		for _, b := range li.Buckets {
			if b.Name == "tpm" {
				out = append(out, levelSample{at: li.Time.Sub(start), level: float64(b.Remaining)})
			}
		}
	}
}
