package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// What Settle learns, and how fast (docs/ARCHITECTURE.md, "What the limiter
// learns from the provider").
const (
	factorDecrease = 0.85 // a limit factor, on an unpredicted 429
	factorCooldown = 5 * time.Second
	factorFloor    = 0.1
	drainMinSpan   = 15 * time.Second // busy this long before a drain is assumed
	drainMax       = 0.9
	busyShare      = 0.5 // the provider's bucket is busy below this share free
	refundWindow   = 2 * time.Minute
	// distrustAfter unpredicted 429s within distrustWindow stop the
	// provider's counts from lowering the buckets for distrustFor.
	distrustAfter      = 3
	distrustWindow     = time.Minute
	distrustFor        = 10 * time.Minute
	calibrationSamples = 31
	recalibration      = 0.05 // a calibration change that restarts the drain's sums
	refusalsKept       = 64
	// A 429 that shows a shorter window multiplies the burst by
	// burstDecrease, or the pace's rate by shortDecrease once the burst is
	// below burstMin.
	burstDecrease = 0.25
	burstMin      = 0.5
	shortDecrease = 0.95
	// Two unpredicted 429s estimateMin to a period apart bound the
	// provider's rate by what went through between them.
	estimateMin    = 2 * time.Second
	estimateSafety = 0.95
	// The pace grows by paceGrowth of the rate a second (over paceStep at
	// most) while the provider shows paceSpare free, within [paceMin,
	// paceMax], and goes back to the rate for paceHold after an unpredicted
	// 429.
	paceMax    = 2.0
	paceMin    = 0.5
	paceSpare  = 0.5
	paceStep   = time.Second
	paceGrowth = 0.01
	paceHold   = 10 * time.Minute
)

// Feedback is what a provider's answer says about one call, for Settle.
type Feedback struct {
	// Charged is what the provider most likely charged (its count of the
	// prompt plus max_tokens); what it charged beyond the reservation is
	// taken, nothing is given back. Zero fields mean the reservation's.
	// Its Input and Output are the call's real counts of each kind when
	// Usage is set: buckets of input or output tokens settle to them, up
	// or down (Unit.settlesToUsage).
	Charged  Cost
	Usage    bool
	Unused   Cost       // the part of max_tokens left unused, for the refund estimate
	Observed []Observed // the provider's views of buckets (x-ratelimit-*)
	// Evidence names the buckets a 429 showed ahead of the provider's;
	// ShortWindow those it showed counted over a shorter window than their
	// period (their burst is lowered); BlockWindow those of them whose
	// window frees in a block (their pace is lowered too).
	Evidence, ShortWindow, BlockWindow []string
	// PromptRatio is the provider's prompt count over llmq's estimate; 0
	// when unknown.
	PromptRatio float64
	// Refused: the provider refused the call (a 429) and charged nothing.
	// Buckets it reported on give the call back before following it.
	Refused bool
}

// Observed is the provider's view of one bucket when it answered.
type Observed struct {
	Bucket           string // "rpm", "tpm"
	Remaining, Limit int64  // Limit is 0 when it did not say
}

// Settlement is what a Settle applied and what the scope has learned.
type Settlement struct {
	Applied     bool // false when the reservation was settled before
	Calibration Calibration
	Buckets     []BucketSettlement // one per bucket of the scope
}

// BucketSettlement is one bucket after a Settle.
type BucketSettlement struct {
	Name string
	// Model is the level the bucket's own counting gave, Level the level
	// after following the provider's view (tokens used).
	Model, Level int64
	// ProviderBound is the most the provider can have used by now; -1 when
	// it said nothing of this bucket.
	ProviderBound int64
	// Drain is the share of the refill others take, Factor the share of
	// the limit left after unpredicted 429s, BurstFactor the share of the
	// burst left after 429s that showed a shorter window.
	Drain, Factor, BurstFactor float64
}

// Calibration is a scope's correction of llmq's prompt-token estimates: the
// median of the provider's counts over llmq's in its last calls.
type Calibration struct {
	Factor  float64 // 1 until enough calls were seen
	Samples int
}

// Apply returns a prompt estimate corrected by c, rounded up.
func (c Calibration) Apply(promptTokens int64) int64 {
	if c.Factor == 1 || c.Factor <= 0 {
		return promptTokens
	}
	return int64(math.Ceil(float64(promptTokens) * c.Factor))
}

// minCalibrationSamples is how many calls a correction needs before it
// applies; a prompt ratio beyond sampleBounds counts as the bound.
const minCalibrationSamples = 3

var (
	calibrationBounds = [2]float64{0.25, 4}
	sampleBounds      = [2]float64{0.1, 10}
)

func calibration(micros, n int64) Calibration {
	c := Calibration{Factor: 1, Samples: int(n)}
	if n >= minCalibrationSamples && micros > 0 {
		c.Factor = min(max(float64(micros)/1e6, calibrationBounds[0]), calibrationBounds[1])
	}
	return c
}

// settleScript writes the settled marker last: a run that fails leaves
// none, and its retry applies.
var settleScript = bucketScript("settle.lua")

// Settle settles a provider call's reservation with what the provider
// answered: what it charged beyond the reservation is taken, nothing is
// given back on llmq's own say; each bucket the provider reported on then
// follows the provider's view, never holding more room than it, and the
// scope learns from the difference. Settling the probe ends the probe phase.
// A reservation settled again within reconcileTTL changes nothing.
func (tb *TokenBucket) Settle(ctx context.Context, r *Reservation, fb Feedback) (*Settlement, error) {
	if r == nil {
		return nil, errors.New("limiter: Settle of a nil reservation")
	}
	if fb.Charged.negative() || fb.Unused.negative() {
		return nil, fmt.Errorf("limiter: scope %q: negative feedback %+v", r.Scope.Name, fb)
	}
	if fb.PromptRatio < 0 || math.IsNaN(fb.PromptRatio) || math.IsInf(fb.PromptRatio, 0) {
		return nil, fmt.Errorf("limiter: scope %q: invalid prompt ratio %v", r.Scope.Name, fb.PromptRatio)
	}
	charged := Cost{Requests: cmp.Or(fb.Charged.Requests, r.Cost.Requests), Tokens: cmp.Or(fb.Charged.Tokens, r.Cost.Tokens),
		Input: r.Cost.Input, Output: r.Cost.Output}
	if fb.Usage {
		charged.Input, charged.Output = fb.Charged.Input, fb.Charged.Output
	}
	sample := ""
	if fb.PromptRatio > 0 {
		sample = strconv.FormatFloat(fb.PromptRatio, 'f', 6, 64)
	}
	return tb.settle(ctx, r, "s", charged, fb, sample, true)
}

// Reconcile settles a reservation with the call's real cost: unused tokens
// go back, extra ones are taken (a bucket may go into debt). It is for
// permits whose cost is known exactly; a provider call is settled with
// Settle, which never assumes a refund. It is idempotent as Settle is, and
// uses the limits the reservation was made with.
func (tb *TokenBucket) Reconcile(ctx context.Context, r *Reservation, actual Cost) error {
	return tb.reconcile(ctx, r, actual, true)
}

// reconcile is Reconcile; without marker, the caller reconciles r once.
func (tb *TokenBucket) reconcile(ctx context.Context, r *Reservation, actual Cost, marker bool) error {
	if r == nil {
		return errors.New("limiter: Reconcile of a nil reservation")
	}
	if actual.negative() {
		return fmt.Errorf("limiter: scope %q: negative actual cost %+v", r.Scope.Name, actual)
	}
	_, err := tb.settle(ctx, r, "r", actual, Feedback{}, "", marker)
	return err
}

// Release gives back everything a reservation took: the call never reached
// the provider. After a 429, call Penalize before releasing the probe, so
// the scope stays blocked.
func (tb *TokenBucket) Release(ctx context.Context, r *Reservation) error {
	return tb.Reconcile(ctx, r, Cost{})
}

func (tb *TokenBucket) settle(ctx context.Context, r *Reservation, mode string, charged Cost, fb Feedback, sample string, marker bool) (*Settlement, error) {
	// go-redis sends a bool as 1 or 0.
	args := make([]any, 0, 9+13*len(r.Scope.Buckets))
	args = append(args, redisclock.Arg(tb.opts.Clock), reconcileTTL.Milliseconds(), r.ID, r.Probe,
		tb.opts.ProbeTimeout.Microseconds(), r.gen, mode, sample, fb.Refused)
	for i, b := range r.Scope.Buckets {
		var lag, pos int64
		if i < len(r.lag) {
			lag, pos = r.lag[i], r.pos[i]
		}
		olimit, oremain := "", ""
		if j := slices.IndexFunc(fb.Observed, func(o Observed) bool { return o.Bucket == b.Name }); j >= 0 {
			o := fb.Observed[j]
			oremain = strconv.FormatInt(max(o.Remaining, 0), 10)
			olimit = strconv.FormatInt(cmp.Or(max(o.Limit, 0), b.Limit), 10)
		}
		evidence := ""
		if slices.Contains(fb.Evidence, b.Name) {
			evidence += "r"
		}
		if slices.Contains(fb.ShortWindow, b.Name) {
			evidence += "s"
			if slices.Contains(fb.BlockWindow, b.Name) {
				evidence += "b"
			}
		}
		args = append(args, b.Name, b.Limit, b.Period.Microseconds(), b.Burst.Microseconds(), r.Cost.Of(b.Unit), charged.Of(b.Unit),
			fb.Unused.Of(b.Unit), lag, pos, olimit, oremain, evidence, b.Unit.settlesToUsage())
	}
	keys := []string{tb.opts.Keys.LimiterScope(r.Scope.Name)}
	if marker {
		keys = append(keys, tb.opts.Keys.LimiterReconciled(r.Scope.Name, r.ID))
	}
	a, err := ints(tb.scripts.Run(ctx, scripts.Call{Script: settleScript, Keys: keys, Args: args}), 1)
	if err != nil {
		return nil, fmt.Errorf("limiter: settle on scope %q: %w", r.Scope.Name, err)
	}
	s := &Settlement{Applied: a[0] == 1}
	if !s.Applied {
		return s, nil
	}
	if len(a) != 3+6*len(r.Scope.Buckets) {
		return nil, fmt.Errorf("limiter: settle on scope %q: unexpected reply %v", r.Scope.Name, a)
	}
	s.Calibration = calibration(a[1], a[2])
	for i, b := range r.Scope.Buckets {
		x := a[3+6*i:]
		s.Buckets = append(s.Buckets, BucketSettlement{Name: b.Name, Model: x[0], Level: x[1], ProviderBound: x[2],
			Drain: float64(x[3]) / 1e6, Factor: float64(x[4]) / 1e6, BurstFactor: float64(x[5]) / 1e6})
	}
	return s, nil
}
