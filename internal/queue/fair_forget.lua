-- Forgets jobs of a scope's fair queue: a worker has their permit, or they
-- were cancelled. A waiting job leaves its tenant's count at once (its
-- entry in the list is dropped when its turn comes); a released one stops
-- counting as released. The state hash's fields are as in fair_push.lua.
-- KEYS[1] -> the scope's state hash (rkeys.FairState)
-- KEYS[2] -> its job ids waiting or released (rkeys.FairMembers)
-- KEYS[3] -> its released jobs not yet started (rkeys.FairOut)
-- ARGV[1..] -> the job ids
-- Returns how many of them were released and not yet started.
local state, members, released = KEYS[1], KEYS[2], KEYS[3]
local were_released = 0
for _, id in ipairs(ARGV) do
  if redis.call('SREM', members, id) == 1 then
    local waiting_in = redis.call('HGET', state, 'w:' .. id)
    if waiting_in then
      redis.call('HINCRBY', state, 'n:' .. waiting_in, -1)
      redis.call('HDEL', state, 'w:' .. id)
    end
  end
  if redis.call('ZREM', released, id) == 1 then
    were_released = were_released + 1
    local counted = redis.call('HGET', state, 'o:' .. id)
    if counted then
      redis.call('HINCRBYFLOAT', state, 'outsum', -tonumber(string.match(counted, '^[^|]+')))
      redis.call('HDEL', state, 'o:' .. id)
    end
  end
end
return were_released
