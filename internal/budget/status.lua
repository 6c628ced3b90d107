-- Reads a day without reserving. It runs after the clock and day preludes
-- (day.lua), which drop expired reservations and start a rebuild when Redis
-- lost the day.
-- KEYS and ARGV[1..5] -> as in day.lua
-- Returns {"wrongday", now} or {"rebuild", token} as day.lua does, else
-- {"ok", now, spent, reserved}.
local f = redis.call("HMGET", day, "spent", "reserved")
return {"ok", int_str(now), f[1], f[2]}
