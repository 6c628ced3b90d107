-- Holds an amount for one reservation against one day, if it fits. It runs
-- after the clock and day preludes (day.lua).
-- KEYS and ARGV[1..5] -> as in day.lua
-- ARGV[6] -> the reservation's member; ARGV[7] -> amount (µ$)
-- ARGV[8] -> the day's limit (µ$), -1 = none
-- ARGV[9] -> the soft-limit threshold (µ$), 0 = none
-- ARGV[10] -> reservation TTL in µs
-- Returns {"wrongday", now} or {"rebuild", token} as day.lua does, else
-- {"ok", allowed, now, spent, reserved, amount held, soft crossed}, all
-- after the call.
local member, amount = ARGV[6], tonumber(ARGV[7])
local limit, soft_threshold = tonumber(ARGV[8]), tonumber(ARGV[9])
local expires = int_str(now + tonumber(ARGV[10]))

local f = redis.call("HMGET", day, "spent", "reserved", "r:" .. member)
local spent, reserved, held = tonumber(f[1]), tonumber(f[2]), f[3]
local allowed, soft_crossed = 1, 0
if held then
  -- The same member again (a redelivered job): hold what it holds, a while longer.
  amount = tonumber(held)
  redis.call("ZADD", reservations, "XX", expires, member)
elseif limit >= 0 and spent + reserved + amount > limit then
  allowed = 0
else
  -- the amount goes to Redis as the caller wrote it, exact
  redis.call("ZADD", reservations, expires, member)
  redis.call("PEXPIRE", reservations, day_ttl_ms)
  redis.call("HSET", day, "r:" .. member, ARGV[7])
  redis.call("HINCRBY", day, "reserved", ARGV[7])
  reserved = reserved + amount
  -- the first reservation past the soft limit says so, once a day
  if soft_threshold > 0 and spent + reserved >= soft_threshold then
    soft_crossed = redis.call("HSETNX", day, "soft", "1")
  end
end
return {"ok", allowed, int_str(now), int_str(spent), int_str(reserved), int_str(amount), soft_crossed}
