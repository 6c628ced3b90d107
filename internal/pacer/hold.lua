-- Records (or renews) a synchronous request's hold on a scope's room. It
-- runs after the clock prelude (redisclock.Lua).
-- KEYS[1] -> the scope's holds (rkeys.FairHeld): id -> "expires_ms tokens requests weight"
-- ARGV[2] -> the hold's id
-- ARGV[3] -> its TTL in ms
-- ARGV[4] -> tokens; ARGV[5] -> requests
-- ARGV[6] -> the request's priority weight (a higher one goes first)
-- Returns 1.
local holds, id, ttl = KEYS[1], ARGV[2], tonumber(ARGV[3])
local expires_ms = math.floor(now / 1000) + ttl
redis.call('HSET', holds, id, string.format('%d %s %s %s', expires_ms, ARGV[4], ARGV[5], ARGV[6]))
if redis.call('PTTL', holds) < ttl then
  redis.call('PEXPIRE', holds, ttl)
end
return 1
