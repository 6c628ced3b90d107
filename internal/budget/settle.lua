-- Turns one job's reservation in one day into its real cost (or just
-- releases it), charging each job once per day: c:<member> marks a job
-- whose cost spent counts. A job settles its tenant's day and the global
-- day, one run of this script each.
-- KEYS[1..2] -> as in day.lua, for the reservation's day
-- ARGV[1] -> the reservation's member
-- ARGV[2] -> real cost (µ$); ARGV[3] -> "1" to charge it, "0" to release only
-- ARGV[4] -> for a check against the ledger (raise.go), when the job's
--   ledger row was written (Unix µs): a row the day counts already
--   (written before its rbt) is left alone, and so is every row of a day
--   waiting for its rebuild, whose sum will count it
-- Returns
--   -1: the day hash is gone: nothing added (the ledger has the charge and
--       the rebuild counts it)
--    0: nothing charged (a release, the job was charged before, or a
--       rebuild counted it)
--    1: charged
local day, reservations = KEYS[1], KEYS[2]
local member, cost, charge = ARGV[1], ARGV[2], ARGV[3] == "1"

if ARGV[4] then
  local f = redis.call("HMGET", day, "rbt", "rb")
  if f[2] or (f[1] and tonumber(f[1]) >= tonumber(ARGV[4])) then return 0 end
end

-- drop comes from reservations.lua, run before this.
drop(day, reservations, member)
if redis.call("EXISTS", day) == 0 then return -1 end
if not charge then return 0 end
-- charged before, by this call or any other
if redis.call("HSETNX", day, "c:" .. member, "1") == 0 then return 0 end
redis.call("HINCRBY", day, "spent", cost)
return 1
