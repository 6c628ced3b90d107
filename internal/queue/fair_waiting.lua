-- Reads what waits in a scope's fair queue.
-- KEYS[1] -> the scope's state hash (rkeys.FairState)
-- KEYS[2] -> its priorities with work (rkeys.FairClasses)
-- KEYS[3] -> its released jobs not yet started (rkeys.FairOut)
-- ARGV[1] -> the prefix of its per-priority and per-tenant keys (rkeys.FairQueue)
-- Returns {jobs released and not started; then per priority and tenant with
-- work: priority, tenant, jobs waiting, ms when the oldest was queued}.
local state, priorities, released, prefix = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local reply = {redis.call('ZCARD', released)}
for _, priority in ipairs(redis.call('ZRANGE', priorities, 0, -1)) do
  for _, tenant in ipairs(redis.call('ZRANGE', prefix .. 'tenants:' .. priority, 0, -1)) do
    -- an entry is "id|cost|ms queued"
    local head = redis.call('LINDEX', prefix .. 'list:' .. priority .. ':' .. tenant, 0)
    local queued_ms = 0
    if head then queued_ms = tonumber(string.match(head, '([^|]+)$')) end
    local waiting = tonumber(redis.call('HGET', state, 'n:' .. priority .. ':' .. tenant)) or 0
    local n = #reply
    reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = priority, tenant, waiting, queued_ms
  end
end
return reply
