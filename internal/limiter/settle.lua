-- Settles a reservation once: what the call was charged, what the
-- provider's answer says of its buckets, what it teaches the scope (see
-- "What the limiter learns from the provider" in docs/ARCHITECTURE.md).
-- KEYS[1] -> the scope's hash (rkeys.LimiterScope), its state as lua.go lists
-- KEYS[2] -> the reservation's settled marker (rkeys.LimiterReconciled),
--   absent when the caller guarantees a single settle (a lease)
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2] -> how long the marker lives, in ms
-- ARGV[3] -> reservation id
-- ARGV[4] -> "1" when the reservation is the probe, else "0"
-- ARGV[5] -> probe timeout in µs
-- ARGV[6] -> the reservation's in-flight generation
-- ARGV[7] -> "r" to refund down to the charge (Reconcile), "s" to settle a
--   provider call (never refunds)
-- ARGV[8] -> the prompt ratio for the calibration, or ""
-- ARGV[9] -> "1" when the provider refused the call (a 429), else "0"
-- ARGV[10+13(i-1)] .. ARGV[22+13(i-1)] -> bucket i: name, limit, period in
--   µs, burst window in µs (0: none), reserved, charged, unused, taken a
--   moment before the reservation (its lag) and just before it (its
--   place), the provider's limit and remaining (or ""), and what a 429
--   showed of it: "" nothing, "r" its rate ahead of the provider's, "s" a
--   shorter window than its period ("sb" one that frees in a block, as a
--   fixed window does), "rs" either; then "1" when the bucket settles to
--   the charge in both directions (input or output tokens, counted apart),
--   else "0"
-- Returns {1, calibration in millionths, its samples, then per bucket: the
-- level as counted, the level after following the provider, the
-- provider's bound (-1 when none), drain, factor and burst factor in
-- millionths}, or {0} when the reservation was settled before.
--
-- Redis keeps what a script wrote before a runtime error, so the script
-- reads and computes everything first, and writes the marker last: a
-- failed run leaves no marker, and its retry applies.
local marker = KEYS[2]
if marker and redis.call('EXISTS', marker) == 1 then return {0} end
local key = KEYS[1]
local id, is_probe, probe_timeout = ARGV[3], ARGV[4] == '1', tonumber(ARGV[5])
local reservation_gen = tonumber(ARGV[6])
local refund = ARGV[7] == 'r'
local sample = tonumber(ARGV[8])
local refused = ARGV[9] == '1'
local bucket_count = (#ARGV - 9) / 13

local st, old_fields = load_state(key)
local penalty_until, probe_id, probe_deadline = tonumber(st.pu), st.pid, tonumber(st.pt)
-- while distrusted, the provider's counts never lower the buckets
local distrusted_until = tonumber(st.hd)
local distrust = distrusted_until and distrusted_until > now

local changes, out, ttl = {}, {1, 0, 0}, 0
-- learned: the scope learned something (st.l); unpredicted_429: a 429 the
-- buckets did not predict lowered a factor
local learned, unpredicted_429 = false, false

-- The calibration: the median of the last CALIBRATION_SAMPLES prompt
-- ratios, clamped and kept to four decimals, in the order they came.
local median, sample_count = tonumber(st.qm), tonumber(st.qn) or 0
local recalibrated = false
if sample then
  local was = sample_count >= MIN_CALIBRATION_SAMPLES and median or 1
  local samples = st.qa or {}
  local clamped = math.min(math.max(sample, SAMPLE_MIN), SAMPLE_MAX)
  samples[#samples + 1] = tonumber(string.format('%.4f', clamped))
  while #samples > CALIBRATION_SAMPLES do table.remove(samples, 1) end
  local sorted = {}
  for i, v in ipairs(samples) do sorted[i] = v end
  table.sort(sorted)
  sample_count = #sorted
  if sample_count % 2 == 1 then
    median = sorted[(sample_count + 1) / 2]
  else
    median = (sorted[sample_count / 2] + sorted[sample_count / 2 + 1]) / 2
  end
  local is = sample_count >= MIN_CALIBRATION_SAMPLES and median or 1
  recalibrated = math.abs(is / was - 1) > RECALIBRATION
  put(changes, 'qa', samples)
  put(changes, 'qm', median)
  put(changes, 'qn', sample_count)
  learned = true
end

for i = 1, bucket_count do
  local at = 9 + 13 * (i - 1)
  local name, limit, period, burst_window = ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local reserved, charged, unused = tonumber(ARGV[at + 5]), tonumber(ARGV[at + 6]), tonumber(ARGV[at + 7])
  -- lag: what the bucket had taken a moment before the reservation; place:
  -- just before it
  local lag, place = tonumber(ARGV[at + 8]), tonumber(ARGV[at + 9])
  -- both set when the provider reported on this bucket
  local provider_limit, provider_remaining = tonumber(ARGV[at + 10]), tonumber(ARGV[at + 11])
  local reported = provider_limit and provider_remaining
  local evidence = ARGV[at + 12]
  -- this bucket gives back what the call did not cost
  local refunds = refund or ARGV[at + 13] == '1'
  local rate_evidence = string.find(evidence, 'r', 1, true) ~= nil
  local short_window = string.find(evidence, 's', 1, true) ~= nil and burst_window > 0
  local block_window = string.find(evidence, 'b', 1, true) ~= nil
  -- the pace's rate goes below the bucket's (see the pace, below)
  local slow_pace = false

  -- A 429 that showed a shorter window than the limit's lowers the
  -- bucket's burst, once per cooldown (the 429s of calls admitted together
  -- are one piece of evidence): from 1 to BURST_DECREASE. Once it is below
  -- BURST_MIN, a short burst did not help: the window counts the pace
  -- itself (a fixed window takes what crosses its edge), and the pace goes
  -- a little below the rate instead. So it does at once when the
  -- provider's wait showed a window that frees in a block ("b").
  if short_window then
    local lowered_at = tonumber(st['bt:' .. name])
    if not lowered_at or now - lowered_at >= FACTOR_COOLDOWN then
      local burst_factor = burst_factor_of(st, name)
      slow_pace = block_window or burst_factor < BURST_MIN
      if burst_factor >= BURST_MIN then
        burst_factor = burst_factor * BURST_DECREASE
        st['bf:' .. name], st['bt:' .. name] = burst_factor, now
        put(changes, 'bf:' .. name, burst_factor)
        put(changes, 'bt:' .. name, now)
        learned = true
      end
    end
  end

  -- the refused calls' tokens, all told, for the rate estimate
  local refused_total = tonumber(st['rr:' .. name]) or 0
  if refused then
    refused_total = refused_total + reserved
    put(changes, 'rr:' .. name, refused_total)
  end

  -- An unpredicted 429 lowers the bucket's limit factor, once per
  -- cooldown: to FACTOR_DECREASE times what it was or, when the previous
  -- one came within the bucket's period, to what the bucket let through
  -- between the two, if less. The provider had no room at either, and its
  -- bucket, which holds a period's refill, could not fill up in between,
  -- so what it admitted meanwhile was its refill (less what others took).
  if rate_evidence then
    local lowered_at = tonumber(st['xt:' .. name])
    if not lowered_at or now - lowered_at >= FACTOR_COOLDOWN then
      unpredicted_429 = true
      local lowered = factor_of(st, name) * FACTOR_DECREASE
      local last_at, last_taken, last_refused = tonumber(st['zt:' .. name]), tonumber(st['zc:' .. name]), tonumber(st['zr:' .. name])
      local taken = tonumber(st['c:' .. name]) or 0
      if last_at and last_taken and last_refused and now - last_at >= ESTIMATE_MIN and now - last_at <= period then
        local let_through = (taken - last_taken) - (refused_total - last_refused)
        local share = let_through / (now - last_at) * period / limit
        lowered = math.min(lowered, share * ESTIMATE_SAFETY)
      end
      local factor = math.max(lowered, FACTOR_FLOOR)
      st['x:' .. name], st['xt:' .. name] = factor, now
      put(changes, 'x:' .. name, factor)
      put(changes, 'xt:' .. name, now)
      put(changes, 'zt:' .. name, now)
      put(changes, 'zc:' .. name, taken)
      put(changes, 'zr:' .. name, refused_total)
      learned = true
    end
  end

  -- A lower limit the provider announces applies to this run at once; the
  -- pacer keeps it for the next ones (its learned limits).
  local b = load_bucket(st, name, reported and math.min(provider_limit, limit) or limit, period, burst_window)
  local level, inflight, taken = b.level, b.inflight, b.taken
  -- the reservation is no longer in flight
  if reservation_gen == inflight.gen then
    inflight.current = math.max(inflight.current - reserved, 0)
  elseif reservation_gen == inflight.gen - 1 then
    inflight.previous = math.max(inflight.previous - reserved, 0)
  end
  local held = inflight.current + inflight.previous
  -- what the call cost beyond its reservation (less, when negative)
  local beyond = charged - reserved
  if refunds then
    -- a refund never brings the level below what other calls hold in
    -- flight (see inflightGen)
    level = math.max(level + beyond, held, 0)
  elseif beyond > 0 then
    level = level + beyond
  end
  if beyond > 0 then taken = taken + beyond end
  -- model: the level as this bucket counts; bound: the most the provider
  -- can have used by now (-1: it did not say)
  local model, bound = level, -1

  -- The calls the provider refused, by their place in the total taken,
  -- among the last few: it never charged them.
  local refusals = {}
  for at_place, cost in string.gmatch(st['rf:' .. name] or '', '([^:,]+):([^,]+)') do
    refusals[#refusals + 1] = {place = tonumber(at_place), cost = tonumber(cost)}
  end
  if reported then
    if refused then
      -- what the provider says it holds includes no charge for this call
      level = math.max(level - reserved, held, 0)
      model = level
      refusals[#refusals + 1] = {place = place, cost = reserved}
    end
    -- The provider had used at most cap - remaining when it answered, and
    -- since then at most what was taken here from a moment before this
    -- call on (calls sent just before it may have reached it after it),
    -- less the calls it refused.
    local since = taken - lag
    for _, refusal in ipairs(refusals) do
      if refusal.place >= lag then since = since - refusal.cost end
    end
    bound = (b.cap - provider_remaining) + math.max(since, 0)
    local fresh = lag >= (tonumber(st['s:' .. name]) or -1)
    -- Only a bucket that mirrors the provider's (the same limit) follows it
    -- down: one set below the provider's keeps its own count, or the
    -- provider's larger room would take it past its limit.
    local mirror = math.abs(provider_limit - b.limit) <= b.limit / 100
    if distrust or not mirror then
      level = math.max(level, bound)
    elseif fresh then
      level = math.max(bound, held, 0)
      put(changes, 's:' .. name, lag)
    else
      -- an older answer than one followed already only ever lowers
      level = math.min(level, math.max(bound, held, 0))
    end
    put(changes, 'pr:' .. name, provider_remaining)
    put(changes, 'prt:' .. name, now)

    -- While the provider's bucket is busy, the corrections its answers
    -- make to this bucket's own count (plus the drain it already assumed)
    -- sum to what others take from the account, less what the provider
    -- refunds: the answers' own lags cancel out over time. The drain is
    -- that sum's rate, when positive. The refund estimate sets it against
    -- the tokens calls left unused.
    local unused_since = (tonumber(st['wa:' .. name]) or 0) + unused
    local last_answer = tonumber(st['ls:' .. name])
    -- A change of the limit or of the calibration makes the corrections
    -- before it say nothing about others: the sums start again.
    if tonumber(st['lim:' .. name]) ~= limit or recalibrated then
      last_answer = nil
      put(changes, 'lim:' .. name, limit)
      for _, sum in ipairs({'n:', 'tw:', 'w:', 'e:'}) do
        st[sum .. name] = nil
        put(changes, sum .. name, 0)
      end
    end
    -- The sums run over consecutive answers of a busy bucket only: an
    -- idle one is full on both sides and its corrections say nothing. An
    -- answer whose call had no lag yet, in a scope's first moments, counts
    -- everything taken so far as since: it starts no chain.
    local busy = provider_remaining < BUSY_SHARE * provider_limit and lag > 0
    if busy and not distrust and last_answer and st['lb:' .. name] == '1' then
      local dt = now - last_answer
      -- the sums forget at REFUND_WINDOW
      local decay = math.exp(-dt / REFUND_WINDOW)
      local drain = tonumber(st['e:' .. name]) or 0
      local corrections = (tonumber(st['n:' .. name]) or 0) * decay + (level - model) + drain * b.cap * dt / period
      local span = (tonumber(st['tw:' .. name]) or 0) * decay + dt
      if span >= DRAIN_MIN_SPAN then
        st['e:' .. name] = math.min(math.max(corrections / span * period / b.cap, 0), DRAIN_MAX)
        put(changes, 'e:' .. name, st['e:' .. name])
      end
      put(changes, 'n:' .. name, corrections)
      put(changes, 'tw:' .. name, span)
      put(changes, 'w:' .. name, (tonumber(st['w:' .. name]) or 0) * decay + unused_since)
      unused_since = 0
      learned = true
    end
    put(changes, 'ls:' .. name, now)
    put(changes, 'lb:' .. name, busy and not distrust and '1' or '0')
    put(changes, 'wa:' .. name, unused_since)
  end

  if refused and reported then
    local kept = {}
    for j = math.max(#refusals - REFUSALS_KEPT + 1, 1), #refusals do
      kept[#kept + 1] = string.format('%d:%d', refusals[j].place, refusals[j].cost)
    end
    put(changes, 'rf:' .. name, table.concat(kept, ','))
  end
  put(changes, 'u:' .. name, level)
  put(changes, 't:' .. name, now)
  put(changes, 'g:' .. name, inflight.gen)
  put(changes, 'f0:' .. name, inflight.current)
  put(changes, 'f1:' .. name, inflight.previous)
  put(changes, 'c:' .. name, taken)

  -- The pace gets back what a call did not cost (a refund, a release) and
  -- gives what the provider charged beyond the reservation. A 429 the
  -- buckets did not predict empties it: the provider's window is empty
  -- now, whatever the pace held. Its rate goes back to the bucket's for
  -- PACE_HOLD, or SHORT_DECREASE below it (at least PACE_MIN of it) when
  -- the burst is one call already. While the provider's counts show
  -- PACE_SPARE of its bucket free and no hold is on, it has more room than
  -- the pace lets out (it refunds, or nobody else draws on it): the pace's
  -- rate grows, up to PACE_MAX times the bucket's.
  if b.pace then
    local pace = b.pace
    if refunds or beyond > 0 then pace = pace - beyond end
    if rate_evidence or short_window then pace = math.min(pace, 0) end
    put(changes, 'pace:' .. name, math.min(pace, b.burst))
    put(changes, 'pace_t:' .. name, now)
    local pace_factor, pace_factor_at = tonumber(st['pace_m:' .. name]) or 1, tonumber(st['pace_mt:' .. name]) or now
    local hold_until = tonumber(st['pace_hold:' .. name]) or 0
    if rate_evidence or short_window then
      pace_factor, hold_until = math.min(pace_factor, 1), now + PACE_HOLD
      if slow_pace then pace_factor = math.max(pace_factor * SHORT_DECREASE, PACE_MIN) end
      put(changes, 'pace_hold:' .. name, hold_until)
    elseif reported and provider_remaining >= PACE_SPARE * provider_limit and not refused and hold_until <= now then
      pace_factor = math.min(pace_factor + math.min(now - pace_factor_at, PACE_STEP) * PACE_GROWTH, PACE_MAX)
    end
    put(changes, 'pace_m:' .. name, pace_factor)
    put(changes, 'pace_mt:' .. name, now)
  end
  ttl = math.max(ttl, idle_after(level, b.rate, inflight))
  local k = #out
  out[k + 1], out[k + 2], out[k + 3] = math.floor(model), math.floor(level), math.floor(bound)
  out[k + 4] = math.floor((tonumber(st['e:' .. name]) or 0) * 1e6)
  out[k + 5] = math.floor(factor_of(st, name) * 1e6)
  out[k + 6] = math.floor(burst_factor_of(st, name) * 1e6)
end

-- Repeated unpredicted 429s (DISTRUST_AFTER, counted in windows of
-- DISTRUST_WINDOW from the first): the provider's counts stop lowering the
-- buckets for DISTRUST_FOR.
if unpredicted_429 then
  local count, counted_from = tonumber(st.hn) or 0, tonumber(st.hnt)
  if not counted_from or now - counted_from > DISTRUST_WINDOW then count, counted_from = 0, now end
  count = count + 1
  if count >= DISTRUST_AFTER then
    put(changes, 'hd', now + DISTRUST_FOR)
    count, counted_from = 0, now
  end
  put(changes, 'hn', count)
  put(changes, 'hnt', counted_from)
  learned = true
end

out[2], out[3] = math.floor((median or 1) * 1e6), sample_count

-- the probe's settle ends the probe phase, and a penalty that is over
local dropped = {}
if is_probe and probe_id == id then
  dropped, probe_deadline = {'pid', 'pt'}, nil
  if penalty_until and penalty_until <= now then
    dropped[3], penalty_until = 'pu', nil
  end
end
if penalty_until then ttl = math.max(ttl, math.max(penalty_until - now, 0) + probe_timeout) end
if probe_deadline then ttl = math.max(ttl, probe_deadline - now + probe_timeout) end
if learned then
  put(changes, 'l', '1')
  st.l = '1'
end

if #changes > 0 or #dropped > 0 then save_state(key, st, old_fields, changes, dropped) end
extend_ttl(key, st, ttl)
if marker then redis.call('SET', marker, '1', 'PX', ARGV[2]) end
return out
