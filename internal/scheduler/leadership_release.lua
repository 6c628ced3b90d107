-- Gives the scheduler's leadership up if this process leads.
-- KEYS[1] -> the leadership (rkeys.Lock("scheduler"))
-- ARGV[1] -> this process's value
-- Returns 1 when it was given up, else 0.
local leadership, me = KEYS[1], ARGV[1]

if redis.call('GET', leadership) == me then return redis.call('DEL', leadership) end
return 0
