package limiter

import (
	"context"
	_ "embed" // the scripts' Lua
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// SlidingCounter is the sliding window counter: the count of the current
// window (aligned on the epoch) plus the previous window's count weighted by
// the part of it still inside the sliding window. It keeps three numbers per
// window, and has no boundary burst: just after a boundary, the previous
// window still weighs almost fully. It is an estimate, exact when admissions
// are spread evenly; an adversary who fills the end of one window can get up
// to about twice the limit over a later sliding window (never in an
// instant). Use SlidingLog or the token bucket where a strict bound matters.
type SlidingCounter struct {
	rdb  redis.Scripter
	opts Options
}

// NewSlidingCounter returns a SlidingCounter over rdb. Of opts, it uses Keys
// and Clock.
func NewSlidingCounter(rdb redis.Scripter, opts Options) (*SlidingCounter, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &SlidingCounter{rdb: rdb, opts: o}, nil
}

// Allow counts cost against key's limit per sliding window, or denies
// without counting. RetryAfter is exact, given no other admissions. A cost
// above limit fails at once with ErrCostExceedsCapacity.
func (sc *SlidingCounter) Allow(ctx context.Context, key string, limit int64, window time.Duration, cost int64) (*Result, error) {
	if err := checkWindow(key, Window{Limit: limit, Period: window}, cost); err != nil {
		return nil, err
	}
	nws, sfx := periodSuffixes([]Window{{limit, window}})
	res, _, err := runSlidingCounter(ctx, sc.rdb, sc.opts, sc.opts.Keys.SlidingCounter(key), key, nws, sfx, cost)
	return res, err
}

// MultiWindow is several sliding window counters over one key (e.g. per
// second, per minute and per day) checked and counted atomically together:
// a cost is counted in every window or in none, so a denial by one window
// never uses up the others, as a loop over separate limiters would.
type MultiWindow struct {
	rdb  redis.Scripter
	opts Options
}

// NewMultiWindow returns a MultiWindow over rdb. Of opts, it uses Keys and
// Clock.
func NewMultiWindow(rdb redis.Scripter, opts Options) (*MultiWindow, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &MultiWindow{rdb: rdb, opts: o}, nil
}

// Allow counts cost in every window of key, or in none. Result.Buckets has
// one entry per window, in order. Windows must have distinct periods. A cost
// above a window's limit fails at once with ErrCostExceedsCapacity.
func (mw *MultiWindow) Allow(ctx context.Context, key string, windows []Window, cost int64) (*Result, error) {
	if len(windows) == 0 {
		return nil, fmt.Errorf("limiter: multi-window %q: no windows", key)
	}
	for i, w := range windows {
		if err := checkWindow(key, w, cost); err != nil {
			return nil, err
		}
		for _, o := range windows[:i] {
			if o.Period == w.Period {
				return nil, fmt.Errorf("limiter: multi-window %q: period %v appears twice", key, w.Period)
			}
		}
	}
	nws, sfx := periodSuffixes(windows)
	res, _, err := runSlidingCounter(ctx, mw.rdb, mw.opts, mw.opts.Keys.MultiWindow(key), key, nws, sfx, cost)
	return res, err
}

// slidingCounterScript checks cost against every window and counts it in
// all of them, or in none (sliding_counter.lua).
//
//go:embed sliding_counter.lua
var slidingCounterLua string
var slidingCounterScript = redis.NewScript(redisclock.Lua + windowExtendLua + slidingCounterLua)

// slidingCounterGiveBackScript takes back what a lease counted and did not
// spend: from the window it was counted in while that is current, or from
// the previous-window count once it has become that
// (sliding_counter_give_back.lua).
//
//go:embed sliding_counter_give_back.lua
var slidingCounterGiveBackLua string
var slidingCounterGiveBackScript = redis.NewScript(redisclock.Lua + slidingCounterGiveBackLua)

// periodSuffixes are the field suffixes of SlidingCounter and MultiWindow:
// each window's period in µs.
func periodSuffixes(windows []Window) ([]NamedWindow, []string) {
	nws := make([]NamedWindow, len(windows))
	sfx := make([]string, len(windows))
	for i, w := range windows {
		nws[i] = NamedWindow{Name: w.Period.String(), Window: w}
		sfx[i] = ":" + strconv.FormatInt(w.Period.Microseconds(), 10)
	}
	return nws, sfx
}

// runSlidingCounter runs slidingCounterScript on windows (field suffixes
// suffixes) and returns the decision and each window's start.
func runSlidingCounter(ctx context.Context, rdb redis.Scripter, opts Options, rkey, key string,
	windows []NamedWindow, suffixes []string, cost int64) (*Result, []int64, error) {
	args := make([]any, 0, 2+3*len(windows))
	args = append(args, redisclock.Arg(opts.Clock), cost)
	for i, w := range windows {
		args = append(args, suffixes[i], w.Limit, w.Period.Microseconds())
	}
	v, err := slidingCounterScript.Run(ctx, rdb, []string{rkey}, args...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("limiter: sliding counter %q: %w", key, err)
	}
	a, err := ints(v, 2+4*len(windows))
	if err != nil {
		return nil, nil, err
	}
	bs := make([]BucketState, len(windows))
	starts := make([]int64, len(windows))
	for i, w := range windows {
		x := a[2+4*i:]
		bs[i] = BucketState{Name: w.Name, Unit: UnitRequests, Limit: w.Limit,
			Remaining: x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2])}
		starts[i] = x[3]
	}
	return windowResult(a[0] == 1, a[1], bs), starts, nil
}
