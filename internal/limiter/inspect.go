package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/redisclock"
)

// ScopeLearning is a scope's buckets now and what they learned from the
// provider's answers, for metrics and the dashboard.
type ScopeLearning struct {
	Time        time.Time // Redis's (or the injected clock's)
	Buckets     []BucketLearning
	Calibration Calibration
	// Distrusted is true while repeated unpredicted 429s keep the
	// provider's counts from lowering the buckets, until DistrustedUntil.
	Distrusted      bool
	DistrustedUntil time.Time
}

// BucketLearning is one bucket now.
type BucketLearning struct {
	Name  string
	Limit int64
	// Capacity is the limit times Factor; Remaining the room it holds now.
	Capacity, Remaining int64
	// Drain, Factor and BurstFactor are as in BucketSettlement.
	Drain, Factor, BurstFactor float64
	// Burst is the most the bucket lets out at once now (-1: no bound but
	// its capacity): its refill over BurstWindow, Bucket.Burst times
	// BurstFactor (0: one call at a time).
	Burst       int64
	BurstWindow time.Duration
	// PaceFactor is how much faster than its rate the bucket lets its
	// refill out, grown while the provider's counts showed it more room
	// than that, 1 again after a 429 the buckets did not predict.
	PaceFactor float64
	// Refund is the share of their unused tokens the provider's counts
	// showed it gives back to calls; -1 until enough was seen.
	Refund float64
	// ProviderRemaining is what the provider last said the bucket holds,
	// at ProviderSeen; -1 when it never said.
	ProviderRemaining int64
	ProviderSeen      time.Time
}

var inspectScript = bucketScript("inspect.lua")

// minRefundEvidence is how many unused tokens, as a share of a bucket's
// limit, its refund estimate needs before it is shown.
const minRefundEvidence = 0.05

// Inspect returns scope's buckets now and what they learned.
func (tb *TokenBucket) Inspect(ctx context.Context, scope Scope) (*ScopeLearning, error) {
	if err := scope.validate(Cost{}); err != nil {
		return nil, err
	}
	args := []any{redisclock.Arg(tb.opts.Clock)}
	for _, b := range scope.Buckets {
		args = append(args, b.Name, b.Limit, b.Period.Microseconds(), b.Burst.Microseconds())
	}
	keys := []string{tb.opts.Keys.LimiterScope(scope.Name)}
	a, err := ints(inspectScript.Run(ctx, tb.rdb, keys, args...), 4+11*len(scope.Buckets))
	if err != nil {
		return nil, fmt.Errorf("limiter: inspect scope %q: %w", scope.Name, err)
	}
	li := &ScopeLearning{Time: time.UnixMicro(a[0]), Calibration: calibration(a[2], a[3])}
	if a[1] > 0 {
		li.Distrusted, li.DistrustedUntil = true, time.UnixMicro(a[1])
	}
	for i, b := range scope.Buckets {
		x := a[4+11*i:]
		bl := BucketLearning{Name: b.Name, Limit: b.Limit, Capacity: x[0], Remaining: x[1],
			Drain: float64(x[2]) / 1e6, Factor: float64(x[3]) / 1e6, Refund: -1, ProviderRemaining: x[6],
			BurstFactor: float64(x[8]) / 1e6, Burst: x[9], BurstWindow: time.Duration(float64(b.Burst) * float64(x[8]) / 1e6),
			PaceFactor: float64(x[10]) / 1e6}
		if w := float64(x[5]); w >= minRefundEvidence*float64(b.Limit) {
			bl.Refund = min(max(-float64(x[4])/w, 0), 1)
		}
		if x[7] > 0 {
			bl.ProviderSeen = time.UnixMicro(x[7])
		}
		li.Buckets = append(li.Buckets, bl)
	}
	return li, nil
}

// Calibration returns the prompt-token correction of the scope named scope.
func (tb *TokenBucket) Calibration(ctx context.Context, scope string) (Calibration, error) {
	li, err := tb.Inspect(ctx, Scope{Name: scope})
	if err != nil {
		return Calibration{Factor: 1}, err
	}
	return li.Calibration, nil
}
