-- Blocks a scope until now + the penalty, never shortening a penalty in
-- force, and cancels a probe in flight so that a new one follows.
-- KEYS[1] -> the scope's hash (rkeys.LimiterScope), its state as lua.go lists
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2] -> the penalty in µs
-- ARGV[3] -> probe timeout in µs
-- Returns the end of the penalty in µs.
local key = KEYS[1]
local penalty, probe_timeout = tonumber(ARGV[2]), tonumber(ARGV[3])

local st, old_fields = load_state(key)
local penalty_until = now + penalty
local in_force = tonumber(st.pu)
if in_force and in_force > penalty_until then penalty_until = in_force end
save_state(key, st, old_fields, {'pu', penalty_until}, {'pid', 'pt'})
-- the hash lives until the penalty is over and the probe after it had time
local ttl_ms = math.ceil((penalty_until - now + probe_timeout) / 1000) + 1000
if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
return penalty_until
