-- Keeps an open reservation from expiring: its expiry moves to now + the
-- reservation TTL, on the tenant's day and on the global day. It runs after
-- the clock prelude.
-- KEYS[1..4] -> as in day.lua, for the reservation's days
-- ARGV[1] -> now in Unix µs, or "" to read Redis TIME
-- ARGV[2] -> reservation id; ARGV[3] -> its global member (<tenant>:<id>)
-- ARGV[4] -> reservation TTL in µs
-- Returns 1 if the reservation is still held (and now expires later), 0 if
-- it is not (settled, released, expired, or its day lost).
local id, member, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4])

if redis.call("HEXISTS", KEYS[1], "r:" .. id) == 0 then return 0 end
local expires = string.format("%d", now + ttl)
-- XX: a reservation dropped meanwhile is not brought back
redis.call("ZADD", KEYS[2], "XX", expires, id)
redis.call("ZADD", KEYS[4], "XX", expires, member)
return 1
