package worker

import (
	"time"

	"github.com/llmq/llmq/internal/pacer"
)

// Observer is told what the worker does, for metrics. Methods must be cheap
// and safe for concurrent use; labels are never job ids.
type Observer interface {
	pacer.Observer
	// ProviderCall reports one provider call on a deployment: its status
	// (0 for a network error) and how long it took.
	ProviderCall(deployment, model string, status int, d time.Duration)
	// JobFinished reports a job reaching a terminal state with its real
	// usage and cost in micro-dollars (zero when it failed).
	JobFinished(tenantID, tier, model, status string, promptTokens, completionTokens int64, costMicros int64)
	// JobState reports a non-terminal state change (waiting, deferred).
	JobState(tier, model, status string)
	// LimiterWait reports how long a job waited for its permit.
	LimiterWait(model string, d time.Duration, requeued bool)
	// BreakerState reports a deployment's circuit breaker changing state.
	BreakerState(deployment, state string)
	// Failover reports a job of model leaving deployment for another.
	Failover(model, deployment string)
	// SoftLimitCrossed reports a tenant crossing its budget's soft limit.
	SoftLimitCrossed(tenantID, tier string)
	// UsageUnbelieved reports an answer whose usage llmq did not take
	// ("missing" or "invalid").
	UsageUnbelieved(model, reason string)
}

type nopObserver struct{}

func (nopObserver) ProviderCall(string, string, int, time.Duration)                 {}
func (nopObserver) JobFinished(string, string, string, string, int64, int64, int64) {}
func (nopObserver) JobState(string, string, string)                                 {}
func (nopObserver) LimiterWait(string, time.Duration, bool)                         {}
func (nopObserver) Failover(string, string)                                         {}
func (nopObserver) Penalized(string, time.Duration)                                 {}
func (nopObserver) BreakerState(string, string)                                     {}
func (nopObserver) LimitsLearned(string, int64, int64)                              {}
func (nopObserver) UnpredictedRateLimit(string, []string)                           {}
func (nopObserver) ShortWindowRateLimit(string, []string)                           {}
func (nopObserver) SoftLimitCrossed(string, string)                                 {}
func (nopObserver) UsageUnbelieved(string, string)                                  {}
