// Package pacer is the one front of llmq's rate limiting against providers:
// a route's scope with the limits the provider announced (learned.go), the
// permit of every provider call and its settlement, the pause after a 429 or
// a fault, the room the scheduler releases into (Room) and the room
// synchronous requests hold (held.go). limiter is the mechanism underneath.
package pacer

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/coalesce"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/rkeys"
)

// Observer is told what the pacer learns, for metrics. Methods must be
// cheap and safe for concurrent use.
type Observer interface {
	// Penalized reports a 429 that paused a model's scope for d.
	Penalized(model string, d time.Duration)
	// LimitsLearned reports announced limits that differ from the policy's
	// (0: not announced).
	LimitsLearned(model string, rpm, tpm int64)
	// UnpredictedRateLimit and ShortWindowRateLimit report a 429's
	// limiter.Feedback.Evidence and ShortWindow.
	UnpredictedRateLimit(model string, buckets []string)
	ShortWindowRateLimit(model string, buckets []string)
}

type nopObserver struct{}

func (nopObserver) Penalized(string, time.Duration)       {}
func (nopObserver) LimitsLearned(string, int64, int64)    {}
func (nopObserver) UnpredictedRateLimit(string, []string) {}
func (nopObserver) ShortWindowRateLimit(string, []string) {}

// Options tune a Pacer. The zero value is ready to use.
type Options struct {
	// FaultPause is how long PauseFault pauses a deployment. Defaults to 1s.
	FaultPause time.Duration
	// Now is the clock of what the pacer caches. Defaults to time.Now.
	Now func() time.Time
}

const (
	maxRateLimitWait   = 120 * time.Second // the longest pause after one 429, whatever the provider says
	calibrationRefresh = time.Second       // how long a scope's prompt calibration is reused unread
)

// Pacer paces the provider calls of one process. It is safe for concurrent
// use.
type Pacer struct {
	// Learned keeps the limits providers announce; its Redis, keys, logger,
	// observer and clock are the pacer's.
	*Learned
	limiter    *limiter.TokenBucket
	faultPause time.Duration

	mu    sync.Mutex
	calib map[string]cachedCalibration // by scope
	// holding shares the EXISTS of a scope's holds (held.go).
	holding coalesce.Group[string, holdingAnswer]
}

type cachedCalibration struct {
	c  limiter.Calibration
	at time.Time
}

// New returns a Pacer over tb, sharing what it learns through rdb. logger
// and obs may be nil.
func New(tb *limiter.TokenBucket, rdb redis.UniversalClient, keys rkeys.Builder, logger *slog.Logger, obs Observer, opts Options) (*Pacer, error) {
	learned := NewLearned(rdb, keys, logger, obs) // defaults logger and obs
	if opts.Now != nil {
		learned.now = opts.Now
	}
	return &Pacer{Learned: learned, limiter: tb, faultPause: cmp.Or(opts.FaultPause, time.Second),
		calib: map[string]cachedCalibration{}}, nil
}

// Call is one provider call as the pacer counts it.
type Call struct {
	Route config.Route
	Scope limiter.Scope // with the limits the provider announced
	// PromptTokens is llmq's estimate of the prompt, MaxTokens the most
	// output (0 for embeddings).
	PromptTokens, MaxTokens int64
	Calibration             limiter.Calibration
	Cost                    limiter.Cost // the permit (admission.Charge)
	WorstCase               money.Micros // the budget's reservation on this route
	Shape                   *admission.Shape
}

// Plan returns the call a request of model m of shape s with llmq's
// estimate of promptTokens and maxTokens makes now.
func (p *Pacer) Plan(ctx context.Context, m config.Route, s *admission.Shape, promptTokens, maxTokens int64) *Call {
	scope := p.Scope(ctx, m)
	c := &Call{Route: m, Scope: scope, PromptTokens: promptTokens, MaxTokens: maxTokens, Shape: s,
		Calibration: p.Calibration(ctx, scope.Name)}
	c.Cost, c.WorstCase = admission.Charge(m, s, c.Calibration, promptTokens, maxTokens)
	return c
}

// Room is what one route admits now and within a lookahead: what the
// scheduler may release to async jobs.
type Room struct {
	queue.Room
	Paused bool // by a 429 or a fault
}

// Room is what r's buckets admit now and within lookahead: the least over
// the buckets of what each lets out now (bounded by its burst) plus its
// refill in lookahead. The fair queue counts a job's tokens all told (its
// prompt and output limit): a bucket of input or output tokens alone counts
// as its room over the share of the tokens its kind took of the scope's
// permits (tokenShares). Force is set when its token buckets are at least
// half full, so a job larger than they ever hold at once still goes,
// alone. The room synchronous requests hold is left out, and then nothing
// is forced.
func (p *Pacer) Room(ctx context.Context, r config.Route, lookahead time.Duration) (Room, error) {
	room := Room{Room: queue.Room{Tokens: math.Inf(1), Requests: math.Inf(1)}}
	sc := p.Scope(ctx, r)
	st, err := p.limiter.State(ctx, sc)
	if err != nil {
		return room, err
	}
	room.Factor = p.Calibration(ctx, sc.Name).Factor
	if st.Penalized {
		room.Tokens, room.Requests, room.Paused = 0, 0, true
		return room, nil
	}
	room.Force = true
	share := tokenShares(st.Buckets)
	for i, b := range st.Buckets {
		limit := sc.Buckets[i]
		now := b.Remaining
		if b.Burst >= 0 {
			now = min(now, b.Burst)
		}
		ahead := float64(now) + float64(limit.Limit)*float64(lookahead)/float64(limit.Period)
		if b.Unit.Counts() {
			room.Tokens = min(room.Tokens, ahead/share[b.Unit])
			room.Force = room.Force && b.Remaining >= limit.Limit/2
		} else {
			room.Requests = min(room.Requests, ahead)
		}
	}
	tokens, requests, err := p.Held(ctx, sc.Name)
	if err != nil {
		return room, err
	}
	if tokens > 0 || requests > 0 {
		room.Tokens, room.Requests = max(room.Tokens-tokens, 0), max(room.Requests-requests, 0)
		room.Force = false
	}
	return room, nil
}

// tokenShares is, per unit of token bucket, the share of a permit's tokens
// all told that it counts: 1 for total tokens; for input and output, what
// their buckets took over what all kinds took (a total bucket's, else input
// and output together), so that their room counts in the fair queue's unit.
// Without what to compare with, 1: the room counts as if every token were
// of the kind, which releases less, never more.
func tokenShares(bs []limiter.BucketState) map[limiter.Unit]float64 {
	share := map[limiter.Unit]float64{limiter.UnitTokens: 1, limiter.UnitInputTokens: 1, limiter.UnitOutputTokens: 1}
	taken := map[limiter.Unit]int64{} // the most a bucket of each unit took
	for _, b := range bs {
		taken[b.Unit] = max(taken[b.Unit], b.Taken)
	}
	in, out, all := taken[limiter.UnitInputTokens], taken[limiter.UnitOutputTokens], taken[limiter.UnitTokens]
	if all == 0 && in > 0 && out > 0 {
		all = in + out
	}
	for _, u := range []limiter.Unit{limiter.UnitInputTokens, limiter.UnitOutputTokens} {
		if taken[u] > 0 && all > taken[u] {
			share[u] = float64(taken[u]) / float64(all)
		}
	}
	return share
}

// Calibration returns the prompt correction of scope, read at most every
// calibrationRefresh. When Redis cannot be read it is the last one
// read, or none.
func (p *Pacer) Calibration(ctx context.Context, scope string) limiter.Calibration {
	now := p.now()
	p.mu.Lock()
	e, ok := p.calib[scope]
	p.mu.Unlock()
	if ok && now.Sub(e.at) < calibrationRefresh {
		return e.c
	}
	c, err := p.limiter.Calibration(ctx, scope)
	if err != nil {
		if ctx.Err() == nil {
			p.logger.Warn("read the prompt calibration", "scope", scope, "err", err)
		}
		if !ok {
			return limiter.Calibration{Factor: 1}
		}
		return e.c
	}
	p.remember(scope, c)
	return c
}

func (p *Pacer) remember(scope string, c limiter.Calibration) {
	p.mu.Lock()
	if len(p.calib) > 10_000 {
		clear(p.calib)
	}
	p.calib[scope] = cachedCalibration{c: c, at: p.now()}
	p.mu.Unlock()
}

// Reserve takes the call's permit, refreshing its scope first: limits
// learned while it waited apply to this try.
func (p *Pacer) Reserve(ctx context.Context, c *Call) (*limiter.Result, error) {
	c.Scope = p.Scope(ctx, c.Route)
	return p.limiter.Reserve(ctx, c.Scope, c.Cost)
}

// Outcome is how a provider call ended.
type Outcome struct {
	Response *llm.Response // when it succeeded
	Err      error         // else: an *llm.Error, or a network failure
	// RateLimitedBefore (the job's 429s) backs off a 429 that names no wait.
	RateLimitedBefore int
}

// After is what Done made of a call's end.
type After struct {
	Wait       time.Duration       // the scope's pause after a 429
	Settlement *limiter.Settlement // nil when settling failed (logged)
}

// Done settles the permit of a call that reached the provider. After a 429
// it first pauses the scope for every caller until the provider's reset (at
// most maxRateLimitWait), or a full-jitter backoff when it named no wait.
func (p *Pacer) Done(ctx context.Context, c *Call, permit *limiter.Reservation, o Outcome) After {
	ctx = context.WithoutCancel(ctx)
	var after After
	var rl llm.RateLimit
	fb := limiter.Feedback{}
	var pe *llm.Error
	switch {
	case o.Err == nil && o.Response != nil:
		rl = o.Response.RateLimit
		u := o.Response.Usage
		if u.PromptTokens > 0 {
			// What OpenAI charges at admission: the prompt and max_tokens;
			// input and output counted apart settle to the usage.
			input := u.PromptTokens
			if c.Route.Limits.CacheReadsFree {
				input -= min(u.CachedTokens, input)
			}
			fb.Charged = limiter.Cost{Requests: 1, Tokens: input + c.MaxTokens, Input: input, Output: u.CompletionTokens}
			fb.Usage = true
			// A prompt with what llmq did not count teaches no calibration.
			if c.PromptTokens > 0 && !c.Shape.Unseen() {
				fb.PromptRatio = float64(u.PromptTokens) / float64(c.PromptTokens)
			}
		}
		if c.MaxTokens > 0 {
			fb.Unused.Tokens = max(c.MaxTokens-u.CompletionTokens, 0)
		}
	case errors.As(o.Err, &pe):
		rl = pe.RateLimit
	}
	if rl.Has != 0 {
		p.Observe(ctx, c.Route, rl)
	}
	fb.Observed = observed(c.Scope, rl)
	if pe != nil && pe.Class == llm.ClassRateLimited {
		wait, ok := rl.Delay()
		if !ok {
			wait = queue.FullJitter(o.RateLimitedBefore, 500*time.Millisecond, 8*time.Second)
		}
		after.Wait = min(wait, maxRateLimitWait)
		if err := p.limiter.Penalize(ctx, c.Scope, after.Wait); err != nil {
			p.logger.Warn("penalize scope", "model", c.Route.Model.Name, "err", err)
		}
		p.obs.Penalized(c.Route.Model.Name, after.Wait)
		fb.Refused = true
		fb.Evidence, fb.ShortWindow = evidence(c, pe, rl)
		fb.BlockWindow = blockWindows(c, rl, fb.ShortWindow)
		if len(fb.Evidence) > 0 {
			p.obs.UnpredictedRateLimit(c.Route.Model.Name, fb.Evidence)
		}
		if len(fb.ShortWindow) > 0 {
			p.obs.ShortWindowRateLimit(c.Route.Model.Name, fb.ShortWindow)
		}
	}
	s, err := p.limiter.Settle(ctx, permit, fb)
	if err != nil {
		p.logger.Warn("settle rate limit", "model", c.Route.Model.Name, "err", err)
		return after
	}
	after.Settlement = s
	if s.Applied && fb.PromptRatio > 0 {
		p.remember(c.Scope.Name, s.Calibration)
	}
	return after
}

// Release gives a permit back: its call never reached the provider.
func (p *Pacer) Release(ctx context.Context, permit *limiter.Reservation) error {
	return p.limiter.Release(context.WithoutCancel(ctx), permit)
}

// PauseFault pauses c's scope for Options.FaultPause after the deployment
// failed the call (a 5xx, a timeout); then one probe tries it again.
func (p *Pacer) PauseFault(ctx context.Context, c *Call) {
	if err := p.limiter.Penalize(context.WithoutCancel(ctx), c.Scope, p.faultPause); err != nil {
		p.logger.Warn("pause a failing deployment", "scope", c.Scope.Name, "err", err)
	}
}

// announced are the provider's counts of each bucket its headers describe,
// by the bucket's name: requests and tokens per minute (OpenAI's, Azure's,
// Anthropic's), input and output tokens per minute (Anthropic's).
func announced(rl llm.RateLimit) map[string]limiter.Observed {
	out := map[string]limiter.Observed{}
	for _, a := range []struct {
		bucket           string
		has              llm.RateLimitField
		remaining, limit int64
	}{
		{"rpm", llm.HasRemainingRequests, rl.RemainingRequests, rl.LimitRequests},
		{"tpm", llm.HasRemainingTokens, rl.RemainingTokens, rl.LimitTokens},
		{"itpm", llm.HasRemainingInputTokens, rl.RemainingInputTokens, rl.LimitInputTokens},
		{"otpm", llm.HasRemainingOutputTokens, rl.RemainingOutputTokens, rl.LimitOutputTokens},
	} {
		if rl.Known(a.has) {
			out[a.bucket] = limiter.Observed{Bucket: a.bucket, Remaining: a.remaining, Limit: a.limit}
		}
	}
	return out
}

// observed maps the provider's per-minute counts to the scope's buckets of
// the dimension they describe; a provisioned Azure deployment's
// utilization is the share of the tpm bucket in use.
func observed(s limiter.Scope, rl llm.RateLimit) []limiter.Observed {
	var out []limiter.Observed
	counts := announced(rl)
	for _, b := range s.Buckets {
		if o, ok := counts[b.Name]; ok {
			out = append(out, o)
		} else if b.Name == "tpm" && rl.Known(llm.HasUtilization) {
			out = append(out, limiter.Observed{Bucket: b.Name,
				Remaining: int64(float64(b.Limit) * max(1-rl.Utilization/100, 0))})
		}
	}
	return out
}

// evidence reads what a 429 on c, which the scope's buckets admitted, shows
// of them. rate names the buckets ahead of the provider's over their period
// (its counts show no room for the call in them); short those it counts
// over a shorter window (its counts show room in every bucket it reports,
// and yet it refused). Without counts, either may be. A 429 that names its
// kind ("requests" or "tokens", as OpenAI's error type does) concerns only
// the buckets of that unit.
func evidence(c *Call, pe *llm.Error, rl llm.RateLimit) (rate, short []string) {
	counts := map[string]bool{} // bucket → the provider's count showed room
	for name, o := range announced(rl) {
		i := slices.IndexFunc(limiter.ModelBuckets, func(b limiter.ModelBucket) bool { return b.Name == name })
		counts[name] = o.Remaining >= c.Cost.Of(limiter.ModelBuckets[i].Unit)
	}
	if _, ok := counts["tpm"]; !ok && rl.Known(llm.HasUtilization) {
		counts["tpm"] = rl.Utilization < 100
	}
	room := len(counts) > 0
	for _, r := range counts {
		room = room && r
	}
	for _, b := range c.Scope.Buckets {
		if pe.Type == "requests" && b.Unit != limiter.UnitRequests || pe.Type == "tokens" && !b.Unit.Counts() {
			continue
		}
		showed, reported := counts[b.Name]
		switch {
		case len(counts) == 0:
			rate, short = append(rate, b.Name), append(short, b.Name)
		case reported && !showed:
			rate = append(rate, b.Name)
		case room && b.Burst > 0:
			short = append(short, b.Name)
		}
	}
	return rate, short
}

// blockWindows names the buckets of short whose window the 429's wait shows
// to free in a block (a fixed window): the wait is more than twice the
// refill of the call's cost, plus a second's rounding for whole seconds.
func blockWindows(c *Call, rl llm.RateLimit, short []string) []string {
	wait, ok := rl.Delay()
	if !ok {
		return nil
	}
	var out []string
	for _, b := range c.Scope.Buckets {
		if !slices.Contains(short, b.Name) {
			continue
		}
		refill := time.Duration(float64(c.Cost.Of(b.Unit)) / float64(b.Limit) * float64(b.Period))
		slack := 100 * time.Millisecond
		if !rl.Known(llm.HasRetryAfter) || wait%time.Second == 0 {
			slack = time.Second
		}
		if wait > 2*refill+slack {
			out = append(out, b.Name)
		}
	}
	return out
}
