-- Holds an amount for one reservation id against the tenant's day and the
-- global day together, all or nothing. It runs after the clock and day
-- preludes (day.lua).
-- KEYS and ARGV[1..7] -> as in day.lua
-- ARGV[8] -> reservation id; ARGV[9] -> its global member (<tenant>:<id>)
-- ARGV[10] -> amount (µ$); ARGV[11] -> tenant budget, -1 = unlimited
-- ARGV[12] -> global cap, 0 = none; ARGV[13] -> soft-limit threshold, 0 = none
-- ARGV[14] -> reservation TTL in µs
-- Returns {"wrongday", now} or {"rebuild", tenant token, global token} as
-- day.lua does, else {"ok", allowed, tenant denied, global denied, now,
-- spent, reserved, amount held, soft crossed, global spent, global
-- reserved}, all after the call.
local tenant_day, tenant_reservations = KEYS[1], KEYS[2]
local global_day, global_reservations = KEYS[3], KEYS[4]
local id, member, amount = ARGV[8], ARGV[9], tonumber(ARGV[10])
local budget, global_cap, soft_threshold = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local expires = int_str(now + tonumber(ARGV[14]))

local tenant = redis.call("HMGET", tenant_day, "spent", "reserved", "r:" .. id)
local global = redis.call("HMGET", global_day, "spent", "reserved")
local spent, reserved, held = tonumber(tenant[1]), tonumber(tenant[2]), tenant[3]
local global_spent, global_reserved = tonumber(global[1]), tonumber(global[2])
local allowed, tenant_denied, global_denied, soft_crossed = 1, 0, 0, 0
if held then
  -- The same id again (a redelivered job): hold what it holds, a while longer.
  amount = tonumber(held)
  redis.call("ZADD", tenant_reservations, "XX", expires, id)
  redis.call("ZADD", global_reservations, "XX", expires, member)
else
  if budget >= 0 and spent + reserved + amount > budget then tenant_denied = 1 end
  if global_cap > 0 and global_spent + global_reserved + amount > global_cap then global_denied = 1 end
  if tenant_denied == 1 or global_denied == 1 then
    allowed = 0
  else
    -- the amount goes to Redis as the caller wrote it, exact
    redis.call("ZADD", tenant_reservations, expires, id)
    redis.call("PEXPIRE", tenant_reservations, tenant_ttl_ms)
    redis.call("HSET", tenant_day, "r:" .. id, ARGV[10])
    redis.call("HINCRBY", tenant_day, "reserved", ARGV[10])
    redis.call("ZADD", global_reservations, expires, member)
    redis.call("PEXPIRE", global_reservations, global_ttl_ms)
    redis.call("HSET", global_day, "r:" .. member, ARGV[10])
    redis.call("HINCRBY", global_day, "reserved", ARGV[10])
    reserved, global_reserved = reserved + amount, global_reserved + amount
    -- the first reservation past the soft limit says so, once a day
    if soft_threshold > 0 and spent + reserved >= soft_threshold then
      soft_crossed = redis.call("HSETNX", tenant_day, "soft", "1")
    end
  end
end
return {"ok", allowed, tenant_denied, global_denied, int_str(now), int_str(spent), int_str(reserved),
  int_str(amount), soft_crossed, int_str(global_spent), int_str(global_reserved)}
