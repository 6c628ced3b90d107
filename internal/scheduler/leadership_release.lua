-- Gives the scheduler's lease up if this process holds it.
-- KEYS[1] -> the lease (rkeys.Lock("scheduler"))
-- ARGV[1] -> this process's lease value
-- Returns 1 when it was released, else 0.
local lease, me = KEYS[1], ARGV[1]

if redis.call('GET', lease) == me then return redis.call('DEL', lease) end
return 0
