-- Gives an event its slot: the one it holds, or the scope's next free one,
-- at least now. Slots are µs since the epoch.
-- KEYS[1] -> the scope's next free slot (rkeys.SpacerNext)
-- KEYS[2] -> the event's slot (rkeys.SpacerSlot)
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2] -> the interval in µs
-- ARGV[3] -> how long a slot is held after it falls due, in ms
-- Returns {now, the event's slot}.
local next_key, slot_key = KEYS[1], KEYS[2]
local interval, hold_ms = tonumber(ARGV[2]), tonumber(ARGV[3])

local slot = tonumber(redis.call('GET', slot_key))
if not slot then
  slot = math.max(now, tonumber(redis.call('GET', next_key)) or 0)
  local next_free = slot + interval
  -- %.17g: the µs exact, where Redis would keep 14 digits
  redis.call('SET', next_key, string.format('%.17g', next_free), 'PX', math.ceil((next_free - now) / 1000) + 1000)
  redis.call('SET', slot_key, string.format('%.17g', slot), 'PX', math.ceil((slot - now) / 1000) + hold_ms)
end
return {now, slot}
