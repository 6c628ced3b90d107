-- Checks cost against every sliding window counter given and counts it in
-- all of them, or in none. A window's estimate is its current count plus
-- the previous window's count weighted by the part of that window still
-- inside the sliding window.
-- KEYS[1] -> the hash (rkeys.SlidingCounter or rkeys.MultiWindow); per
--   window of field suffix s: w<s> its current window's start in µs, c<s>
--   that window's count, p<s> the previous window's count
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2] -> cost
-- ARGV[3+3(i-1)], ARGV[4+3(i-1)], ARGV[5+3(i-1)] -> window i: field suffix,
--   limit, period in µs
-- Returns {allowed (1 or 0), now, then per window: remaining, retry µs,
-- reset µs, its current window's start in µs}.
local key = KEYS[1]
local cost = tonumber(ARGV[2])
local window_count = (#ARGV - 2) / 3

-- the hash's fields: start, count and previous count per window
local fields = {}
for i = 1, window_count do
  local suffix = ARGV[3 * i]
  fields[3 * i - 2] = 'w' .. suffix
  fields[3 * i - 1] = 'c' .. suffix
  fields[3 * i] = 'p' .. suffix
end
local stored = redis.call('HMGET', key, unpack(fields))

local allowed = 1
local windows = {}
-- A window's expiry need (its start + 2 periods) moves only when it starts
-- anew: only then is the expiry extended.
local started = false
for i = 1, window_count do
  local limit, period = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local start = now - now % period
  local stored_start = tonumber(stored[3 * i - 2])
  local count, previous = tonumber(stored[3 * i - 1]) or 0, tonumber(stored[3 * i]) or 0
  if not stored_start or start > stored_start then started = true end
  if not stored_start then
    count, previous = 0, 0
  elseif start > stored_start then
    -- a later window: the current count becomes the previous one, or is
    -- too old to weigh at all
    if start - stored_start == period then previous = count else previous = 0 end
    count = 0
  else
    start = stored_start
  end
  local elapsed = math.max(now - start, 0)
  local estimate = previous * (period - elapsed) / period + count
  local retry = 0
  -- a trillionth of the limit absorbs float rounding
  if estimate + cost - limit > limit * 1e-12 then
    allowed = 0
    local room = limit - cost - count
    if room >= 0 then
      -- the previous window's weight must fall to room (previous > 0 here)
      retry = math.ceil(period * (previous - room) / previous - elapsed)
    else
      -- only in the next window, once this window's weight falls enough
      retry = (period - elapsed) + math.ceil(period * (count - limit + cost) / count)
    end
  end
  windows[i] = {limit = limit, period = period, start = start, count = count, previous = previous,
    estimate = estimate, retry = retry}
end

local out = {allowed, now}
local changes, ttl = {}, 0
for i = 1, window_count do
  local w = windows[i]
  local count, estimate = w.count, w.estimate
  if allowed == 1 then
    count, estimate = count + cost, estimate + cost
    changes[#changes + 1] = fields[3 * i - 2]
    -- %.17g: the µs exact, where Redis would keep 14 digits
    changes[#changes + 1] = string.format('%.17g', w.start)
    changes[#changes + 1] = fields[3 * i - 1]
    changes[#changes + 1] = count
    changes[#changes + 1] = fields[3 * i]
    changes[#changes + 1] = w.previous
  end
  -- the window resets once neither its count nor the previous one weighs
  local reset = 0
  if count > 0 then
    reset = w.start + 2 * w.period - now
  elseif w.previous > 0 then
    reset = w.start + w.period - now
  end
  if reset > ttl then ttl = reset end
  out[#out + 1] = math.floor(w.limit - estimate)
  out[#out + 1] = w.retry
  out[#out + 1] = reset
  out[#out + 1] = w.start
end
if allowed == 1 and cost > 0 then
  redis.call('HSET', key, unpack(changes))
  if started then extend(key, math.ceil(ttl / 1000) + 1000) end
end
return out
