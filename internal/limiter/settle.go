package limiter

import (
	"context"
	_ "embed" // the script's Lua
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
	// factorDecrease multiplies a bucket's limit factor on an unpredicted
	// 429, at most once per factorCooldown, down to factorFloor.
	factorDecrease = 0.85
	factorCooldown = 5 * time.Second
	factorFloor    = 0.1
	// drainMinSpan is how long the provider's bucket must have been seen
	// busy before a drain is assumed.
	drainMinSpan = 15 * time.Second
	// drainMax bounds the share of the refill others may be thought to take.
	drainMax = 0.9
	// busyShare: the provider's bucket is busy (its counts say something
	// about the others' use) while less than this share of it is free.
	busyShare = 0.5
	// refundWindow is the memory of the drain and refund estimates.
	refundWindow = 2 * time.Minute
	// distrustAfter unpredicted 429s within distrustWindow stop the
	// provider's counts from lowering the buckets for distrustFor.
	distrustAfter  = 3
	distrustWindow = time.Minute
	distrustFor    = 10 * time.Minute
	// calibrationSamples is how many prompt ratios the calibration keeps.
	calibrationSamples = 31
	// recalibration is the change of the calibration that restarts the
	// drain's sums: the corrections before it say nothing about others.
	recalibration = 0.05
	// refusalsKept is how many refused calls a bucket remembers, so the
	// provider's answers are not read as if it had charged them.
	refusalsKept = 64
	// burstDecrease multiplies a bucket's burst on a 429 that showed a
	// shorter window; shortDecrease multiplies its pace's rate instead when
	// the burst is below burstMin of its window already.
	burstDecrease = 0.25
	burstMin      = 0.5
	shortDecrease = 0.95
	// Two unpredicted 429s at least estimateMin and at most the bucket's
	// period apart bound the provider's rate by what was let through
	// between them (it had no room at either), taken at estimateSafety of
	// it.
	estimateMin    = 2 * time.Second
	estimateSafety = 0.95
	// A bucket's pace lets its refill out at paceMax times its rate at
	// most, and paceMin at least: it grows by paceGrowth of the rate a second (counted over at
	// most paceStep between answers) while the provider's counts show at
	// least paceSpare of its bucket free, and goes back to the rate, for
	// paceHold, after a 429 the buckets did not predict.
	paceMax    = 2.0
	paceMin    = 0.5
	paceSpare  = 0.5
	paceStep   = time.Second
	paceGrowth = 0.01
	paceHold   = 10 * time.Minute
)

// Feedback is what a provider's answer says about one call, for Settle.
type Feedback struct {
	// Charged is what the provider most likely charged the call: its own
	// count of the prompt plus max_tokens, as OpenAI counts at admission.
	// What it charged beyond the reservation is taken too; what it charged
	// less is not given back (a provider that refunds shows it in its
	// counts). Zero fields mean the reservation's.
	Charged Cost
	// Unused is the part of max_tokens the call left unused: what a
	// provider that refunds gives back, for the refund estimate.
	Unused Cost
	// Observed are the provider's own views of some of the scope's buckets,
	// from its x-ratelimit-* headers.
	Observed []Observed
	// Evidence names the buckets a 429 showed to be ahead of the
	// provider's: it refused a call they admitted while its counts showed
	// them without room (or it sent no counts).
	Evidence []string
	// ShortWindow names the buckets a 429 showed to be counted by the
	// provider over a shorter window than their period: it refused a call
	// they admitted while its counts showed room for it. Their burst is
	// lowered (see Bucket.Burst).
	ShortWindow []string
	// BlockWindow names those of ShortWindow whose window the provider's
	// wait showed to free in a block (a fixed window: the wait is longer
	// than the call's cost takes to refill): their pace is lowered too,
	// since the calls crossing the window's edge count in it together.
	BlockWindow []string
	// PromptRatio is the provider's count of the prompt over llmq's
	// estimate, for the calibration; 0 when unknown.
	PromptRatio float64
	// Refused is set when the provider refused the call (a 429): it
	// charged nothing. Buckets it reported on then give the call back
	// before following its view; the others keep it, since the 429 shows
	// them ahead of the provider.
	Refused bool
}

// Observed is the provider's view of one bucket when it answered.
type Observed struct {
	// Bucket is the scope's bucket it concerns ("rpm", "tpm").
	Bucket string
	// Remaining is what the provider said it still held.
	Remaining int64
	// Limit is the provider's limit for the bucket; 0 when it did not say.
	Limit int64
}

// Settlement is what a Settle applied and what the scope has learned.
type Settlement struct {
	// Applied is false when the reservation was settled before.
	Applied bool
	// Calibration is the scope's prompt-token correction after this call.
	Calibration Calibration
	// Buckets has one entry per bucket of the reservation's scope.
	Buckets []BucketSettlement
}

// BucketSettlement is one bucket after a Settle.
type BucketSettlement struct {
	Name string
	// Model is the level the bucket's own counting gave, Level the level
	// it holds after following the provider's view (tokens used).
	Model, Level int64
	// ProviderBound is the most the provider can have used by now, from
	// its answer; -1 when it said nothing about this bucket.
	ProviderBound int64
	// Drain is the share of the refill others take; Factor the share of
	// the limit the bucket may use after unpredicted 429s; BurstFactor the
	// share of its burst it lets out at once after 429s that showed a
	// shorter window.
	Drain, Factor, BurstFactor float64
}

// Calibration is a scope's correction of llmq's prompt-token estimates: the
// median of the provider's counts over llmq's in its last calls.
type Calibration struct {
	// Factor multiplies prompt estimates; 1 until enough calls were seen.
	Factor float64
	// Samples is how many calls the median is of.
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
// applies; calibrationBounds the correction applied; sampleBounds the
// prompt ratios kept (an outlier beyond them counts as the bound).
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

// settleScript settles a reservation once: what the call was charged, what
// the provider's answer says of its buckets, what it teaches the scope
// (settle.lua). What it learns is kept in the scope's state (see stateLua
// for every field), since the next run must see it at once. It writes the
// settled marker last: a run that fails leaves none, and its retry applies.
//
//go:embed settle.lua
var settleLua string
var settleScript = bucketScript(settleLua)

// Settle settles a provider call's reservation with what the provider
// answered (see Feedback): what it charged beyond the reservation is taken,
// nothing is given back on llmq's own say; each bucket the provider
// reported on then follows the provider's view, never holding more room
// than it, and the scope learns from the difference (the drain others cause,
// the refunds the provider makes, unpredicted 429s, the prompt calibration).
// Settling the probe ends the probe phase. It is idempotent: a reservation
// settled again within Options.ReconcileTTL changes nothing.
func (tb *TokenBucket) Settle(ctx context.Context, r *Reservation, fb Feedback) (*Settlement, error) {
	if r == nil {
		return nil, errors.New("limiter: Settle of a nil reservation")
	}
	if err := r.Scope.validate(Cost{}); err != nil {
		return nil, err
	}
	if fb.Charged.Requests < 0 || fb.Charged.Tokens < 0 || fb.Unused.Requests < 0 || fb.Unused.Tokens < 0 {
		return nil, fmt.Errorf("limiter: scope %q: negative feedback %+v", r.Scope.Name, fb)
	}
	if fb.PromptRatio < 0 || math.IsNaN(fb.PromptRatio) || math.IsInf(fb.PromptRatio, 0) {
		return nil, fmt.Errorf("limiter: scope %q: invalid prompt ratio %v", r.Scope.Name, fb.PromptRatio)
	}
	charged := fb.Charged
	if charged.Requests == 0 {
		charged.Requests = r.Cost.Requests
	}
	if charged.Tokens == 0 {
		charged.Tokens = r.Cost.Tokens
	}
	sample := ""
	if fb.PromptRatio > 0 {
		sample = strconv.FormatFloat(fb.PromptRatio, 'f', 6, 64)
	}
	return tb.settle(ctx, r, "s", charged, fb, sample, true)
}

// Reconcile settles a reservation with the call's real cost: unused tokens
// go back (a bucket never fills beyond its capacity), extra ones are taken
// (a bucket may go into debt, which delays later callers). It is for
// permits whose cost is known exactly (leases, plain permits); a provider
// call is settled with Settle, which never assumes a refund. Reconciling the
// probe ends the probe phase. It is idempotent: a reservation reconciled
// again within Options.ReconcileTTL changes nothing. It uses the limits the
// reservation was made with.
func (tb *TokenBucket) Reconcile(ctx context.Context, r *Reservation, actual Cost) error {
	return tb.reconcile(ctx, r, actual, true)
}

// reconcile is Reconcile; without marker, the caller guarantees that r is
// reconciled once.
func (tb *TokenBucket) reconcile(ctx context.Context, r *Reservation, actual Cost, marker bool) error {
	if r == nil {
		return errors.New("limiter: Reconcile of a nil reservation")
	}
	if err := r.Scope.validate(Cost{}); err != nil {
		return err
	}
	if actual.Requests < 0 || actual.Tokens < 0 {
		return fmt.Errorf("limiter: scope %q: negative actual cost %+v", r.Scope.Name, actual)
	}
	_, err := tb.settle(ctx, r, "r", actual, Feedback{}, "", marker)
	return err
}

// Release gives back everything a reservation took: the call never reached
// the provider. It is Reconcile with a zero cost, and as idempotent. After a
// 429, call Penalize before releasing the probe, so the scope stays blocked.
func (tb *TokenBucket) Release(ctx context.Context, r *Reservation) error {
	return tb.Reconcile(ctx, r, Cost{})
}

func (tb *TokenBucket) settle(ctx context.Context, r *Reservation, mode string, charged Cost, fb Feedback, sample string, marker bool) (*Settlement, error) {
	probe := "0"
	if r.Probe {
		probe = "1"
	}
	refused := "0"
	if fb.Refused {
		refused = "1"
	}
	args := make([]any, 0, 9+12*len(r.Scope.Buckets))
	args = append(args, redisclock.Arg(tb.opts.Clock), tb.reconcileTTL, r.ID, probe, tb.probeTimeout, r.gen, mode, sample, refused)
	for i, b := range r.Scope.Buckets {
		var lag, pos int64
		if i < len(r.lag) {
			lag, pos = r.lag[i], r.pos[i]
		}
		olimit, oremain := "", ""
		if j := slices.IndexFunc(fb.Observed, func(o Observed) bool { return o.Bucket == b.Name }); j >= 0 {
			o := fb.Observed[j]
			oremain = strconv.FormatInt(max(o.Remaining, 0), 10)
			olimit = strconv.FormatInt(b.Limit, 10)
			if o.Limit > 0 {
				olimit = strconv.FormatInt(o.Limit, 10)
			}
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
			fb.Unused.Of(b.Unit), lag, pos, olimit, oremain, evidence)
	}
	keys := []string{tb.opts.Keys.LimiterScope(r.Scope.Name)}
	if marker {
		keys = append(keys, tb.opts.Keys.LimiterReconciled(r.Scope.Name, r.ID))
	}
	v, err := tb.scripts.Run(ctx, scripts.Call{Script: settleScript, Keys: keys, Args: args}).Result()
	var a []int64
	if err == nil {
		a, err = ints(v, 1)
	}
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
