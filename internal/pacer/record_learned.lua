-- Stores the limits a provider announced for one scope and returns the ones
-- stored before, so that of all the workers seeing a change only the one
-- that records it first reports it.
-- KEYS[1] -> the scope's learned limits (rkeys.LearnedLimits)
-- ARGV[1] -> announced requests per minute (0 = not announced)
-- ARGV[2] -> announced tokens per minute (0 = not announced)
-- ARGV[3] -> TTL in ms (LearnedTTL)
-- Returns {previous rpm, previous tpm}, each "" when there was none.
local learned, rpm, tpm, ttl_ms = KEYS[1], ARGV[1], ARGV[2], ARGV[3]

local previous = redis.call("HMGET", learned, "rpm", "tpm")
redis.call("HSET", learned, "rpm", rpm, "tpm", tpm)
redis.call("PEXPIRE", learned, ttl_ms)
return {previous[1] or "", previous[2] or ""}
