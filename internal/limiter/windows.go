package limiter

import (
	"context"
	_ "embed" // the windows' shared Lua
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// Algorithm is how a WindowSet counts.
type Algorithm string

// The algorithms of Windows.
const (
	// AlgSlidingWindow is the sliding window counter (SlidingCounter): no
	// burst at window edges, three numbers per window, an estimate.
	AlgSlidingWindow Algorithm = "sliding_window"
	// AlgFixedWindow is the fixed window counter (FixedWindow): the
	// cheapest, with resets on the clock, and twice the limit possible
	// across a window boundary.
	AlgFixedWindow Algorithm = "fixed_window"
	// AlgSlidingLog is the sliding window log (SlidingLog): exact, one
	// entry per admission for a whole window.
	AlgSlidingLog Algorithm = "sliding_log"
	// AlgTokenBucket makes each window a token bucket (TokenBucket) of
	// Limit, refilled continuously at Limit per Period: bursts of up to
	// Limit after a quiet spell, then the steady rate.
	AlgTokenBucket Algorithm = "token_bucket"
)

// Algorithms lists every Algorithm, the default first.
var Algorithms = []Algorithm{AlgSlidingWindow, AlgFixedWindow, AlgSlidingLog, AlgTokenBucket}

// NamedWindow is one window of a WindowSet.
type NamedWindow struct {
	// Name tells the window apart in its scope and in Result.Buckets, e.g.
	// "minute" or "files.create:minute". A scope's state is kept per name.
	Name string
	Window
}

// WindowSet is what one Windows.Allow checks and counts: every window, or
// none.
type WindowSet struct {
	Algorithm Algorithm
	// Scope names the state, e.g. "api:key_…"; its hash tag keeps every key
	// of the set in one Redis Cluster slot. Sets of one scope may name
	// different windows (a key's own, or its own and an endpoint's): each
	// window's state is its own, by name.
	Scope   string
	Windows []NamedWindow
}

func (s WindowSet) validate(cost int64) error {
	if s.Scope == "" {
		return errors.New("limiter: WindowSet.Scope is empty")
	}
	if !isAlgorithm(s.Algorithm) {
		return fmt.Errorf("limiter: scope %q: unknown Algorithm %q", s.Scope, s.Algorithm)
	}
	if len(s.Windows) == 0 {
		return fmt.Errorf("limiter: scope %q: no windows", s.Scope)
	}
	for i, w := range s.Windows {
		if w.Name == "" || strings.ContainsAny(w.Name, "{} \t\n") {
			return fmt.Errorf("limiter: scope %q: window name %q must be non-empty, without braces or spaces", s.Scope, w.Name)
		}
		for _, o := range s.Windows[:i] {
			if o.Name == w.Name {
				return fmt.Errorf("limiter: scope %q: window name %q appears twice", s.Scope, w.Name)
			}
		}
		if err := checkWindow(s.Scope, w.Window, cost); err != nil {
			return fmt.Errorf("%w (window %q)", err, w.Name)
		}
	}
	return nil
}

func isAlgorithm(a Algorithm) bool {
	for _, x := range Algorithms {
		if a == x {
			return true
		}
	}
	return false
}

// windowExtendLua defines extend(key, ms), which sets key's expiry to ms
// unless the key already lives longer (window_extend.lua): a call knows
// only its own windows' needs, and must never shorten the expiry another
// call's windows need.
//
//go:embed window_extend.lua
var windowExtendLua string

// Windows checks WindowSets with any Algorithm: one script run (one round
// trip) per Allow, every window of the set counted or none, so a denial by
// one window never uses up the others. Limits are passed on every call, so
// a policy change applies to the next one; a set's state is kept per
// algorithm, so changing a scope's algorithm starts it afresh.
type Windows struct {
	rdb  redis.Scripter
	opts Options
	tb   *TokenBucket // plain permits: nothing held in flight
}

// NewWindows returns Windows over rdb. Of opts, it uses Keys and Clock.
func NewWindows(rdb scripts.Client, opts Options) (*Windows, error) {
	opts = opts.withDefaults()
	tbOpts := opts
	tbOpts.HoldInFlight = false
	tb, err := NewTokenBucket(rdb, tbOpts)
	if err != nil {
		return nil, err
	}
	return &Windows{rdb: rdb, opts: opts, tb: tb}, nil
}

// Allow counts cost in every window of set, or in none. Result.Buckets has
// one entry per window, in order, named as the windows are; Limit and
// Remaining are the tightest window's (see Result.Tightest). A cost above a
// window's limit fails at once with ErrCostExceedsCapacity.
func (w *Windows) Allow(ctx context.Context, set WindowSet, cost int64) (*Result, error) {
	res, _, err := w.take(ctx, set, cost, false)
	return res, err
}

// taken is what a prefetch took: enough to give back its unspent part.
type taken struct {
	set    WindowSet
	cost   int64
	starts []int64      // fixed and sliding windows: each window's start when counted, µs
	id     string       // sliding log: the entry
	at     int64        // sliding log: the entry's score, µs
	res    *Reservation // token bucket
}

// take runs one check of set; prefetch marks a take whose unspent part will be
// given back (never the probe).
func (w *Windows) take(ctx context.Context, set WindowSet, cost int64, prefetch bool) (*Result, *taken, error) {
	if err := set.validate(cost); err != nil {
		return nil, nil, err
	}
	t := &taken{set: set, cost: cost}
	var res *Result
	var err error
	switch set.Algorithm {
	case AlgFixedWindow:
		res, t.starts, err = runFixedWindow(ctx, w.rdb, w.opts, w.opts.Keys.FixedWindow(set.Scope), set.Scope,
			set.Windows, nameSuffixes(set.Windows), cost)
	case AlgSlidingWindow:
		res, t.starts, err = runSlidingCounter(ctx, w.rdb, w.opts, w.opts.Keys.SlidingCounter(set.Scope), set.Scope,
			set.Windows, nameSuffixes(set.Windows), cost)
	case AlgSlidingLog:
		t.id = newID()
		res, err = runSlidingLog(ctx, w.rdb, w.opts, w.logKeys(set), set.Scope, set.Windows, cost, t.id)
		if res != nil {
			t.at = res.Time.UnixMicro()
		}
	case AlgTokenBucket:
		mode := modeReserve
		if prefetch {
			mode = modeReservePrefetch
		}
		res, err = w.tb.reserve(ctx, mode, bucketScope(set), Cost{Requests: cost})
		if res != nil {
			t.res, res.Reservation = res.Reservation, nil
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return res, t, nil
}

// giveBack takes back, from every window t was counted in and still
// counts, the part of t's cost that was not spent.
func (w *Windows) giveBack(ctx context.Context, t *taken, spent int64) error {
	unspent := t.cost - spent
	if unspent <= 0 {
		return nil
	}
	clock := redisclock.Arg(w.opts.Clock)
	set := t.set
	var err error
	switch set.Algorithm {
	case AlgFixedWindow:
		args := []any{clock, unspent}
		for i, sfx := range nameSuffixes(set.Windows) {
			args = append(args, sfx, t.starts[i])
		}
		err = fixedWindowGiveBackScript.Run(ctx, w.rdb, []string{w.opts.Keys.FixedWindow(set.Scope)}, args...).Err()
	case AlgSlidingWindow:
		args := []any{clock, unspent}
		for i, sfx := range nameSuffixes(set.Windows) {
			args = append(args, sfx, set.Windows[i].Period.Microseconds(), t.starts[i])
		}
		err = slidingCounterGiveBackScript.Run(ctx, w.rdb, []string{w.opts.Keys.SlidingCounter(set.Scope)}, args...).Err()
	case AlgSlidingLog:
		err = slidingLogGiveBackScript.Run(ctx, w.rdb, w.logKeys(set), clock, t.id, t.cost, spent, t.at).Err()
	case AlgTokenBucket:
		if t.res == nil {
			return nil
		}
		return w.tb.reconcile(ctx, t.res, Cost{Requests: spent}, false)
	}
	if err != nil {
		return fmt.Errorf("limiter: give back on scope %q: %w", set.Scope, err)
	}
	return nil
}

// logKeys are the sliding logs and totals of set's windows, in order.
func (w *Windows) logKeys(set WindowSet) []string {
	keys := make([]string, 0, 2*len(set.Windows))
	for _, nw := range set.Windows {
		keys = append(keys, w.opts.Keys.SlidingLogWindow(set.Scope, nw.Name), w.opts.Keys.SlidingLogWindowTotal(set.Scope, nw.Name))
	}
	return keys
}

// nameSuffixes are the hash field suffixes of named windows.
func nameSuffixes(ws []NamedWindow) []string {
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = ":" + w.Name
	}
	return s
}

// bucketScope is set as a token-bucket scope: a request bucket per window.
func bucketScope(set WindowSet) Scope {
	s := Scope{Name: set.Scope, Buckets: make([]Bucket, len(set.Windows))}
	for i, w := range set.Windows {
		s.Buckets[i] = Bucket{Name: w.Name, Unit: UnitRequests, Limit: w.Limit, Period: w.Period}
	}
	return s
}

// Tightest returns the index in r.Buckets of the bucket (or window) that
// Limit and Remaining describe: the one that makes the caller wait longest
// (the one that frees last, when denied), or else the one with the smallest
// fraction left; -1 when r has no buckets.
func (r *Result) Tightest() int {
	tight := -1
	for i, b := range r.Buckets {
		if tight < 0 {
			tight = i
			continue
		}
		t := r.Buckets[tight]
		if b.RetryAfter > t.RetryAfter ||
			(b.RetryAfter == t.RetryAfter && float64(b.Remaining)/float64(b.Limit) < float64(t.Remaining)/float64(t.Limit)) {
			tight = i
		}
	}
	return tight
}
