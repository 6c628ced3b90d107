-- Takes a reservation out of its tenant day's waiters (reserve.lua), when
-- it waits no more: the global day refused it for spend, or its caller gave
-- up.
-- KEYS[1] -> the tenant's day hash; KEYS[2] -> the day's waiters
-- ARGV[1] -> the reservation's member
-- Returns 1 if it was waiting, 0 if not.
local day, waiters, member = KEYS[1], KEYS[2], ARGV[1]

if redis.call("ZREM", waiters, member) == 0 then return 0 end
redis.call("HDEL", day, "w:" .. member, "wx:" .. member)
return 1
