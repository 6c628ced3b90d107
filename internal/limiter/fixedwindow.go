package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// FixedWindow is the fixed window counter: at most limit per window, the
// windows aligned on the epoch (so resets are predictable). It is the
// cheapest limiter and the least exact: a caller can spend a whole window's
// limit just before a boundary and again just after it, twice the limit in
// an instant. Use a sliding limiter or the token bucket where that matters.
type FixedWindow struct {
	rdb  redis.Scripter
	opts Options
}

// NewFixedWindow returns a FixedWindow over rdb. Of opts, it uses Keys and
// Clock.
func NewFixedWindow(rdb redis.Scripter, opts Options) *FixedWindow {
	return &FixedWindow{rdb: rdb, opts: opts.withDefaults()}
}

// fixedWindowScript counts cost in the current window unless it would pass
// the limit: HINCRBY, and PEXPIRE at the window's first hit.
//
// KEYS[1] -> the counter's hash (rkeys.FixedWindow): w window start in µs, n count
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> limit
// ARGV[3] -> window in µs
// ARGV[4] -> cost
// Returns {allowed (1 or 0), now, count, µs until the window ends}.
var fixedWindowScript = redis.NewScript(redisclock.Lua + `
local key = KEYS[1]
local limit, window, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local start = now - now % window
local v = redis.call('HMGET', key, 'w', 'n')
local n = 0
if tonumber(v[1]) == start then n = tonumber(v[2]) or 0 end
local left = start + window - now
if n + cost > limit then return {0, now, n, left} end
if n == 0 then
  -- first hit of this window
  redis.call('HSET', key, 'w', string.format('%.17g', start), 'n', cost)
  redis.call('PEXPIRE', key, math.ceil(left / 1000) + 1000)
elseif cost > 0 then
  redis.call('HINCRBY', key, 'n', cost)
end
return {1, now, n + cost, left}
`)

// Allow counts cost against key's limit per window, or denies without
// counting. RetryAfter is the time until the window ends. A cost above
// limit fails at once with ErrCostExceedsCapacity.
func (fw *FixedWindow) Allow(ctx context.Context, key string, limit int64, window time.Duration, cost int64) (*Result, error) {
	if err := checkWindow(key, Window{Limit: limit, Period: window}, cost); err != nil {
		return nil, err
	}
	args := []any{redisclock.Arg(fw.opts.Clock), limit, window.Microseconds(), cost}
	v, err := fixedWindowScript.Run(ctx, fw.rdb, []string{fw.opts.Keys.FixedWindow(key)}, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("limiter: fixed window %q: %w", key, err)
	}
	a, err := ints(v, 4)
	if err != nil {
		return nil, err
	}
	b := BucketState{Name: window.String(), Unit: UnitRequests, Limit: limit, Remaining: limit - a[2], ResetAfter: us(a[3])}
	if a[0] == 0 {
		b.RetryAfter = us(a[3])
	}
	return windowResult(a[0] == 1, a[1], []BucketState{b}), nil
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
