-- Reads a day without reserving. It runs after the clock and day preludes
-- (day.lua), which drop expired reservations and start a rebuild when Redis
-- lost the day.
-- KEYS and ARGV[1..7] -> as in day.lua
-- Returns {"wrongday", now} or {"rebuild", tenant token, global token} as
-- day.lua does, else {"ok", now, spent, reserved, global spent, global
-- reserved}.
local tenant = redis.call("HMGET", KEYS[1], "spent", "reserved")
local global = redis.call("HMGET", KEYS[3], "spent", "reserved")
return {"ok", int_str(now), tenant[1], tenant[2], global[1], global[2]}
