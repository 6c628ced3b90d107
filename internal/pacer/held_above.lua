-- Reports whether a hold in force on a scope's room outranks a priority.
-- It runs after the clock prelude (redisclock.Lua).
-- KEYS[1] -> the scope's holds (rkeys.FairHeld), as in hold.lua
-- ARGV[2] -> the priority's weight
-- Returns 1 if a hold in force has a higher weight, else 0.
local holds, weight = KEYS[1], tonumber(ARGV[2])
local now_ms = math.floor(now / 1000)
for _, hold in ipairs(redis.call('HVALS', holds)) do
  local expires_ms, hold_weight = string.match(hold, '^(%d+) %d+ %d+ (%d+)$')
  if expires_ms ~= nil and tonumber(expires_ms) > now_ms and tonumber(hold_weight) > weight then
    return 1
  end
end
return 0
