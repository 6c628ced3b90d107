-- Turns one job's reservation into its real cost (or just releases it), on
-- the tenant's day and on the global day, charging each job once: c:<id>
-- marks a job whose cost spent counts. The global day marks a job
-- (c:<tenant>:<id>) only when the tenant's day hash was gone.
-- KEYS[1..4] -> as in day.lua, for the reservation's days
-- ARGV[1] -> job id; ARGV[2] -> its global member (<tenant>:<id>)
-- ARGV[3] -> real cost (µ$); ARGV[4] -> "1" to charge it, "0" to release only
-- ARGV[5] -> for an audit (Budgets.Audit), when the job's ledger row was
--   written (Unix µs): a row a rebuild of either day counted (written
--   before its rbt) is left alone
-- Returns {tenant outcome, global outcome}, each
--   -1: the day hash is gone: nothing added (the ledger has the charge and
--       the rebuild counts it)
--    0: nothing charged (a release, or the job was charged before)
--    1: charged
local tenant_day, tenant_reservations = KEYS[1], KEYS[2]
local global_day, global_reservations = KEYS[3], KEYS[4]
local id, member, cost, charge = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == "1"

if ARGV[5] then
  local written = tonumber(ARGV[5])
  for _, day in ipairs({tenant_day, global_day}) do
    local rbt = redis.call("HGET", day, "rbt")
    if rbt and tonumber(rbt) >= written then return {0, 0} end
  end
end

-- int_str and drop come from reservations.lua, run before this.
drop(tenant_day, tenant_reservations, id)
drop(global_day, global_reservations, member)

local tenant_kept, global_kept = redis.call("EXISTS", tenant_day) == 1, redis.call("EXISTS", global_day) == 1
local tenant_out, global_out = -1, -1
if tenant_kept then tenant_out = 0 end
if global_kept then global_out = 0 end
if not charge then return {tenant_out, global_out} end
-- charged before, by this call or any other
if (tenant_kept and redis.call("HEXISTS", tenant_day, "c:" .. id) == 1) or
   (global_kept and redis.call("HEXISTS", global_day, "c:" .. member) == 1) then
  return {tenant_out, global_out}
end
if tenant_kept then
  redis.call("HINCRBY", tenant_day, "spent", cost)
  redis.call("HSET", tenant_day, "c:" .. id, "1")
  tenant_out = 1
end
if global_kept then
  redis.call("HINCRBY", global_day, "spent", cost)
  -- the tenant's mark covers both days while its hash lives
  if not tenant_kept then redis.call("HSET", global_day, "c:" .. member, "1") end
  global_out = 1
end
return {tenant_out, global_out}
