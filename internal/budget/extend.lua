-- Keeps an open reservation from expiring: its expiry in one day moves to
-- now + the reservation TTL. It runs after the clock prelude.
-- KEYS[1..2] -> as in day.lua, for the reservation's day
-- ARGV[1] -> now in Unix µs, or "" to read Redis TIME
-- ARGV[2] -> the reservation's member; ARGV[3] -> reservation TTL in µs
-- Returns 1 if the reservation is still held (and now expires later), 0 if
-- it is not (settled, released, expired, or its day lost).
local member, ttl = ARGV[2], tonumber(ARGV[3])

if redis.call("HEXISTS", KEYS[1], "r:" .. member) == 0 then return 0 end
-- XX: a reservation dropped meanwhile is not brought back
redis.call("ZADD", KEYS[2], "XX", string.format("%d", now + ttl), member)
return 1
