-- Lists the jobs of a scope released long ago and not yet started. It runs
-- after the clock prelude (redisclock.Lua).
-- KEYS[1] -> the scope's state hash (rkeys.FairState)
-- KEYS[2] -> its released jobs not yet started, by release time (rkeys.FairOut)
-- ARGV[2] -> how long ago in ms a job was released at the latest
-- ARGV[3] -> the most jobs to list
-- Returns {per job: id, its "cost|priority" field (o:id) or ""}, oldest first.
local state, released = KEYS[1], KEYS[2]
local released_by = string.format('%d', math.floor(now / 1000) - tonumber(ARGV[2]))
local reply = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', released, '-inf', released_by, 'LIMIT', 0, tonumber(ARGV[3]))) do
  reply[#reply + 1], reply[#reply + 2] = id, redis.call('HGET', state, 'o:' .. id) or ''
end
return reply
