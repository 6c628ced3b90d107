package limiter

import (
	"context"
	_ "embed" // the scripts' Lua
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// fixedWindowScript counts cost in the current window of every window
// given, or in none when one of them would pass its limit
// (fixed_window.lua).
//
//go:embed fixed_window.lua
var fixedWindowLua string
var fixedWindowScript = redis.NewScript(redisclock.Lua + windowExtendLua + fixedWindowLua)

// fixedWindowGiveBackScript takes back what a lease counted and did not
// spend, from each window it was counted in that has not ended since
// (fixed_window_give_back.lua).
//
//go:embed fixed_window_give_back.lua
var fixedWindowGiveBackLua string
var fixedWindowGiveBackScript = redis.NewScript(redisclock.Lua + fixedWindowGiveBackLua)

// runFixedWindow runs fixedWindowScript on windows (field suffixes
// suffixes) and returns the decision and each window's start.
func runFixedWindow(ctx context.Context, rdb redis.Scripter, opts Options, rkey, key string,
	windows []NamedWindow, suffixes []string, cost int64) (*Result, []int64, error) {
	args := make([]any, 0, 2+3*len(windows))
	args = append(args, redisclock.Arg(opts.Clock), cost)
	for i, w := range windows {
		args = append(args, suffixes[i], w.Limit, w.Period.Microseconds())
	}
	v, err := fixedWindowScript.Run(ctx, rdb, []string{rkey}, args...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("limiter: fixed window %q: %w", key, err)
	}
	a, err := ints(v, 2+3*len(windows))
	if err != nil {
		return nil, nil, err
	}
	allowed := a[0] == 1
	bs := make([]BucketState, len(windows))
	starts := make([]int64, len(windows))
	for i, w := range windows {
		n, left := a[2+3*i], us(a[3+3*i])
		starts[i] = a[4+3*i]
		bs[i] = BucketState{Name: w.Name, Unit: UnitRequests, Limit: w.Limit, Remaining: w.Limit - n}
		if n > 0 {
			bs[i].ResetAfter = left
		}
		if !allowed && n+cost > w.Limit {
			bs[i].RetryAfter = left
		}
	}
	return windowResult(allowed, a[1], bs), starts, nil
}

// Window is one window of a window limiter: at most Limit per Period.
type Window struct {
	Limit  int64
	Period time.Duration
}

// checkWindow validates one window limiter call.
func checkWindow(key string, w Window, cost int64) error {
	switch {
	case key == "":
		return errors.New("limiter: window limiter key is empty")
	case w.Limit <= 0:
		return fmt.Errorf("limiter: key %q: window Limit %d must be positive", key, w.Limit)
	case w.Period < time.Microsecond:
		return fmt.Errorf("limiter: key %q: window Period %v must be at least 1µs", key, w.Period)
	case cost < 0:
		return fmt.Errorf("limiter: key %q: negative cost %d", key, cost)
	case cost > w.Limit:
		return fmt.Errorf("%w: key %q window %v: cost %d > limit %d", ErrCostExceedsCapacity, key, w.Period, cost, w.Limit)
	}
	return nil
}

// windowResult builds a window limiter's Result from its windows' states.
func windowResult(allowed bool, now int64, bs []BucketState) *Result {
	r := &Result{Allowed: allowed, Buckets: bs, Time: time.UnixMicro(now)}
	r.fill()
	for _, b := range bs {
		if !allowed && b.RetryAfter > r.RetryAfter {
			r.RetryAfter = b.RetryAfter
		}
	}
	return r
}
