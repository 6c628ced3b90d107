-- Sums the holds in force on a scope's room, dropping the expired ones. It
-- runs after the clock prelude (redisclock.Lua).
-- KEYS[1] -> the scope's holds (rkeys.FairHeld), as in hold.lua
-- Returns {tokens, requests} held, as strings.
local holds = KEYS[1]
local now_ms = math.floor(now / 1000)
local tokens, requests = 0, 0
local all = redis.call('HGETALL', holds)
for i = 1, #all, 2 do
  local expires_ms, t, r = string.match(all[i + 1], '^(%d+) (%d+) (%d+) %d+$')
  if expires_ms == nil or tonumber(expires_ms) <= now_ms then
    redis.call('HDEL', holds, all[i])
  else
    tokens, requests = tokens + tonumber(t), requests + tonumber(r)
  end
end
return {tostring(tokens), tostring(requests)}
