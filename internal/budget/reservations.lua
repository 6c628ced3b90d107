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

-- run_id is the run id of the Redis server running the script (INFO
-- server): a new one at every start, and a replica's own once promoted,
-- so a day checked against the ledger on another one may hold older
-- spend (a restore, a failover). nil where INFO server is not served (the
-- embedded Redis of dev mode). It costs about 4 µs of Redis CPU a call
-- (a pattern match would double it; run ids are 40 characters).
local function run_id()
  local info = redis.pcall("INFO", "server")
  if type(info) ~= "string" then return nil end
  local at = string.find(info, "run_id:", 1, true)
  if not at then return nil end
  return string.sub(info, at + 7, at + 46)
end
