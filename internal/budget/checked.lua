-- Records a check of a day against the ledger (raise.go): every ledger row
-- written before a time is counted in the day's spent, which is no less
-- than the ledger's sum of them; and, for a check made because the day
-- came from another Redis server, that it is checked on this one.
-- KEYS[1] -> a day hash (tenant or global)
-- ARGV[1] -> the generation token the check read the hash with
-- ARGV[2] -> the time (Unix µs) before which every ledger row of the day is
--   counted, kept as rbt when later than rbt; "" for none
-- ARGV[3] -> the run id the check was made for, kept as run; "" for none
-- ARGV[4] -> the ledger's sum of the rows the check found counted (µ$), a
--   floor for spent; "" for none
-- Returns what spent was raised by to reach ARGV[4] (0 or more), or -1
-- when nothing was recorded: the hash is gone, of another generation or
-- waiting for its rebuild, or this server's run id is not ARGV[3] (it
-- restarted during the check: the next call checks again).
-- It runs after reservations.lua, whose run_id it uses.
local day, gen, counted, run, floor = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local f = redis.call("HMGET", day, "gen", "rb", "rbt", "spent")
if f[1] ~= gen or f[2] then return -1 end
if run ~= "" then
  if run_id() ~= run then return -1 end
  redis.call("HSET", day, "run", run)
end
if counted ~= "" and (not f[3] or tonumber(f[3]) < tonumber(counted)) then
  redis.call("HSET", day, "rbt", counted)
end
local added = 0
if floor ~= "" and tonumber(f[4]) < tonumber(floor) then
  added = tonumber(floor) - tonumber(f[4])
  redis.call("HINCRBY", day, "spent", int_str(added))
end
return added
