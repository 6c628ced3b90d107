-- Holds an amount for one reservation against one day, if it fits, after
-- the reservations that began waiting for room before it. It runs after
-- the clock and day preludes (day.lua).
-- KEYS[1..2] and ARGV[1..5] -> as in day.lua
-- KEYS[3] -> the day's waiters, on a tenant's day only: sorted set of
--   members, scored by when each began waiting (Unix µs); the day hash
--   holds each one's amount (w:<m>) and until when it counts unless it
--   tries again (wx:<m>). Without it (the global day) nobody waits in
--   order: one order per job, across two days each keeping its own, could
--   leave two jobs each first on one day and waiting for the other.
-- ARGV[6] -> the reservation's member; ARGV[7] -> amount (µ$)
-- ARGV[8] -> the day's limit (µ$), -1 = none
-- ARGV[9] -> the soft-limit threshold (µ$), 0 = none
-- ARGV[10] -> reservation TTL in µs
-- ARGV[11] -> how long a waiter counts after its last try, in µs
-- Returns {"wrongday", now}, {"rebuild", token} or {"raise", run id} as
-- day.lua does, else {"ok", allowed, now, spent, reserved, amount held,
-- soft crossed, refusal}, all after the call; refusal is "" when allowed,
-- "spent" when spent + amount passes the limit (no settlement can make
-- room today), "held" when only what others hold (or the waiters before
-- it need) stands in the way: the member then waits, first come first
-- served, as long as it tries again within ARGV[11] of its last try.
local member, amount = ARGV[6], tonumber(ARGV[7])
local limit, soft_threshold = tonumber(ARGV[8]), tonumber(ARGV[9])
local expires = int_str(now + tonumber(ARGV[10]))
local waiters, wait_ttl = KEYS[3], tonumber(ARGV[11])
local ordered = waiters ~= nil

local f = redis.call("HMGET", day, "spent", "reserved", "r:" .. member)
local spent, reserved, held = tonumber(f[1]), tonumber(f[2]), f[3]

-- forget takes m out of the waiters.
local function forget(m)
  if ordered and redis.call("ZREM", waiters, m) == 1 then
    redis.call("HDEL", day, "w:" .. m, "wx:" .. m)
  end
end

-- ahead is the room the waiters before member need: the amounts of the
-- oldest 100 waiters that began waiting before it (all of them for a
-- newcomer), leaving out those that can never fit today (their next try
-- is refused for spend) and forgetting those that stopped trying. It stops
-- once the room is spoken for.
local function ahead()
  if not ordered then return 0 end
  local ms = redis.call("ZRANGE", waiters, 0, 99)
  if #ms == 0 then return 0 end
  local fields = {}
  for i, m in ipairs(ms) do
    fields[2 * i - 1], fields[2 * i] = "w:" .. m, "wx:" .. m
  end
  local v = redis.call("HMGET", day, unpack(fields))
  local sum = 0
  for i, m in ipairs(ms) do
    if m == member or spent + reserved + amount + sum > limit then break end
    local needs, counts_until = tonumber(v[2 * i - 1]), tonumber(v[2 * i])
    if not needs or not counts_until or counts_until <= now then
      forget(m)
    elseif spent + needs <= limit then
      sum = sum + needs
    end
  end
  return sum
end

local allowed, soft_crossed, refusal = 1, 0, ""
if held then
  -- The same member again (a redelivered job): hold what it holds, a while longer.
  amount = tonumber(held)
  redis.call("ZADD", reservations, "XX", expires, member)
elseif limit >= 0 and spent + amount > limit then
  allowed, refusal = 0, "spent"
  forget(member)
elseif limit >= 0 and spent + reserved + amount + ahead() > limit then
  allowed, refusal = 0, "held"
  if ordered then
    redis.call("ZADD", waiters, "NX", int_str(now), member)
    redis.call("HSET", day, "w:" .. member, ARGV[7], "wx:" .. member, int_str(now + wait_ttl))
    redis.call("PEXPIRE", waiters, day_ttl_ms)
  end
else
  -- the amount goes to Redis as the caller wrote it, exact
  redis.call("ZADD", reservations, expires, member)
  redis.call("PEXPIRE", reservations, day_ttl_ms)
  redis.call("HSET", day, "r:" .. member, ARGV[7])
  redis.call("HINCRBY", day, "reserved", ARGV[7])
  reserved = reserved + amount
  forget(member)
  -- the first reservation past the soft limit says so, once a day
  if soft_threshold > 0 and spent + reserved >= soft_threshold then
    soft_crossed = redis.call("HSETNX", day, "soft", "1")
  end
end
return {"ok", allowed, int_str(now), int_str(spent), int_str(reserved), int_str(amount), soft_crossed, refusal}
