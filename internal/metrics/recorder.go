// Package metrics owns llmq's Prometheus metrics: a registry per process (no
// global registry, so tests can run many apps in one process), a Recorder
// that the worker, the API and the webhook sender report events to, the
// collectors that read limiter buckets, tenant budgets and worker counts at
// scrape time, and the per-minute counters in Redis behind the dashboard's
// charts of the last hour.
//
// Every family is prefixed llmq_, counts in base units (seconds, dollars,
// tokens) and ends in _total when it is a counter. Labels stay
// low-cardinality: model, provider, tier, status, bucket, queue — and the
// tenant id only on the cost and budget families. Job and batch ids never
// become labels.
package metrics

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/rkeys"
)

// Namespace starts the name of every llmq family.
const Namespace = "llmq"

// breakerStates are the only states the worker's breakers report.
var breakerStates = []string{"closed", "open", "half-open"}

// Options configure a Recorder.
type Options struct {
	// Redis receives the per-minute counters behind the dashboard's charts.
	// Defaults to nil: no charts are fed from this process.
	Redis redis.UniversalClient
	// Keys builds the per-minute keys. Defaults to the zero Builder.
	Keys rkeys.Builder
	// Now is the clock that files events under their minute (a skew only
	// shifts a chart's point). Defaults to time.Now.
	Now func() time.Time
	// Logger receives flush failures. Defaults to discarding.
	Logger *slog.Logger
	// NoProcessMetrics leaves out the go_* and process_* collectors.
	NoProcessMetrics bool
}

// Recorder turns llmq's events into Prometheus metrics and per-minute
// counters. Its methods do no I/O and are safe for concurrent use.
type Recorder struct {
	reg   *prometheus.Registry
	log   *slog.Logger
	stats *statsBuffer

	jobs, providerCalls, tokens, cost, failovers, penalties, penaltySeconds *prometheus.CounterVec
	breakerChanges, unpredicted429s, shortWindow429s, usageUnbelieved       *prometheus.CounterVec
	softCrossings, budgetRaised, budgetRaisedUSD                            *prometheus.CounterVec
	webhookAttempts, webhookFailures                                        *prometheus.CounterVec
	callDuration, limiterWait, queueWait                                    *prometheus.HistogramVec
	breakerState, learnedLimits                                             *prometheus.GaugeVec

	mu             sync.Mutex
	webhookReasons map[string]bool
}

// maxWebhookReasons caps the distinct webhook failure reasons.
const maxWebhookReasons = 16

// flushInterval is how often the per-minute counters go to Redis.
const flushInterval = 5 * time.Second

// New returns a Recorder with its own registry.
func New(o Options) *Recorder {
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	r := &Recorder{reg: prometheus.NewRegistry(), log: o.Logger, webhookReasons: map[string]bool{}}
	if o.Redis != nil {
		r.stats = &statsBuffer{rdb: o.Redis, keys: o.Keys, now: o.Now, log: o.Logger, pending: map[int64]map[string]int64{}}
	}
	registered := promauto.With(r.reg)
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return registered.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return registered.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		opts := prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}
		return registered.NewHistogramVec(opts, labels)
	}

	r.jobs = counter("jobs_total", "Job state changes: queued (created), waiting, deferred, succeeded, failed, cancelled.", "tier", "model", "status")
	r.providerCalls = counter("provider_calls_total", "Provider calls by deployment (provider/upstream) and HTTP status code; code 0 is no answer (network error or timeout).", "deployment", "model", "code")
	r.callDuration = histogram("provider_call_duration_seconds", "Duration of provider calls.", []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120}, "deployment", "model")
	r.failovers = counter("failovers_total", "Jobs that left a deployment for another of their model (or a fallback's) after a fault or a 429 there, by the deployment left.", "model", "deployment")
	r.tokens = counter("tokens_total", "Tokens of succeeded jobs as the provider counted them; direction is input (prompt) or output (completion).", "tier", "model", "direction")
	r.cost = counter("cost_usd_total", "Dollars charged for succeeded jobs.", "tenant", "tier", "model")
	r.limiterWait = histogram("limiter_wait_seconds", "Time a job waited for its rate-limit permit; outcome is acquired (slept in the handler) or requeued (the delay it went back to the queue for).", []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}, "model", "outcome")
	r.penalties = counter("limiter_penalties_total", "Provider 429s that paused a model for every worker.", "model")
	r.penaltySeconds = counter("limiter_penalty_seconds_total", "Seconds of pause imposed on a model after 429s.", "model")
	r.breakerState = gauge("circuit_breaker_state", "1 for the state a deployment's circuit breaker is in (closed, open, half-open) as this process last saw it, else 0.", "deployment", "state")
	r.breakerChanges = counter("circuit_breaker_transitions_total", "Circuit breaker changes into each state.", "deployment", "state")
	r.learnedLimits = gauge("limits_learned", "Limits a provider announced for a model that differ from the policy's (0: none announced).", "model", "limit")
	r.unpredicted429s = counter("limiter_unpredicted_429s_total", "Provider 429s on calls a model's buckets admitted, by the bucket the provider showed exhausted (every bucket when it did not say): each lowers the bucket's limit factor.", "model", "bucket")
	r.shortWindow429s = counter("limiter_short_window_429s_total", "Provider 429s on calls a model's buckets admitted while the provider's counts showed room, by bucket: the provider counts the limit over a shorter window than its period, and the bucket's burst is lowered.", "model", "bucket")
	r.usageUnbelieved = counter("provider_usage_unbelieved_total", "Provider answers whose usage llmq did not take, by reason: missing (the job is charged its worst case and its usage says estimated) or invalid (negative or beyond the request: the job fails, charged its worst case).", "model", "reason")
	r.queueWait = histogram("queue_wait_seconds", "Time a job waited in the fair queue of its model before the scheduler released it to the workers.", []float64{0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800, 3600}, "priority")
	r.softCrossings = counter("budget_soft_limit_crossings_total", "Tenants crossing the soft limit of their daily budget.", "tenant", "tier")
	r.budgetRaised = counter("budget_rebuilt_total", "Budget days (a tenant's or the global) whose spend in Redis was raised to the ledger's, by reason: lost (Redis had lost the day), restored (a day of another Redis incarnation, after a restart, restore or failover, counted less than the ledger), periodic (the reconciler's check of today's days found it behind).", "reason")
	r.budgetRaisedUSD = counter("budget_rebuilt_usd_total", "Dollars those raises added to the days' spend in Redis.", "reason")
	r.webhookAttempts = counter("webhook_deliveries_total", "Webhook delivery attempts by outcome (delivered or failed).", "kind", "outcome")
	r.webhookFailures = counter("webhook_failures_total", "Failed webhook delivery attempts by reason.", "kind", "reason")

	if !o.NoProcessMetrics {
		r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return r
}

// Registry is the process's registry.
func (r *Recorder) Registry() *prometheus.Registry { return r.reg }

// Register adds collectors to the registry.
func (r *Recorder) Register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := r.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// WatchReady exports llmq_ready{dependency=name}: 1 while check succeeds
// at a scrape, 0 while it fails.
func (r *Recorder) WatchReady(name string, check func(context.Context) error) error {
	return r.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "ready", ConstLabels: prometheus.Labels{"dependency": name},
		Help: "1 while this process reaches the dependency (redis, database), 0 while it does not; checked at each scrape.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return boolFloat(check(ctx) == nil)
	}))
}

// Handler serves the registry; a collector that fails is logged and left
// out.
func (r *Recorder) Handler() http.Handler {
	return promhttp.InstrumentMetricHandler(r.reg, promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{
		ErrorLog:      slogErrorLog{r.log},
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       10 * time.Second,
	}))
}

type slogErrorLog struct{ l *slog.Logger }

func (s slogErrorLog) Println(v ...any) { s.l.Warn("metrics: collect", "err", fmt.Sprint(v...)) }

// ProviderCall implements worker.Observer.
func (r *Recorder) ProviderCall(deployment, model string, status int, d time.Duration) {
	r.providerCalls.WithLabelValues(deployment, model, strconv.Itoa(status)).Inc()
	r.callDuration.WithLabelValues(deployment, model).Observe(d.Seconds())
	r.stats.addPer(FieldCalls, deployment)
	if status == http.StatusTooManyRequests {
		r.stats.addPer(FieldCalls429, deployment)
	}
}

// JobFinished implements worker.Observer.
func (r *Recorder) JobFinished(tenantID, tier, model, status string, promptTokens, completionTokens, costMicros int64) {
	r.JobState(tier, model, status)
	if promptTokens > 0 {
		r.tokens.WithLabelValues(tier, model, "input").Add(float64(promptTokens))
	}
	if completionTokens > 0 {
		r.tokens.WithLabelValues(tier, model, "output").Add(float64(completionTokens))
	}
	if costMicros > 0 {
		r.cost.WithLabelValues(tenantID, tier, model).Add(float64(costMicros) / 1e6)
	}
	r.stats.add(FieldTokensIn, promptTokens)
	r.stats.add(FieldTokensOut, completionTokens)
	r.stats.add(FieldCostMicros, costMicros)
}

// JobState implements worker.Observer and api.Observer.
func (r *Recorder) JobState(tier, model, status string) {
	r.jobs.WithLabelValues(tier, model, status).Inc()
	r.stats.add(FieldJobs+status, 1)
}

// Failover implements worker.Observer.
func (r *Recorder) Failover(model, deployment string) {
	r.failovers.WithLabelValues(model, deployment).Inc()
}

// LimiterWait implements worker.Observer.
func (r *Recorder) LimiterWait(model string, d time.Duration, requeued bool) {
	outcome := "acquired"
	if requeued {
		outcome = "requeued"
		r.stats.addPer(FieldLimiterRequeued, model)
	}
	r.limiterWait.WithLabelValues(model, outcome).Observe(d.Seconds())
}

// Penalized implements worker.Observer.
func (r *Recorder) Penalized(model string, d time.Duration) {
	r.penalties.WithLabelValues(model).Inc()
	r.penaltySeconds.WithLabelValues(model).Add(d.Seconds())
}

// BreakerState implements worker.Observer: the gauge of the new state
// becomes 1 and the others of the deployment 0.
func (r *Recorder) BreakerState(deployment, state string) {
	for _, s := range breakerStates {
		r.breakerState.WithLabelValues(deployment, s).Set(boolFloat(s == state))
	}
	r.breakerChanges.WithLabelValues(deployment, state).Inc()
}

// LimitsLearned implements worker.Observer.
func (r *Recorder) LimitsLearned(model string, rpm, tpm int64) {
	r.learnedLimits.WithLabelValues(model, "rpm").Set(float64(rpm))
	r.learnedLimits.WithLabelValues(model, "tpm").Set(float64(tpm))
}

// UnpredictedRateLimit implements worker.Observer.
func (r *Recorder) UnpredictedRateLimit(model string, buckets []string) {
	for _, b := range buckets {
		r.unpredicted429s.WithLabelValues(model, b).Inc()
	}
	r.stats.addPer(FieldUnpredicted429, model)
}

// UsageUnbelieved implements worker.Observer.
func (r *Recorder) UsageUnbelieved(model, reason string) {
	r.usageUnbelieved.WithLabelValues(model, reason).Inc()
}

// ShortWindowRateLimit implements worker.Observer.
func (r *Recorder) ShortWindowRateLimit(model string, buckets []string) {
	for _, b := range buckets {
		r.shortWindow429s.WithLabelValues(model, b).Inc()
	}
}

// Released implements scheduler.Observer.
func (r *Recorder) Released(priority string, waited time.Duration) {
	r.queueWait.WithLabelValues(priority).Observe(waited.Seconds())
}

// SoftLimitCrossed implements worker.Observer.
func (r *Recorder) SoftLimitCrossed(tenantID, tier string) {
	r.softCrossings.WithLabelValues(tenantID, tier).Inc()
}

// BudgetRaised implements budget.Observer.
func (r *Recorder) BudgetRaised(reason string, added money.Micros) {
	r.budgetRaised.WithLabelValues(reason).Inc()
	r.budgetRaisedUSD.WithLabelValues(reason).Add(added.USD())
	r.stats.add(FieldBudgetRaised, 1)
	r.stats.add(FieldBudgetRaisedMicros, int64(added))
}

// WebhookDelivery counts one webhook delivery attempt of kind ("job",
// "batch"): outcome is "delivered", or the reason of a failure ("http_4xx",
// "timeout", "gave_up"...). Reasons past the sixteenth distinct one count
// as "other".
func (r *Recorder) WebhookDelivery(kind, outcome string) {
	if outcome == "delivered" {
		r.webhookAttempts.WithLabelValues(kind, "delivered").Inc()
		return
	}
	r.webhookAttempts.WithLabelValues(kind, "failed").Inc()
	r.webhookFailures.WithLabelValues(kind, r.reason(outcome)).Inc()
	r.stats.add(FieldWebhookFailures, 1)
}

func (r *Recorder) reason(s string) string {
	if s == "" || len(s) > 32 {
		return "other"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.webhookReasons[s] {
		return s
	}
	if len(r.webhookReasons) >= maxWebhookReasons {
		return "other"
	}
	r.webhookReasons[s] = true
	return s
}
