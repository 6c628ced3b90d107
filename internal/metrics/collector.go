package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const collectTimeout = 10 * time.Second

// stateCollector exports a State at scrape time. Register it in one process
// per installation (the dispatcher): every worker would export the same
// shared state again.
type stateCollector struct {
	st  *State
	all []*prometheus.Desc

	remaining, limit, paused                           *prometheus.Desc
	capacity, provRemaining, provAge, drain, factor    *prometheus.Desc
	burst                                              *prometheus.Desc
	refund, calibration, calibSamples, distrusted      *prometheus.Desc
	spent, reserved, budget, budgetLeft, soft, trunced *prometheus.Desc
	workers                                            *prometheus.Desc
	queued, queuedAge                                  *prometheus.Desc
}

// Collector returns a prometheus.Collector of the State: bucket levels per
// model, budgets per tenant (up to StateOptions.MaxTenants), live workers.
func (s *State) Collector() prometheus.Collector {
	c := &stateCollector{st: s}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		desc := prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
		c.all = append(c.all, desc)
		return desc
	}
	c.remaining = d("limiter_bucket_remaining", "What a model's rate-limit bucket holds now (requests or tokens; negative while in debt).", "model", "deployment", "bucket")
	c.limit = d("limiter_bucket_limit", "The capacity of a model's rate-limit bucket, the policy's limit (requests or tokens).", "model", "deployment", "bucket")
	c.paused = d("limiter_paused", "1 while a provider 429 pauses the model for every worker.", "model", "deployment")
	c.capacity = d("limiter_bucket_capacity", "What a model's bucket may hold now: its limit (the policy's, or the lower one the provider announced) times its limit factor.", "model", "deployment", "bucket")
	c.provRemaining = d("limiter_provider_remaining", "What the provider last said the bucket holds (x-ratelimit-remaining-*), beside llmq's limiter_bucket_remaining.", "model", "deployment", "bucket")
	c.provAge = d("limiter_provider_remaining_age_seconds", "How long ago the provider said so.", "model", "deployment", "bucket")
	c.drain = d("limiter_drain_ratio", "The share of a bucket's refill the provider's counts show others (other applications on the account) take.", "model", "deployment", "bucket")
	c.factor = d("limiter_limit_factor", "The share of its limit a bucket uses after unpredicted 429s (1 = all; regained slowly).", "model", "deployment", "bucket")
	c.burst = d("limiter_burst_seconds", "The most of its refill a model's bucket lets out at once, in seconds (the policy's limits.burst, lowered after 429s that showed the provider counting over a shorter window; 0 = one call at a time, regained slowly).", "model", "deployment", "bucket")
	c.refund = d("limiter_refund_ratio", "The share of their unused max_tokens the provider's counts show it gives back to calls (absent until enough was seen; llmq never assumes one).", "model", "deployment", "bucket")
	c.calibration = d("limiter_prompt_calibration", "The correction applied to llmq's prompt-token estimates: the median of the provider's usage.prompt_tokens over llmq's estimate.", "model", "deployment")
	c.calibSamples = d("limiter_prompt_calibration_samples", "How many calls the prompt calibration is the median of.", "model", "deployment")
	c.distrusted = d("limiter_provider_counts_distrusted", "1 while repeated unpredicted 429s keep the provider's remaining counts from lowering the model's buckets.", "model", "deployment")
	c.spent = d("budget_spent_usd", "Dollars a tenant spent on its budget day so far.", "tenant", "tier")
	c.reserved = d("budget_reserved_usd", "Dollars a tenant holds reserved for jobs in flight.", "tenant", "tier")
	c.budget = d("budget_limit_usd", "A tenant's daily budget in dollars (absent when unlimited).", "tenant", "tier")
	c.budgetLeft = d("budget_remaining_usd", "Dollars a tenant may still spend today: budget - spent - reserved (absent when unlimited).", "tenant", "tier")
	c.soft = d("budget_soft_limit_usd", "A tenant's soft limit in dollars (absent when off or unlimited).", "tenant", "tier")
	c.trunced = d("budget_tenants_truncated", "1 when more tenants exist than the budget families carry (the cap of tenants read per scrape).")
	c.workers = d("workers", "Worker processes of this installation alive in Redis (asynq servers with a recent heartbeat).")
	c.queued = d("tenant_queued_jobs", "Jobs a tenant has waiting in the fair queue of a model at a priority, not yet released to the workers.", "tenant", "priority", "model")
	c.queuedAge = d("tenant_queue_oldest_seconds", "How long the oldest of them has waited.", "tenant", "priority", "model")
	return c
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.all {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}

	if models, err := c.st.Models(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.remaining, err)
	} else {
		for _, m := range models {
			for _, b := range m.Buckets {
				gauge(c.remaining, float64(b.Remaining), m.Model, m.Scope, b.Name)
				gauge(c.limit, float64(b.Limit), m.Model, m.Scope, b.Name)
			}
			gauge(c.paused, boolFloat(m.Paused), m.Model, m.Scope)
			if l := m.Learned; l != nil {
				for _, b := range l.Buckets {
					gauge(c.capacity, float64(b.Capacity), m.Model, m.Scope, b.Name)
					gauge(c.drain, b.Drain, m.Model, m.Scope, b.Name)
					gauge(c.factor, b.Factor, m.Model, m.Scope, b.Name)
					if b.Burst >= 0 {
						gauge(c.burst, b.BurstWindow.Seconds(), m.Model, m.Scope, b.Name)
					}
					if b.Refund >= 0 {
						gauge(c.refund, b.Refund, m.Model, m.Scope, b.Name)
					}
					if b.ProviderRemaining >= 0 {
						gauge(c.provRemaining, float64(b.ProviderRemaining), m.Model, m.Scope, b.Name)
						gauge(c.provAge, l.Time.Sub(b.ProviderSeen).Seconds(), m.Model, m.Scope, b.Name)
					}
				}
				gauge(c.calibration, l.Calibration.Factor, m.Model, m.Scope)
				gauge(c.calibSamples, float64(l.Calibration.Samples), m.Model, m.Scope)
				gauge(c.distrusted, boolFloat(l.Distrusted), m.Model, m.Scope)
			}
		}
	}

	if ts, err := c.st.Tenants(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.spent, err)
	} else {
		for _, t := range ts.List {
			gauge(c.spent, t.Spent.USD(), t.ID, t.Tier)
			gauge(c.reserved, t.Reserved.USD(), t.ID, t.Tier)
			if !t.Unlimited {
				gauge(c.budget, t.Budget.USD(), t.ID, t.Tier)
				gauge(c.budgetLeft, t.Remaining.USD(), t.ID, t.Tier)
			}
			if t.SoftMark > 0 {
				gauge(c.soft, t.SoftMark.USD(), t.ID, t.Tier)
			}
		}
		gauge(c.trunced, boolFloat(ts.Truncated))
	}

	n, err := c.st.Workers(ctx)
	switch {
	case errors.Is(err, errNoInspector):
	case err != nil:
		ch <- prometheus.NewInvalidMetric(c.workers, err)
	default:
		gauge(c.workers, float64(n))
	}

	if ws, err := c.st.Waiting(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.queued, err)
	} else {
		for _, w := range ws {
			gauge(c.queued, float64(w.Jobs), w.TenantID, w.Priority, w.Model)
			gauge(c.queuedAge, w.OldestWait.Seconds(), w.TenantID, w.Priority, w.Model)
		}
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
