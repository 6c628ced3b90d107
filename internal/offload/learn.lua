-- Lowers a deployment's learned batch queue limit, never raises it.
-- KEYS[1] -> the learned limit (rkeys.LearnedBatchQueue)
-- ARGV[1] -> the tokens the provider's queue held when it refused a part
-- ARGV[2] -> how long the limit holds, in ms (LearnedQueueTTL)
-- Returns 0.
local key, held, ttl_ms = KEYS[1], ARGV[1], ARGV[2]
local current = redis.call("GET", key)
if not current or tonumber(current) > tonumber(held) then
  redis.call("SET", key, held, "PX", ttl_ms)
end
return 0
