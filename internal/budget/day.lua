-- The day prelude, shared by the scripts that read or write a day (Reserve
-- and Status), after the clock prelude. A day is a tenant's (in its tier's
-- timezone, keys tagged by the tenant) or the global one (UTC, all tenants,
-- keys tagged {budget}): the same fields and scripts, each run on its own
-- keys, so that a cluster spreads the tenants over its shards. It checks
-- that now lies in the day, makes sure the day hash exists and holds its
-- spend as the ledger counts it, and drops the reservations whose holders
-- stopped extending them.
-- KEYS[1] -> the day hash: gen, rb, rbt, run, spent, reserved, soft, r:<member>, c:<member>
-- KEYS[2] -> the day's reservations: sorted set of members, scored by expiry (Unix µs)
-- ARGV[1] -> now in Unix µs, or "" to read Redis TIME (the clock prelude)
-- ARGV[2], ARGV[3] -> the day [start, end) in Unix µs
-- ARGV[4] -> how long keys outlive their day, in ms
-- ARGV[5] -> a fresh generation token, for a day hash this call must create
-- Returns, ending the script, {"wrongday", now} when now is outside the
-- day, {"rebuild", token} when the day hash waits for the ledger's sum, or
-- {"raise", run id} when the day was last checked against the ledger on
-- another Redis server (see run); else the script goes on.
--
-- A member names a reservation in its day: the job id in a tenant's day,
-- <tenant>:<job id> in the global day. The day hash's fields:
--   gen       names this incarnation of the hash (a new one after Redis lost it)
--   rb        set while spent still waits for the ledger's sum
--   rbt       a time (Unix µs) before which every ledger row of the day is
--             counted in spent: when the ledger was read for the rebuild's
--             sum, moved on by each check that raised the day
--   run       the run id of the Redis server the day was last checked
--             against the ledger on: on any other (a restart, a restore, a
--             promoted replica) it may hold older spend than was settled,
--             and is checked again, and raised to the ledger, before it
--             answers
--   spent     what the day's settled jobs cost, µ$
--   reserved  the sum of the open reservations, µ$
--   soft      set once the tenant passed its soft limit (warned once)
--   r:<m>     an open reservation's amount, µ$
--   c:<m>     marks a job whose cost spent counts, so that however often a
--             job settles it is charged once (see Settle)
-- It runs after reservations.lua, whose int_str, drop and run_id it uses.

local day, reservations = KEYS[1], KEYS[2]
local day_start, day_end = tonumber(ARGV[2]), tonumber(ARGV[3])
local key_slack_ms, new_token = tonumber(ARGV[4]), ARGV[5]

if now < day_start or now >= day_end then
  return {"wrongday", int_str(now)}
end
-- the keys live until their day ends, and a little longer
local day_ttl_ms = int_str((day_end - now) / 1000 + key_slack_ms)

-- A hash Redis does not have is created waiting for the ledger's sum, so
-- that settlements from now on count in it; the sum is read on this server.
local server = run_id()
local f = redis.call("HMGET", day, "gen", "rb", "run")
if not f[1] then
  redis.call("HSET", day, "gen", new_token, "rb", "1", "spent", "0", "reserved", "0")
  if server then redis.call("HSET", day, "run", server) end
  redis.call("PEXPIRE", day, day_ttl_ms)
  return {"rebuild", new_token}
end
if f[2] then return {"rebuild", f[1]} end
if server and f[3] ~= server then return {"raise", server} end

-- Reservations whose holder stopped extending them (a crashed worker) go,
-- at most 100 a call; any left over count until a later call: the safe
-- side. A late Settle of one still charges it (no c:<member> yet).
local lapsed = redis.call("ZRANGEBYSCORE", reservations, "-inf", int_str(now), "LIMIT", 0, 100)
for _, m in ipairs(lapsed) do
  drop(day, reservations, m)
end
