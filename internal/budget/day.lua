-- The day prelude, shared by the scripts that read or write a day (Reserve
-- and Status), after the clock prelude. It checks that now lies in both
-- days, makes sure both day hashes exist and hold their spend, and drops
-- the reservations whose holders stopped extending them.
-- KEYS[1] -> tenant day hash: gen, rb, spent, reserved, soft, r:<id>, c:<id>
-- KEYS[2] -> tenant reservations: sorted set of ids, scored by expiry (Unix µs)
-- KEYS[3] -> global day hash: the same fields, for the members <tenant>:<id>
-- KEYS[4] -> global reservations: sorted set of <tenant>:<id> by expiry
-- ARGV[1] -> now in Unix µs, or "" to read Redis TIME (the clock prelude)
-- ARGV[2], ARGV[3] -> the tenant's day [start, end) in Unix µs
-- ARGV[4], ARGV[5] -> the UTC day [start, end) in Unix µs
-- ARGV[6] -> how long keys outlive their day, in ms
-- ARGV[7] -> a fresh generation token, for a day hash this call must create
-- Returns, ending the script, {"wrongday", now} when now is outside either
-- day, or {"rebuild", tenant token, global token} when a day hash (token
-- not "") waits for the ledger's sum; else the script goes on.
--
-- The day hash's fields:
--   gen       names this incarnation of the hash (a new one after Redis lost it)
--   rb        set while spent still waits for the ledger's sum
--   spent     what the day's settled jobs cost, µ$
--   reserved  the sum of the open reservations, µ$
--   soft      set once the tenant passed its soft limit (warned once)
--   r:<id>    an open reservation's amount, µ$
--   c:<id>    marks a job whose cost spent counts, so that however often a
--             job settles it is charged once (see Settle)
-- It runs after reservations.lua, whose int_str and drop it uses.

local tenant_day_start, tenant_day_end = tonumber(ARGV[2]), tonumber(ARGV[3])
local global_day_start, global_day_end = tonumber(ARGV[4]), tonumber(ARGV[5])
local key_slack_ms, new_token = tonumber(ARGV[6]), ARGV[7]

if now < tenant_day_start or now >= tenant_day_end or now < global_day_start or now >= global_day_end then
  return {"wrongday", int_str(now)}
end
-- the keys live until their day ends, and a little longer
local tenant_ttl_ms = int_str((tenant_day_end - now) / 1000 + key_slack_ms)
local global_ttl_ms = int_str((global_day_end - now) / 1000 + key_slack_ms)

-- ensure returns "" when the day hash is ready, else the generation token of
-- a hash whose spent still waits for the ledger (creating it when absent, so
-- settlements from now on count in it).
local function ensure(day, ttl_ms)
  local f = redis.call("HMGET", day, "gen", "rb")
  local gen, rebuilding = f[1], f[2]
  if not gen then
    redis.call("HSET", day, "gen", new_token, "rb", "1", "spent", "0", "reserved", "0")
    redis.call("PEXPIRE", day, ttl_ms)
    return new_token
  end
  if rebuilding then return gen end
  return ""
end

-- expire drops reservations whose holder stopped extending them (a crashed
-- worker), at most 100 a call; any left over count until a later call: the
-- safe side. A late Settle of one still charges it (no c:<id> yet).
local function expire(day, reservations)
  local lapsed = redis.call("ZRANGEBYSCORE", reservations, "-inf", int_str(now), "LIMIT", 0, 100)
  for _, id in ipairs(lapsed) do
    drop(day, reservations, id)
  end
end

local tenant_token, global_token = ensure(KEYS[1], tenant_ttl_ms), ensure(KEYS[3], global_ttl_ms)
if tenant_token ~= "" or global_token ~= "" then
  return {"rebuild", tenant_token, global_token}
end
expire(KEYS[1], KEYS[2])
expire(KEYS[3], KEYS[4])
