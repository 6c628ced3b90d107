package limiter

import (
	"context"
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
// all of them, or in none.
//
// KEYS[1] -> the hash (rkeys.SlidingCounter or rkeys.MultiWindow); per
// window of field suffix s: w<s> its current window's start in µs, c<s>
// that window's count, p<s> the previous window's count
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> cost
// ARGV[3+3(i-1)], ARGV[4+3(i-1)], ARGV[5+3(i-1)] -> window i: field suffix,
// limit, period in µs
// Returns {allowed (1 or 0), now, then per window: remaining, retry µs,
// reset µs, its current window's start in µs}.
var slidingCounterScript = redis.NewScript(redisclock.Lua + luaExtend + `
local key = KEYS[1]
local cost = tonumber(ARGV[2])
local n = (#ARGV - 2) / 3
local fields = {}
for i = 1, n do
  local s = ARGV[3 * i]
  fields[3 * i - 2] = 'w' .. s
  fields[3 * i - 1] = 'c' .. s
  fields[3 * i] = 'p' .. s
end
local v = redis.call('HMGET', key, unpack(fields))

local allowed = 1
local st = {}
-- A window's expiry need (its start + 2P) moves only when it starts anew:
-- only then is the expiry extended.
local fresh = false
for i = 1, n do
  local limit, P = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local start = now - now % P
  local w, c, p = tonumber(v[3 * i - 2]), tonumber(v[3 * i - 1]) or 0, tonumber(v[3 * i]) or 0
  if not w or start > w then fresh = true end
  if not w then
    c, p = 0, 0
  elseif start > w then
    -- a later window: the current count becomes the previous one, or is
    -- too old to weigh at all
    if start - w == P then p = c else p = 0 end
    c = 0
  else
    start = w
  end
  local x = math.max(now - start, 0)
  local est = p * (P - x) / P + c
  local retry = 0
  if est + cost - limit > limit * 1e-12 then
    allowed = 0
    local room = limit - cost - c
    if room >= 0 then
      -- the previous window's weight must fall to room (p > 0 here)
      retry = math.ceil(P * (p - room) / p - x)
    else
      -- only in the next window, once this window's weight falls enough
      retry = (P - x) + math.ceil(P * (c - limit + cost) / c)
    end
  end
  st[i] = {limit, P, start, c, p, x, est, retry}
end

local out = {allowed, now}
local args, ttl = {}, 0
for i = 1, n do
  local limit, P, start, c, p, x, est, retry = unpack(st[i])
  if allowed == 1 then
    c, est = c + cost, est + cost
    args[#args + 1] = fields[3 * i - 2]
    args[#args + 1] = string.format('%.17g', start)
    args[#args + 1] = fields[3 * i - 1]
    args[#args + 1] = c
    args[#args + 1] = fields[3 * i]
    args[#args + 1] = p
  end
  local reset = 0
  if c > 0 then reset = start + 2 * P - now elseif p > 0 then reset = start + P - now end
  if reset > ttl then ttl = reset end
  out[#out + 1] = math.floor(limit - est)
  out[#out + 1] = retry
  out[#out + 1] = reset
  out[#out + 1] = start
end
if allowed == 1 and cost > 0 then
  redis.call('HSET', key, unpack(args))
  if fresh then extend(key, math.ceil(ttl / 1000) + 1000) end
end
return out
`)

// slidingCounterGiveBackScript takes back what a lease counted and did not
// spend: from the window it was counted in while that is current, or from
// the previous-window count once it has become that.
//
// KEYS[1] -> the hash (rkeys.SlidingCounter)
// ARGV[1] -> now in µs, or "" for Redis TIME (unused: the window starts say
// where the count went)
// ARGV[2] -> the amount to take back
// ARGV[3+3(i-1)], ARGV[4+3(i-1)], ARGV[5+3(i-1)] -> window i: field suffix,
// period in µs, its window's start in µs when counted
// Returns the number of windows taken back from.
var slidingCounterGiveBackScript = redis.NewScript(redisclock.Lua + `
local key, amount = KEYS[1], tonumber(ARGV[2])
local done = 0
for i = 1, (#ARGV - 2) / 3 do
  local s, P, start = ARGV[3 * i], tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local v = redis.call('HMGET', key, 'w' .. s, 'c' .. s, 'p' .. s)
  local w = tonumber(v[1])
  local f, n = nil, nil
  if w == start then f, n = 'c' .. s, tonumber(v[2]) elseif w == start + P then f, n = 'p' .. s, tonumber(v[3]) end
  if f and n then
    redis.call('HSET', key, f, math.max(n - amount, 0))
    done = done + 1
  end
end
return done
`)

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
