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
func NewSlidingLog(rdb redis.Scripter, opts Options) (*SlidingLog, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &SlidingLog{rdb: rdb, opts: o}, nil
}

// slidingLogScript drops, from the log of every window given, the entries
// older than that window (and their costs from its total), and adds one for
// cost to every log when each leaves room, or to none.
//
// KEYS[2i-1] -> window i's log (rkeys.SlidingLog or rkeys.SlidingLogWindow):
// members "<id>:<cost>" scored by time in µs
// KEYS[2i] -> the sum of the costs in that log (rkeys.SlidingLogTotal or
// rkeys.SlidingLogWindowTotal)
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> cost
// ARGV[3] -> entry id
// ARGV[4+2(i-1)], ARGV[5+2(i-1)] -> window i: limit, length in µs
// Returns {allowed (1 or 0), now, then per window: total in the window,
// retry µs, reset µs}.
var slidingLogScript = redis.NewScript(redisclock.Lua + `
local cost, id = tonumber(ARGV[2]), ARGV[3]
local n = #KEYS / 2
local function cost_of(m) return tonumber(string.match(m, ':(%d+)$')) end

local allowed, st = 1, {}
for i = 1, n do
  local log, tkey = KEYS[2 * i - 1], KEYS[2 * i]
  local limit, window = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  -- an entry at t counts while t > now - window
  local cutoff = string.format('%.17g', now - window)
  local total = tonumber(redis.call('GET', tkey))
  local stored = total ~= nil
  local gone = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
    if total then
      for _, m in ipairs(gone) do total = total - cost_of(m) end
    end
  end
  if total and redis.call('ZCARD', log) == 0 then
    -- the log was evicted without its total
    total = 0
  elseif not total then
    total = 0
    for _, m in ipairs(redis.call('ZRANGE', log, 0, -1)) do total = total + cost_of(m) end
  end
  if total + cost > limit then allowed = 0 end
  st[i] = {log, tkey, limit, window, total, stored and #gone > 0}
end

local out = {allowed, now}
for i = 1, n do
  local log, tkey, limit, window, total, dropped = unpack(st[i])
  if allowed == 1 and cost > 0 then
    total = total + cost
    redis.call('ZADD', log, string.format('%.17g', now), id .. ':' .. cost)
    local ttl = math.ceil(window / 1000) + 1000
    redis.call('SET', tkey, total, 'PX', ttl)
    redis.call('PEXPIRE', log, ttl)
  elseif dropped then
    -- The stored total loses the dropped costs whatever the decision, and
    -- keeps the log's expiry (a missing one is counted again from the log
    -- next time).
    if total > 0 then
      redis.call('SET', tkey, total, 'KEEPTTL')
    else
      redis.call('DEL', tkey)
    end
  end
  local retry, reset = 0, 0
  if total > 0 then
    local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    reset = tonumber(last[2]) + window - now
  end
  if allowed == 0 and total + cost > limit then
    -- wait until enough of the oldest entries leave the window
    local e = redis.call('ZRANGE', log, 0, -1, 'WITHSCORES')
    local freed = 0
    for j = 1, #e, 2 do
      freed = freed + cost_of(e[j])
      if total - freed + cost <= limit then
        retry = tonumber(e[j + 1]) + window - now
        break
      end
    end
  end
  out[#out + 1] = total
  out[#out + 1] = retry
  out[#out + 1] = reset
end
return out
`)

// slidingLogGiveBackScript replaces a lease's entry, counted at its whole
// slice, by one of what was spent of it (none when nothing was), in every
// window's log that still holds it.
//
// KEYS[2i-1], KEYS[2i] -> window i's log and total, as in slidingLogScript
// ARGV[1] -> now in µs, or "" for Redis TIME (unused: an entry gone from a
// log has left its window)
// ARGV[2] -> the entry id; ARGV[3] -> its cost; ARGV[4] -> what was spent
// ARGV[5] -> the entry's score
// Returns the number of logs changed.
var slidingLogGiveBackScript = redis.NewScript(redisclock.Lua + `
local id, cost, spent = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local done = 0
for i = 1, #KEYS / 2 do
  local log, tkey = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('ZREM', log, id .. ':' .. cost) == 1 then
    if spent > 0 then redis.call('ZADD', log, ARGV[5], id .. ':' .. spent) end
    local total = tonumber(redis.call('GET', tkey))
    if total then
      total = total - (cost - spent)
      if total > 0 and redis.call('ZCARD', log) > 0 then
        redis.call('SET', tkey, total, 'KEEPTTL')
      else
        redis.call('DEL', tkey)
      end
    end
    done = done + 1
  end
end
return done
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
	return runSlidingLog(ctx, sl.rdb, sl.opts, keys, key, []NamedWindow{{Name: window.String(), Window: Window{limit, window}}}, cost, newID())
}

// runSlidingLog runs slidingLogScript on windows, whose logs and totals are
// keys, for an entry id.
func runSlidingLog(ctx context.Context, rdb redis.Scripter, opts Options, keys []string, key string,
	windows []NamedWindow, cost int64, id string) (*Result, error) {
	args := make([]any, 0, 3+2*len(windows))
	args = append(args, redisclock.Arg(opts.Clock), cost, id)
	for _, w := range windows {
		args = append(args, w.Limit, w.Period.Microseconds())
	}
	v, err := slidingLogScript.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("limiter: sliding log %q: %w", key, err)
	}
	a, err := ints(v, 2+3*len(windows))
	if err != nil {
		return nil, err
	}
	bs := make([]BucketState, len(windows))
	for i, w := range windows {
		x := a[2+3*i:]
		bs[i] = BucketState{Name: w.Name, Unit: UnitRequests, Limit: w.Limit, Remaining: w.Limit - x[0],
			RetryAfter: us(x[1]), ResetAfter: us(x[2])}
	}
	return windowResult(a[0] == 1, a[1], bs), nil
}
