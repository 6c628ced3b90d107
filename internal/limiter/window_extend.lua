-- extend(key, ms) sets key's expiry to ms unless the key already lives
-- longer. Window sets of one scope name different windows, so a call knows
-- only its own windows' needs and must never shorten the expiry another
-- call's windows need. The fixed and sliding window scripts start with it
-- (after the clock).
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
