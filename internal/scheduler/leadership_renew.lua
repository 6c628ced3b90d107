-- Renews the scheduler's leadership if this process leads, or takes it when
-- nobody does.
-- KEYS[1] -> the leadership (rkeys.Lock("scheduler"))
-- ARGV[1] -> this process's value
-- ARGV[2] -> the leadership's TTL in ms
-- Returns 1 when this process leads now, else 0.
local leadership, me, ttl_ms = KEYS[1], ARGV[1], ARGV[2]

local leader = redis.call('GET', leadership)
if leader == me then
  redis.call('PEXPIRE', leadership, ttl_ms)
  return 1
end
if not leader then
  redis.call('SET', leadership, me, 'PX', ttl_ms)
  return 1
end
return 0
