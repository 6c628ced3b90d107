-- Counts cost in the current window of every window given, or in none when
-- one of them would pass its limit. Windows are aligned on the epoch.
-- KEYS[1] -> the counters' hash (rkeys.FixedWindow): per window of field
--   suffix s, w<s> its current window's start in µs and n<s> its count
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2] -> cost
-- ARGV[3+3(i-1)], ARGV[4+3(i-1)], ARGV[5+3(i-1)] -> window i: field suffix,
--   limit, length in µs
-- Returns {allowed (1 or 0), now, then per window: count, µs until the
-- window ends, the window's start in µs}.
local key, cost = KEYS[1], tonumber(ARGV[2])
local window_count = (#ARGV - 2) / 3

-- the hash's fields, start then count per window
local fields = {}
for i = 1, window_count do
  local suffix = ARGV[3 * i]
  fields[2 * i - 1] = 'w' .. suffix
  fields[2 * i] = 'n' .. suffix
end
local stored = redis.call('HMGET', key, unpack(fields))

-- A window's expiry need (its end) moves only when it starts anew: only
-- then is the expiry extended.
local allowed, windows, started = 1, {}, false
for i = 1, window_count do
  local limit, length = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local start = now - now % length
  local count = 0
  -- a count stored for an earlier window is over
  if tonumber(stored[2 * i - 1]) == start then count = tonumber(stored[2 * i]) or 0 else started = true end
  if count + cost > limit then allowed = 0 end
  windows[i] = {start = start, count = count, left = start + length - now}
end

local out, changes, ttl = {allowed, now}, {}, 0
for i = 1, window_count do
  local w = windows[i]
  local count = w.count
  if allowed == 1 and cost > 0 then
    count = count + cost
    changes[#changes + 1] = fields[2 * i - 1]
    -- %.17g: the µs exact, where Redis would keep 14 digits
    changes[#changes + 1] = string.format('%.17g', w.start)
    changes[#changes + 1] = fields[2 * i]
    changes[#changes + 1] = count
    if w.left > ttl then ttl = w.left end
  end
  out[#out + 1] = count
  out[#out + 1] = w.left
  out[#out + 1] = w.start
end
if #changes > 0 then
  redis.call('HSET', key, unpack(changes))
  if started then extend(key, math.ceil(ttl / 1000) + 1000) end
end
return out
