-- The scope's state: load_state reads it, save_state writes it, put notes a
-- change for save_state. The token bucket's scripts start with these (after
-- the constants and the clock). Its fields are listed at the end of this
-- header; load_state also reads the older forms (a field per value; the
-- calibration's samples as strings q and qs), which the first write replaces.
--
-- The state is a table of named values, kept in the one field m of the
-- scope's hash (rkeys.LimiterScope) as a MessagePack map (cmsgpack, a
-- library of Redis's Lua). A run reads it and writes it once, and its
-- numbers stay numbers, exact. Where Redis has no cmsgpack (dev mode's
-- embedded Redis, miniredis), the state is JSON (cjson), exact there too:
-- that Redis encodes a number as Go does. A Redis has one or the other, so a
-- hash is never read in the form it was not written in.
--
-- The state's fields, each named as Redis holds it (renaming one would lose
-- what existing scopes hold). Times are in µs since the epoch; <name> is a
-- bucket's name ("rpm", "tpm"); a factor or share is a fraction of 1.
--
-- The penalty and the probe (Penalize, and the Reserve after it):
--
--   pu                  the end of the penalty
--   pid, pt             the probe's reservation id, and its deadline
--
-- A bucket's level (Reserve, Reconcile, Settle):
--
--   u:<name>, t:<name>  the tokens it holds used, and when they were counted
--   g:<name>            its in-flight generation (see inflightGen)
--   f0:<name>           what is reserved and not yet reconciled in generation g
--   f1:<name>           the same in generation g - 1
--   c:<name>            all it ever took
--   cl:<name>, clt:<name>  c after the latest run that took, and when
--   kn:<name>, knt:<name>  the newer checkpoint of c, and when
--   k:<name>, kt:<name>    the older checkpoint, at least lagDelay before
--                       (the three give what it took lagDelay ago, see lagDelay)
--   pace:<name>, pace_t:<name>  what its pace held, and when (see Bucket.Burst)
--
-- What Settle learns from the provider's answers, so that the next runs
-- see it at once (it must change in the same run that settles):
--
-- The provider's view of the bucket:
--
--   pr:<name>, prt:<name>  what the provider last said it holds, and when
--                       (BucketLearning.ProviderRemaining)
--   s:<name>            the lag (see lagDelay) of the freshest answer followed:
--                       an older answer only ever lowers the level
--
-- Others' drain (BucketSettlement.Drain) and the refund estimate
-- (BucketLearning.Refund), from the corrections the provider's answers
-- make while its bucket is busy (busyShare):
--
--   e:<name>            the share of the refill others take, believed for
--                       drainBelief after the last answer (the drain)
--   n:<name>            the corrections' sum, forgotten over refundWindow
--   tw:<name>           the time that sum covers, forgotten alike
--   w:<name>            the tokens calls left unused, forgotten alike
--   wa:<name>           the unused tokens since the last answer added
--   ls:<name>           when the last answer came
--   lb:<name>           "1" when it showed the provider's bucket busy (and
--                       was trusted): the next answer adds to the sums
--   lim:<name>          the limit the sums are of: they start again with a
--                       new one
--
-- The limit factor after unpredicted 429s (BucketSettlement.Factor):
--
--   x:<name>, xt:<name> the share of its limit the bucket may use, and when
--                       a 429 lowered it (factorDecrease; it comes back at
--                       factorRecovery)
--   zt:<name>           when the last 429 that lowered it came, and
--   zc:<name>, zr:<name>  c and rr then: what was let through between two
--                       429s bounds the provider's rate (estimateMin)
--   rr:<name>           the tokens of every call the provider refused
--   rf:<name>           the last refusalsKept calls it refused, as
--                       "place:cost,...", place being c just before the call
--
-- Short windows (BucketSettlement.BurstFactor, BucketLearning.PaceFactor):
--
--   bf:<name>, bt:<name>  the share of its burst window the bucket lets out
--                       at once, and when a 429 lowered it (burstDecrease;
--                       it comes back at burstRecovery)
--   pace_m:<name>, pace_mt:<name>  the pace's rate over the bucket's, and
--                       when it last changed (paceGrowth, paceMax, paceMin)
--   pace_hold:<name>    until when that factor stays at most 1 (paceHold)
--
-- The distrust of the provider's counts (ScopeLearning.Distrusted):
--
--   hd                  until when its counts never lower the buckets
--   hn, hnt             the unpredicted 429s counted, and since when
--                       (distrustAfter within distrustWindow)
--
-- The calibration (Calibration):
--
--   qa                  the last calibrationSamples prompt ratios, in the
--                       order they came, clamped to sampleBounds and kept to
--                       four decimals
--   qm, qn              their median, and how many there are
--   q, qs               the older form of qa: fixed-width records ('%07.4f',
--                       comma separated), in arrival order and sorted; read
--                       once, and dropped by the first run that writes
--
-- And:
--
--   l                   "1" once the scope learned anything: its hash then
--                       lives at least learnTTL
--
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
