-- The functions every budget script that touches a day shares, before its
-- own Lua (and before day.lua).
--
-- Lua numbers are doubles: every amount and time stays an integer below
-- 2^53. Numbers handed back to Redis go through int_str, because Redis
-- would format them with only 14 significant digits.
local function int_str(n) return string.format("%d", n) end

-- drop takes reservation m out of a day (its hash and its set of
-- reservations), if it is still there.
local function drop(day, reservations, m)
  local amount = redis.call("HGET", day, "r:" .. m)
  if amount then
    redis.call("HDEL", day, "r:" .. m)
    redis.call("HINCRBY", day, "reserved", int_str(-tonumber(amount)))
  end
  redis.call("ZREM", reservations, m)
end
