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
func NewFixedWindow(rdb redis.Scripter, opts Options) (*FixedWindow, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &FixedWindow{rdb: rdb, opts: o}, nil
}

// fixedWindowScript counts cost in the current window of every window
// given, or in none when one of them would pass its limit.
//
// KEYS[1] -> the counters' hash (rkeys.FixedWindow): per window of field
// suffix s, w<s> its current window's start in µs and n<s> its count
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> cost
// ARGV[3+3(i-1)], ARGV[4+3(i-1)], ARGV[5+3(i-1)] -> window i: field suffix,
// limit, length in µs
// Returns {allowed (1 or 0), now, then per window: count, µs until the
// window ends, the window's start in µs}.
var fixedWindowScript = redis.NewScript(redisclock.Lua + luaExtend + `
local key, cost = KEYS[1], tonumber(ARGV[2])
local n = (#ARGV - 2) / 3
local fields = {}
for i = 1, n do
  fields[2 * i - 1] = 'w' .. ARGV[3 * i]
  fields[2 * i] = 'n' .. ARGV[3 * i]
end
local v = redis.call('HMGET', key, unpack(fields))
-- A window's expiry need (its end) moves only when it starts anew: only
-- then is the expiry extended.
local allowed, st, fresh = 1, {}, false
for i = 1, n do
  local limit, P = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local start = now - now % P
  local c = 0
  if tonumber(v[2 * i - 1]) == start then c = tonumber(v[2 * i]) or 0 else fresh = true end
  if c + cost > limit then allowed = 0 end
  st[i] = {start, c, start + P - now}
end
local out, args, ttl = {allowed, now}, {}, 0
for i = 1, n do
  local start, c, left = st[i][1], st[i][2], st[i][3]
  if allowed == 1 and cost > 0 then
    c = c + cost
    args[#args + 1] = fields[2 * i - 1]
    args[#args + 1] = string.format('%.17g', start)
    args[#args + 1] = fields[2 * i]
    args[#args + 1] = c
    if left > ttl then ttl = left end
  end
  out[#out + 1] = c
  out[#out + 1] = left
  out[#out + 1] = start
end
if #args > 0 then
  redis.call('HSET', key, unpack(args))
  if fresh then extend(key, math.ceil(ttl / 1000) + 1000) end
end
return out
`)

// fixedWindowGiveBackScript takes back what a lease counted and did not
// spend, from each window it was counted in that has not ended since.
//
// KEYS[1] -> the counters' hash (rkeys.FixedWindow)
// ARGV[1] -> now in µs, or "" for Redis TIME (unused: the window starts say
// which windows are still current)
// ARGV[2] -> the amount to take back
// ARGV[3+2(i-1)], ARGV[4+2(i-1)] -> window i: field suffix, its start in µs
// when counted
// Returns the number of windows taken back from.
var fixedWindowGiveBackScript = redis.NewScript(redisclock.Lua + `
local key, amount = KEYS[1], tonumber(ARGV[2])
local done = 0
for i = 1, (#ARGV - 2) / 2 do
  local s = ARGV[1 + 2 * i]
  local v = redis.call('HMGET', key, 'w' .. s, 'n' .. s)
  if tonumber(v[1]) == tonumber(ARGV[2 + 2 * i]) and v[2] then
    redis.call('HSET', key, 'n' .. s, math.max(tonumber(v[2]) - amount, 0))
    done = done + 1
  end
end
return done
`)

// Allow counts cost against key's limit per window, or denies without
// counting. RetryAfter is the time until the window ends. A cost above
// limit fails at once with ErrCostExceedsCapacity.
func (fw *FixedWindow) Allow(ctx context.Context, key string, limit int64, window time.Duration, cost int64) (*Result, error) {
	if err := checkWindow(key, Window{Limit: limit, Period: window}, cost); err != nil {
		return nil, err
	}
	res, _, err := runFixedWindow(ctx, fw.rdb, fw.opts, fw.opts.Keys.FixedWindow(key), key,
		[]NamedWindow{{Name: window.String(), Window: Window{limit, window}}}, []string{""}, cost)
	return res, err
}

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
