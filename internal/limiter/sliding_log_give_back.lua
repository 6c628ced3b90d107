-- Replaces a lease's entry, counted at its whole slice, by one of what was
-- spent of it (none when nothing was), in every window's log that still
-- holds it.
-- KEYS[2i-1], KEYS[2i] -> window i's log and total, as in sliding_log.lua
-- ARGV[1] -> now in µs, or "" for Redis TIME (unused: an entry gone from a
--   log has left its window)
-- ARGV[2] -> the entry id; ARGV[3] -> its cost; ARGV[4] -> what was spent
-- ARGV[5] -> the entry's score
-- Returns the number of logs changed.
local id, cost, spent, score = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]

local done = 0
for i = 1, #KEYS / 2 do
  local log, total_key = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('ZREM', log, id .. ':' .. cost) == 1 then
    if spent > 0 then redis.call('ZADD', log, score, id .. ':' .. spent) end
    local total = tonumber(redis.call('GET', total_key))
    if total then
      total = total - (cost - spent)
      if total > 0 and redis.call('ZCARD', log) > 0 then
        redis.call('SET', total_key, total, 'KEEPTTL')
      else
        redis.call('DEL', total_key)
      end
    end
    done = done + 1
  end
end
return done
