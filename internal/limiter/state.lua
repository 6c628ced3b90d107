-- The scope's state: load_state reads it, save_state writes it, put notes a
-- change for save_state. The token bucket's scripts start with these (after
-- the constants and the clock). The state's fields are listed in lua.go.
--
-- The state is a table of named values, kept in the one field m of the
-- scope's hash (rkeys.LimiterScope) as a MessagePack map (cmsgpack, a
-- library of Redis's Lua). A run reads it and writes it once, and its
-- numbers stay numbers, exact. Where Redis has no cmsgpack (dev mode's
-- embedded Redis, miniredis), the state is JSON (cjson), exact there too:
-- that Redis encodes a number as Go does. A Redis has one or the other, so a
-- hash is never read in the form it was not written in.
local msgpack = rawget(_G, 'cmsgpack')
local pack_state = msgpack and msgpack.pack or cjson.encode
local unpack_state = msgpack and msgpack.unpack or cjson.decode

-- Older forms of the state are read as the current one, and the first run
-- that writes rewrites them in it:
--  - a hash of a field per value, without m (its fields are returned, for
--    save_state to drop);
--  - the calibration's samples as records of one width ('%07.4f', comma
--    separated), q in arrival order and qs sorted, now the array qa.
local function upgrade_samples(st)
  if type(st.q) ~= 'string' then return end
  local samples = {}
  for record in string.gmatch(st.q, '[^,]+') do
    local ratio = tonumber(record)
    -- the four decimals the records kept
    if ratio then samples[#samples + 1] = tonumber(string.format('%.4f', ratio)) end
  end
  st.qa, st.q, st.qs = samples, nil, nil
end

-- load_state returns the state and, for a hash of a field per value, its
-- fields.
local function load_state(key)
  local st, old_fields
  local packed = redis.call('HGET', key, 'm')
  if packed then
    st = unpack_state(packed)
  else
    st, old_fields = {}, {}
    local h = redis.call('HGETALL', key)
    for i = 1, #h, 2 do
      st[h[i]] = h[i + 1]
      old_fields[#old_fields + 1] = h[i]
    end
  end
  upgrade_samples(st)
  return st, old_fields
end

-- put notes that field k becomes v, for save_state
local function put(changes, k, v)
  changes[#changes + 1] = k
  changes[#changes + 1] = v
end

-- save_state writes st with the changes (field, value pairs, see put) made
-- and the fields named in dropped removed.
local function save_state(key, st, old_fields, changes, dropped)
  for i = 1, #changes, 2 do st[changes[i]] = changes[i + 1] end
  for _, k in ipairs(dropped) do st[k] = nil end
  -- m first: a hash emptied by the HDEL would go, and its expiry with it
  redis.call('HSET', key, 'm', pack_state(st))
  if old_fields and #old_fields > 0 then redis.call('HDEL', key, unpack(old_fields)) end
end
