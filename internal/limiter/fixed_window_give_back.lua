-- Takes back what a lease counted and did not spend, from each window it
-- was counted in that has not ended since.
-- KEYS[1] -> the counters' hash (rkeys.FixedWindow), as in fixed_window.lua
-- ARGV[1] -> now in µs, or "" for Redis TIME (unused: the window starts say
--   which windows are still current)
-- ARGV[2] -> the amount to take back
-- ARGV[3+2(i-1)], ARGV[4+2(i-1)] -> window i: field suffix, its start in µs
--   when counted
-- Returns the number of windows taken back from.
local key, amount = KEYS[1], tonumber(ARGV[2])

local done = 0
for i = 1, (#ARGV - 2) / 2 do
  local suffix, counted_start = ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i])
  local stored = redis.call('HMGET', key, 'w' .. suffix, 'n' .. suffix)
  local start, count = tonumber(stored[1]), stored[2]
  if start == counted_start and count then
    redis.call('HSET', key, 'n' .. suffix, math.max(tonumber(count) - amount, 0))
    done = done + 1
  end
end
return done
