-- Drops, from the log of every window given, the entries older than that
-- window (and their costs from its total), and adds one for cost to every
-- log when each leaves room, or to none.
-- KEYS[2i-1] -> window i's log (rkeys.SlidingLog or rkeys.SlidingLogWindow):
--   members "<id>:<cost>" scored by time in µs
-- KEYS[2i] -> the sum of the costs in that log (rkeys.SlidingLogTotal or
--   rkeys.SlidingLogWindowTotal)
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2] -> cost
-- ARGV[3] -> entry id
-- ARGV[4+2(i-1)], ARGV[5+2(i-1)] -> window i: limit, length in µs
-- Returns {allowed (1 or 0), now, then per window: total in the window,
-- retry µs, reset µs}.
local cost, id = tonumber(ARGV[2]), ARGV[3]
local window_count = #KEYS / 2

-- an entry's cost, from its member "<id>:<cost>"
local function cost_of(member) return tonumber(string.match(member, ':(%d+)$')) end

local allowed, windows = 1, {}
for i = 1, window_count do
  local log, total_key = KEYS[2 * i - 1], KEYS[2 * i]
  local limit, length = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  -- an entry at t counts while t > now - length
  local cutoff = string.format('%.17g', now - length)
  local total = tonumber(redis.call('GET', total_key))
  local stored = total ~= nil
  local gone = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
    if total then
      for _, member in ipairs(gone) do total = total - cost_of(member) end
    end
  end
  if total and redis.call('ZCARD', log) == 0 then
    -- the log was evicted without its total
    total = 0
  elseif not total then
    -- the total was lost (or never written): counted again from the log
    total = 0
    for _, member in ipairs(redis.call('ZRANGE', log, 0, -1)) do total = total + cost_of(member) end
  end
  if total + cost > limit then allowed = 0 end
  windows[i] = {log = log, total_key = total_key, limit = limit, length = length, total = total,
    dropped = stored and #gone > 0}
end

local out = {allowed, now}
for i = 1, window_count do
  local w = windows[i]
  local log, total_key, limit, length, total = w.log, w.total_key, w.limit, w.length, w.total
  if allowed == 1 and cost > 0 then
    total = total + cost
    redis.call('ZADD', log, string.format('%.17g', now), id .. ':' .. cost)
    local ttl_ms = math.ceil(length / 1000) + 1000
    redis.call('SET', total_key, total, 'PX', ttl_ms)
    redis.call('PEXPIRE', log, ttl_ms)
  elseif w.dropped then
    -- The stored total loses the dropped costs whatever the decision, and
    -- keeps the log's expiry (a missing one is counted again from the log
    -- next time).
    if total > 0 then
      redis.call('SET', total_key, total, 'KEEPTTL')
    else
      redis.call('DEL', total_key)
    end
  end
  local retry, reset = 0, 0
  if total > 0 then
    -- the window is empty once its newest entry leaves it
    local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    reset = tonumber(newest[2]) + length - now
  end
  if allowed == 0 and total + cost > limit then
    -- wait until enough of the oldest entries leave the window
    local entries = redis.call('ZRANGE', log, 0, -1, 'WITHSCORES')
    local freed = 0
    for j = 1, #entries, 2 do
      freed = freed + cost_of(entries[j])
      if total - freed + cost <= limit then
        retry = tonumber(entries[j + 1]) + length - now
        break
      end
    end
  end
  out[#out + 1] = total
  out[#out + 1] = retry
  out[#out + 1] = reset
end
return out
