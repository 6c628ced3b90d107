-- Adds jobs to a scope's fair queue, each once. It runs after the clock
-- prelude (redisclock.Lua).
-- KEYS[1] -> the scope's state hash (rkeys.FairState)
-- KEYS[2] -> its priorities with work, by virtual tag (rkeys.FairClasses)
-- KEYS[3] -> its job ids waiting or released (rkeys.FairMembers)
-- ARGV[2] -> the prefix of its per-priority and per-tenant keys (rkeys.FairQueue)
-- ARGV[3] -> the state's TTL in ms
-- ARGV[4..] -> per job, five values: id, priority, tenant, cost in tokens,
--   the tenant's share ("" keeps the one known)
-- Returns per job 1 when it was added, 0 when it was already waiting or
-- released.
--
-- The state hash holds, per priority p and tenant t:
--   n:p:t  jobs waiting          s:t   the tenant's share
--   v:p    p's virtual time      f:p:t the tenant's last finish tag in p
--   vc     the virtual time between priorities; fc:p p's last finish tag
--   w:id   "p:t" of a waiting job
--   o:id   "cost|p" of a released job not yet started; outsum their sum
local state, priorities, members = KEYS[1], KEYS[2], KEYS[3]
local prefix, ttl = ARGV[2], ARGV[3]
local queued_ms = string.format('%d', math.floor(now / 1000))

local added = {}
for i = 4, #ARGV, 5 do
  local id, priority, tenant, cost, share = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  added[#added + 1] = 0
  if redis.call('SADD', members, id) == 1 then
    added[#added] = 1
    local tenants = prefix .. 'tenants:' .. priority
    local list = prefix .. 'list:' .. priority .. ':' .. tenant
    redis.call('RPUSH', list, id .. '|' .. cost .. '|' .. queued_ms)
    if share ~= '' then redis.call('HSET', state, 's:' .. tenant, share) end
    redis.call('HINCRBY', state, 'n:' .. priority .. ':' .. tenant, 1)
    redis.call('HSET', state, 'w:' .. id, priority .. ':' .. tenant)
    -- A tenant that starts waiting starts at its priority's virtual time,
    -- or at its last finish if that is later: it neither waits behind
    -- another's backlog nor gets credit for the time it was idle.
    if not redis.call('ZSCORE', tenants, tenant) then
      local virtual = tonumber(redis.call('HGET', state, 'v:' .. priority)) or 0
      local finish = tonumber(redis.call('HGET', state, 'f:' .. priority .. ':' .. tenant)) or 0
      redis.call('ZADD', tenants, math.max(virtual, finish), tenant)
    end
    -- The same between priorities.
    if not redis.call('ZSCORE', priorities, priority) then
      local virtual = tonumber(redis.call('HGET', state, 'vc')) or 0
      local finish = tonumber(redis.call('HGET', state, 'fc:' .. priority)) or 0
      redis.call('ZADD', priorities, math.max(virtual, finish), priority)
    end
  end
end
redis.call('PEXPIRE', state, ttl)
return added
