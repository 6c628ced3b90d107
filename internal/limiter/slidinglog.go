package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// SlidingLog is the sliding window log: every admission is an entry of a
// sorted set scored by its time, and a cost is allowed when the entries of
// the last window plus the cost stay within the limit. It is exact (no
// window, wherever it starts, holds more than the limit) and costs memory
// and time in proportion to the admissions of one window: use it for small
// limits.
type SlidingLog struct {
	rdb  redis.Scripter
	opts Options
}

// NewSlidingLog returns a SlidingLog over rdb. Of opts, it uses Keys and
// Clock.
func NewSlidingLog(rdb redis.Scripter, opts Options) *SlidingLog {
	return &SlidingLog{rdb: rdb, opts: opts.withDefaults()}
}

// slidingLogScript drops the entries older than the window (and their costs
// from the total), and adds one for cost when the rest leave room.
//
// KEYS[1] -> the log (rkeys.SlidingLog): members "<id>:<cost>" scored by time in µs
// KEYS[2] -> the sum of the costs in the log (rkeys.SlidingLogTotal)
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> limit
// ARGV[3] -> window in µs
// ARGV[4] -> cost
// ARGV[5] -> entry id
// Returns {allowed (1 or 0), now, total in the window, retry µs, reset µs}.
var slidingLogScript = redis.NewScript(redisclock.Lua + `
local limit, window, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function cost_of(m) return tonumber(string.match(m, ':(%d+)$')) end

-- an entry at t counts while t > now - window
local cutoff = string.format('%.17g', now - window)
local total = tonumber(redis.call('GET', KEYS[2]))
local stored = total ~= nil
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
  if total then
    for _, m in ipairs(gone) do total = total - cost_of(m) end
  end
end
if total and redis.call('ZCARD', KEYS[1]) == 0 then
  -- the log was evicted without its total
  total = 0
elseif not total then
  total = 0
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do total = total + cost_of(m) end
end
-- The stored total loses the dropped costs whatever the decision, and keeps
-- the log's expiry (a missing one is counted again from the log next time).
if #gone > 0 and stored and not (cost > 0 and total + cost <= limit) then
  if total > 0 then
    redis.call('SET', KEYS[2], total, 'KEEPTTL')
  else
    redis.call('DEL', KEYS[2])
  end
end

if total + cost <= limit then
  if cost > 0 then
    total = total + cost
    redis.call('ZADD', KEYS[1], string.format('%.17g', now), ARGV[5] .. ':' .. cost)
    local ttl = math.ceil(window / 1000) + 1000
    redis.call('SET', KEYS[2], total, 'PX', ttl)
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  local reset = 0
  if total > 0 then
    local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    reset = tonumber(last[2]) + window - now
  end
  return {1, now, total, 0, reset}
end

-- denied: wait until enough of the oldest entries leave the window
local e = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local retry, freed = 0, 0
for i = 1, #e, 2 do
  freed = freed + cost_of(e[i])
  if total - freed + cost <= limit then
    retry = tonumber(e[i + 1]) + window - now
    break
  end
end
return {0, now, total, retry, tonumber(e[#e]) + window - now}
`)

// Allow adds cost to key's log when the last window's entries leave room,
// or denies without adding. RetryAfter is exact: the time until enough of
// the oldest entries leave the window. A cost above limit fails at once with
// ErrCostExceedsCapacity.
func (sl *SlidingLog) Allow(ctx context.Context, key string, limit int64, window time.Duration, cost int64) (*Result, error) {
	if err := checkWindow(key, Window{Limit: limit, Period: window}, cost); err != nil {
		return nil, err
	}
	keys := []string{sl.opts.Keys.SlidingLog(key), sl.opts.Keys.SlidingLogTotal(key)}
	args := []any{redisclock.Arg(sl.opts.Clock), limit, window.Microseconds(), cost, newID()}
	v, err := slidingLogScript.Run(ctx, sl.rdb, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("limiter: sliding log %q: %w", key, err)
	}
	a, err := ints(v, 5)
	if err != nil {
		return nil, err
	}
	b := BucketState{Name: window.String(), Unit: UnitRequests, Limit: limit, Remaining: limit - a[2],
		RetryAfter: us(a[3]), ResetAfter: us(a[4])}
	return windowResult(a[0] == 1, a[1], []BucketState{b}), nil
}
