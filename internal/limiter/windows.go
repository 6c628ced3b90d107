package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// Algorithm is how a WindowSet counts.
type Algorithm string

// The algorithms of Windows.
const (
	// AlgSlidingWindow is the sliding window counter: no burst at window
	// edges, three numbers per window, an estimate.
	AlgSlidingWindow Algorithm = "sliding_window"
	// AlgFixedWindow is the cheapest, and lets twice the limit through
	// across a window boundary.
	AlgFixedWindow Algorithm = "fixed_window"
	// AlgSlidingLog is exact, one entry per admission for a whole window.
	AlgSlidingLog Algorithm = "sliding_log"
	// AlgTokenBucket makes each window a token bucket of Limit: bursts of up
	// to Limit after a quiet spell, then the steady rate.
	AlgTokenBucket Algorithm = "token_bucket"
)

// Algorithms lists every Algorithm, the default first.
var Algorithms = []Algorithm{AlgSlidingWindow, AlgFixedWindow, AlgSlidingLog, AlgTokenBucket}

// NamedWindow is one window of a WindowSet; its state in the scope is kept
// by Name ("minute", "files.create:minute").
type NamedWindow struct {
	Name string
	Window
}

// WindowSet is what one Windows.Allow checks and counts: every window, or
// none. Sets of one Scope ("api:key_…", the hash tag of their keys) may name
// different windows.
type WindowSet struct {
	Algorithm Algorithm
	Scope     string
	Windows   []NamedWindow
}

// Window is one window of a window limiter: at most Limit per Period.
type Window struct {
	Limit  int64
	Period time.Duration
}

func (s WindowSet) validate(cost int64) error {
	switch {
	case s.Scope == "":
		return errors.New("limiter: WindowSet.Scope is empty")
	case !slices.Contains(Algorithms, s.Algorithm):
		return fmt.Errorf("limiter: scope %q: unknown Algorithm %q", s.Scope, s.Algorithm)
	case len(s.Windows) == 0:
		return fmt.Errorf("limiter: scope %q: no windows", s.Scope)
	}
	for _, w := range s.Windows {
		if w.Name == "" || strings.ContainsAny(w.Name, "{} \t\n") {
			return fmt.Errorf("limiter: scope %q: window name %q must be non-empty, without braces or spaces", s.Scope, w.Name)
		}
	}
	// The rest is checked as a token bucket's: each window is one of its buckets.
	return bucketScope(s).validate(Cost{Requests: cost})
}

// Windows checks WindowSets with any Algorithm, one script run per Allow.
// Limits are passed on every call, so a policy change applies to the next
// one; a set's state is kept per algorithm, so changing a scope's algorithm
// starts it afresh.
type Windows struct {
	rdb  redis.Scripter
	opts Options
	tb   *TokenBucket // plain permits: nothing held in flight
}

// NewWindows returns Windows over rdb. Of opts, it uses Keys and Clock.
func NewWindows(rdb scripts.Client, opts Options) (*Windows, error) {
	opts.HoldInFlight = false
	tb, err := NewTokenBucket(rdb, opts)
	return &Windows{rdb: rdb, opts: tb.opts, tb: tb}, err
}

// Allow counts cost in every window of set, or in none. A cost above a
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

// windowScripts are a window algorithm's scripts, and how to read one
// window's part (stride integers) of the take's reply: its state, and its
// start for the give-back of a counter.
type windowScripts struct {
	take, giveBack *redis.Script
	stride         int
	read           func(w Window, x []int64, denied bool, cost int64) (BucketState, int64)
}

// windowAlgorithms are the scripts of each Algorithm but AlgTokenBucket.
// The counters' takes begin with window_extend.lua, which sets a key's
// expiry unless it already lives longer: a call knows only its own
// windows' needs, and must never shorten the expiry another call's
// windows need.
var windowAlgorithms = map[Algorithm]windowScripts{
	AlgFixedWindow: {
		redis.NewScript(redisclock.Lua + lua("window_extend.lua") + lua("fixed_window.lua")),
		redis.NewScript(redisclock.Lua + lua("fixed_window_give_back.lua")),
		3, func(w Window, x []int64, denied bool, cost int64) (BucketState, int64) {
			n, left := x[0], us(x[1])
			b := BucketState{Remaining: w.Limit - n}
			if n > 0 {
				b.ResetAfter = left
			}
			if denied && n+cost > w.Limit {
				b.RetryAfter = left
			}
			return b, x[2]
		},
	},
	AlgSlidingWindow: {
		// The give-back takes from the window counted in while it is
		// current, or from the previous-window count once it is that.
		redis.NewScript(redisclock.Lua + lua("window_extend.lua") + lua("sliding_counter.lua")),
		redis.NewScript(redisclock.Lua + lua("sliding_counter_give_back.lua")),
		4, func(_ Window, x []int64, _ bool, _ int64) (BucketState, int64) {
			return BucketState{Remaining: x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2])}, x[3]
		},
	},
	AlgSlidingLog: {
		// The give-back replaces a lease's entry by one of what was spent.
		redis.NewScript(redisclock.Lua + lua("sliding_log.lua")),
		redis.NewScript(redisclock.Lua + lua("sliding_log_give_back.lua")),
		3, func(w Window, x []int64, _ bool, _ int64) (BucketState, int64) {
			return BucketState{Remaining: w.Limit - x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2])}, 0
		},
	},
}

// take runs one check of set; prefetch marks a take whose unspent part will
// be given back (never the probe).
func (w *Windows) take(ctx context.Context, set WindowSet, cost int64, prefetch bool) (*Result, *taken, error) {
	if err := set.validate(cost); err != nil {
		return nil, nil, err
	}
	t := &taken{set: set, cost: cost}
	if set.Algorithm == AlgTokenBucket {
		mode := modeReserve
		if prefetch {
			mode = modeReservePrefetch
		}
		res, err := w.tb.reserve(ctx, mode, bucketScope(set), Cost{Requests: cost})
		if err != nil {
			return nil, nil, err
		}
		t.res, res.Reservation = res.Reservation, nil
		return res, t, nil
	}
	alg := windowAlgorithms[set.Algorithm]
	args := []any{redisclock.Arg(w.opts.Clock), cost}
	if set.Algorithm == AlgSlidingLog {
		t.id = newID()
		args = append(args, t.id)
	}
	for _, nw := range set.Windows {
		if set.Algorithm != AlgSlidingLog {
			args = append(args, ":"+nw.Name)
		}
		args = append(args, nw.Limit, nw.Period.Microseconds())
	}
	a, err := ints(alg.take.Run(ctx, w.rdb, w.keys(set), args...), 2+alg.stride*len(set.Windows))
	if err != nil {
		return nil, nil, fmt.Errorf("limiter: %s %q: %w", set.Algorithm, set.Scope, err)
	}
	res := &Result{Allowed: a[0] == 1, Buckets: make([]BucketState, len(set.Windows)), Time: time.UnixMicro(a[1])}
	t.starts, t.at = make([]int64, len(set.Windows)), a[1]
	for i, nw := range set.Windows {
		b, start := alg.read(nw.Window, a[2+alg.stride*i:], !res.Allowed, cost)
		b.Name, b.Unit, b.Limit = nw.Name, UnitRequests, nw.Limit
		res.Buckets[i], t.starts[i] = b, start
		if !res.Allowed {
			res.RetryAfter = max(res.RetryAfter, b.RetryAfter)
		}
	}
	res.fill()
	return res, t, nil
}

// giveBack takes back, from every window t was counted in and still
// counts, the part of t's cost that was not spent.
func (w *Windows) giveBack(ctx context.Context, t *taken, spent int64) error {
	set, unspent := t.set, t.cost-spent
	switch {
	case unspent <= 0:
		return nil
	case set.Algorithm == AlgTokenBucket:
		return w.tb.reconcile(ctx, t.res, Cost{Requests: spent}, false)
	}
	args := []any{redisclock.Arg(w.opts.Clock)}
	if set.Algorithm == AlgSlidingLog {
		args = append(args, t.id, t.cost, spent, t.at)
	} else {
		args = append(args, unspent)
		for i, nw := range set.Windows {
			args = append(args, ":"+nw.Name)
			if set.Algorithm == AlgSlidingWindow {
				args = append(args, nw.Period.Microseconds())
			}
			args = append(args, t.starts[i])
		}
	}
	if err := windowAlgorithms[set.Algorithm].giveBack.Run(ctx, w.rdb, w.keys(set), args...).Err(); err != nil {
		return fmt.Errorf("limiter: give back on scope %q: %w", set.Scope, err)
	}
	return nil
}

func (w *Windows) keys(set WindowSet) []string {
	switch set.Algorithm {
	case AlgFixedWindow:
		return []string{w.opts.Keys.FixedWindow(set.Scope)}
	case AlgSlidingWindow:
		return []string{w.opts.Keys.SlidingCounter(set.Scope)}
	}
	keys := make([]string, 0, 2*len(set.Windows))
	for _, nw := range set.Windows {
		keys = append(keys, w.opts.Keys.SlidingLogWindow(set.Scope, nw.Name), w.opts.Keys.SlidingLogWindowTotal(set.Scope, nw.Name))
	}
	return keys
}

func bucketScope(set WindowSet) Scope {
	s := Scope{Name: set.Scope, Buckets: make([]Bucket, len(set.Windows))}
	for i, w := range set.Windows {
		s.Buckets[i] = Bucket{Name: w.Name, Unit: UnitRequests, Limit: w.Limit, Period: w.Period}
	}
	return s
}

// Tightest returns the index in r.Buckets of the bucket that Limit and
// Remaining describe: the one that makes the caller wait longest, or else
// the one with the smallest fraction left; -1 when r has no buckets.
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
