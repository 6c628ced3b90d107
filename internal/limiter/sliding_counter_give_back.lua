-- Takes back what a lease counted and did not spend: from the window it
-- was counted in while that is current, or from the previous-window count
-- once it has become that.
-- KEYS[1] -> the hash (rkeys.SlidingCounter), as in sliding_counter.lua
-- ARGV[1] -> now in µs, or "" for Redis TIME (unused: the window starts say
--   where the count went)
-- ARGV[2] -> the amount to take back
-- ARGV[3+3(i-1)], ARGV[4+3(i-1)], ARGV[5+3(i-1)] -> window i: field suffix,
--   period in µs, its window's start in µs when counted
-- Returns the number of windows taken back from.
local key, amount = KEYS[1], tonumber(ARGV[2])

local done = 0
for i = 1, (#ARGV - 2) / 3 do
  local suffix, period, counted_start = ARGV[3 * i], tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local stored = redis.call('HMGET', key, 'w' .. suffix, 'c' .. suffix, 'p' .. suffix)
  local start = tonumber(stored[1])
  -- the field that holds the count now, and what it holds
  local field, count = nil, nil
  if start == counted_start then
    field, count = 'c' .. suffix, tonumber(stored[2])
  elseif start == counted_start + period then
    field, count = 'p' .. suffix, tonumber(stored[3])
  end
  if field and count then
    redis.call('HSET', key, field, math.max(count - amount, 0))
    done = done + 1
  end
end
return done
