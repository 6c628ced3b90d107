-- Adds the ledger's sum to a day hash that day.lua created and that waits
-- for it, once per incarnation: every caller that saw the hash waiting read
-- the ledger after it was created, so any of their sums is right, and the
-- first one wins.
-- KEYS[1] -> a day hash (tenant or global)
-- ARGV[1] -> its generation token; ARGV[2] -> the ledger's sum (µ$)
-- ARGV[3] -> when the ledger was read (Unix µs), kept as rbt: the ledger's
--   rows older than that are in the sum (an audit leaves them)
-- Returns 1 if the sum was added, 0 if another caller got there first (or
-- the hash is gone or of another generation).
local day, token, sum = KEYS[1], ARGV[1], ARGV[2]

if redis.call("HGET", day, "gen") ~= token then return 0 end
if redis.call("HDEL", day, "rb") == 0 then return 0 end
redis.call("HINCRBY", day, "spent", sum)
redis.call("HSET", day, "rbt", ARGV[3])
return 1
