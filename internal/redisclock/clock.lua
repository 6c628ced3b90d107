-- The clock prelude, put in front of a script: it sets the local now, in µs
-- since the Unix epoch.
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- A clock that tests inject passes its time; otherwise every process reads
-- the one clock of Redis, so that they agree whatever their own clocks say.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
