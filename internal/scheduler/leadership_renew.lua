-- Renews the scheduler's lease if this process holds it, or takes it when
-- it is free.
-- KEYS[1] -> the lease (rkeys.Lock("scheduler"))
-- ARGV[1] -> this process's lease value
-- ARGV[2] -> the lease's TTL in ms
-- Returns 1 when this process holds the lease now, else 0.
local lease, me, ttl_ms = KEYS[1], ARGV[1], ARGV[2]

local holder = redis.call('GET', lease)
if holder == me then
  redis.call('PEXPIRE', lease, ttl_ms)
  return 1
end
if not holder then
  redis.call('SET', lease, me, 'PX', ttl_ms)
  return 1
end
return 0
