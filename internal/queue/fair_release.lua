-- Takes from a scope's fair queue, in fair order, the jobs its limits have
-- room for, and counts them released. It runs after the clock prelude
-- (redisclock.Lua). The keys and the state hash's fields are as in
-- fair_push.lua.
-- KEYS[1] -> the scope's state hash (rkeys.FairState)
-- KEYS[2] -> its priorities with work (rkeys.FairClasses)
-- KEYS[3] -> its job ids waiting or released (rkeys.FairMembers)
-- KEYS[4] -> its released jobs not yet started, by release time (rkeys.FairOut)
-- ARGV[2] -> the prefix of its per-priority and per-tenant keys
-- ARGV[3] -> the state's TTL in ms
-- ARGV[4] -> the tokens the limits have room for, before what is released
--   and not yet started; "inf" for no limit
-- ARGV[5] -> the requests they have room for, likewise
-- ARGV[6] -> the most jobs released and not yet started
-- ARGV[7] -> what the limiter counts per token of a job's cost (its prompt
--   calibration, roughly)
-- ARGV[8] -> "1" to release the next job even if it does not fit, when none
--   is released and not started (a job larger than the room can ever be)
-- ARGV[9] -> the priorities' weights, "name=weight,..."
-- Returns {1 when no job waits any more, else 0; then per released job:
-- id, priority, tenant, cost, ms it waited}.
local state, priorities, members, released = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, ttl = ARGV[2], ARGV[3]
local tokens = tonumber(ARGV[4]) or math.huge
local requests = tonumber(ARGV[5]) or math.huge
local max_released, factor, force = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'
local weights = {}
for name, weight in string.gmatch(ARGV[9], '([^=,]+)=([^,]+)') do weights[name] = tonumber(weight) end
local now_ms = math.floor(now / 1000)

-- What is released and not yet started takes its room first.
local outstanding = redis.call('ZCARD', released)
tokens = tokens - (tonumber(redis.call('HGET', state, 'outsum')) or 0)
requests = requests - outstanding

local reply = {0}
-- Each step takes the head of the tenant with the lowest tag in the
-- priority with the lowest tag: it releases it, or drops it when it was
-- cancelled. At most this many steps a call, so a call stays short.
local steps = 1000
while steps > 0 and outstanding < max_released do
  steps = steps - 1
  local p = redis.call('ZRANGE', priorities, 0, 0, 'WITHSCORES')
  if #p == 0 then break end
  local priority, priority_tag = p[1], tonumber(p[2])
  local tenants = prefix .. 'tenants:' .. priority
  local t = redis.call('ZRANGE', tenants, 0, 0, 'WITHSCORES')
  if #t == 0 then
    redis.call('ZREM', priorities, priority)
  else
    local tenant, tenant_tag = t[1], tonumber(t[2])
    local list = prefix .. 'list:' .. priority .. ':' .. tenant
    -- an entry is "id|cost|ms queued"
    local head = redis.call('LINDEX', list, 0)
    local id, cost, queued_ms
    if head then
      id, cost, queued_ms = string.match(head, '^(.*)|(%d+)|(%d+)$')
      cost, queued_ms = tonumber(cost), tonumber(queued_ms)
    end
    -- a job that left the members was cancelled (or started): dropped
    local waiting = id and redis.call('SISMEMBER', members, id) == 1
    local fits = cost and cost * factor <= tokens and requests >= 1
    if waiting and not fits and not (force and outstanding == 0) then break end
    if head then redis.call('LPOP', list) end
    if waiting then
      local counted = cost * factor
      tokens, requests, outstanding = tokens - counted, requests - 1, outstanding + 1
      redis.call('HDEL', state, 'w:' .. id)
      redis.call('HINCRBY', state, 'n:' .. priority .. ':' .. tenant, -1)
      -- Start-time fair queuing: the job finishes at its start tag plus
      -- its cost over the tenant's share (over the priority's weight
      -- between priorities); the tenant's next job starts there.
      local share = tonumber(redis.call('HGET', state, 's:' .. tenant)) or 1
      local tenant_finish = tenant_tag + cost / share
      local priority_finish = priority_tag + cost / (weights[priority] or 1)
      redis.call('HSET', state, 'v:' .. priority, tenant_tag, 'f:' .. priority .. ':' .. tenant, tenant_finish)
      redis.call('HSET', state, 'vc', priority_tag, 'fc:' .. priority, priority_finish,
        'o:' .. id, counted .. '|' .. priority)
      redis.call('HINCRBYFLOAT', state, 'outsum', counted)
      redis.call('ZADD', released, now_ms, id)
      local n = #reply
      reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4], reply[n + 5] = id, priority, tenant, cost, now_ms - queued_ms
      if redis.call('LLEN', list) > 0 then redis.call('ZADD', tenants, tenant_finish, tenant) end
      priority_tag = priority_finish
    end
    if redis.call('LLEN', list) == 0 then redis.call('ZREM', tenants, tenant) end
    if redis.call('ZCARD', tenants) == 0 then
      redis.call('ZREM', priorities, priority)
    else
      redis.call('ZADD', priorities, priority_tag, priority)
    end
  end
end
if redis.call('ZCARD', priorities) == 0 then reply[1] = 1 end
redis.call('PEXPIRE', state, ttl)
return reply
