-- The functions the token bucket's scripts share (reserve.lua, settle.lua,
-- inspect.lua). They run after the constants, the clock and state.lua: st
-- is the scope's state (its fields are listed in lua.go) and now the
-- script's time.
--
-- What a bucket learned from the provider's answers (settle.lua) changes
-- how it refills: x:<name> is the factor of its limit it may use after
-- unpredicted 429s, and e:<name> the share of its refill that others drain
-- (another application on the account). So it refills at
-- limit × factor × (1 - drain) per period and holds at most limit × factor.

-- the in-flight generation of now (see inflightGen)
local gen = math.floor(now / INFLIGHT_GEN)

-- The bucket's amounts in flight: reserved and not yet reconciled in its
-- generation (current) and the one before (previous), seen from now.
-- Older generations have lapsed.
local function inflight_of(st, name)
  local g = tonumber(st['g:' .. name]) or gen
  local current, previous = tonumber(st['f0:' .. name]) or 0, tonumber(st['f1:' .. name]) or 0
  if gen == g + 1 then
    current, previous = 0, current
  elseif gen > g + 1 then
    current, previous = 0, 0
  end
  return {gen = math.max(g, gen), current = current, previous = previous}
end

-- A factor that 429s lowered to st[factor_field] at st[since_field] comes
-- back at per_us a µs, up to 1.
local function regained(st, factor_field, since_field, per_us)
  local factor = tonumber(st[factor_field])
  if not factor then return 1 end
  local since = tonumber(st[since_field]) or now
  return math.min(1, factor + math.max(now - since, 0) * per_us)
end

-- the share of its limit a bucket may use
local function factor_of(st, name)
  return regained(st, 'x:' .. name, 'xt:' .. name, FACTOR_RECOVERY)
end

-- the share of its burst window a bucket lets out at once, lowered by 429s
-- that showed a shorter window
local function burst_factor_of(st, name)
  return regained(st, 'bf:' .. name, 'bt:' .. name, BURST_RECOVERY)
end

-- The bucket now, as a table:
--   level      what it holds used: refilled, never below what is in flight
--   base       the level refilled without that floor, which a run that
--              takes from the bucket writes
--   cap, rate  its capacity and its refill per µs, as learned
--   limit      its limit
--   inflight   its amounts in flight (inflight_of)
--   taken      all it ever took
--   burst      the most it lets out at once: its full refill over
--              burst_window µs, times what 429s taught; nil when
--              burst_window is 0 (no bound but its capacity)
--   pace       what its pace lets out now, and pace_rate how fast the pace
--              refills (nil without a burst)
local function load_bucket(st, name, limit, period, burst_window)
  local cap = limit * factor_of(st, name)
  local full_rate = cap / period
  local rate = full_rate * (1 - (tonumber(st['e:' .. name]) or 0))
  local level = tonumber(st['u:' .. name]) or 0
  local counted_at = tonumber(st['t:' .. name]) or now
  local inflight = inflight_of(st, name)
  local base = level
  if now > counted_at then
    -- Others' drain is believed only near the answers that showed it:
    -- DRAIN_BELIEF after the last one the bucket refills at its full rate
    -- again, so an overestimated drain never stalls a scope nobody
    -- answers for.
    local last_answer = tonumber(st['ls:' .. name])
    local drain_until = last_answer and math.max(last_answer + DRAIN_BELIEF, counted_at) or counted_at
    if rate == full_rate or drain_until >= now then
      base = level - (now - counted_at) * rate
    else
      base = level - (drain_until - counted_at) * rate - (now - drain_until) * full_rate
    end
    level = math.max(base, inflight.current + inflight.previous, 0)
  end
  local b = {level = level, base = base, cap = cap, rate = rate, limit = limit, inflight = inflight,
    taken = tonumber(st['c:' .. name]) or 0}
  if burst_window and burst_window > 0 then
    b.burst = math.min(full_rate * burst_window * burst_factor_of(st, name), cap)
    -- The pace is a second bucket of the burst's size, refilled as this
    -- one, from which every call takes too: what this one holds goes out
    -- at its rate, not at once. It starts full: the first calls go at once.
    local pace, pace_at = tonumber(st['pace:' .. name]), tonumber(st['pace_t:' .. name])
    b.pace_rate = rate * (tonumber(st['pace_m:' .. name]) or 1)
    if not pace then
      pace = b.burst
    elseif pace_at and now > pace_at then
      pace = pace + (now - pace_at) * b.pace_rate
    end
    b.pace = math.min(pace, b.burst)
  end
  return b
end

-- What a bucket had taken at least LAG_DELAY ago, for a reservation now
-- (see lagDelay): the newest that old of three records of its total taken,
-- or 0 in a scope's first moments. The records are the total after its
-- latest run (cl:<name>) and two checkpoints at least LAG_DELAY apart
-- (kn:<name> the newer, k:<name> the older). A run that takes moves them
-- (put_lag).
local checkpoints = {}
local function lag_of(st, name)
  local newer, newer_at = tonumber(st['kn:' .. name]), tonumber(st['knt:' .. name])
  -- a newer checkpoint LAG_DELAY old becomes the older one
  checkpoints[name] = {newer = newer, newer_at = newer_at, shift = not newer_at or now - newer_at >= LAG_DELAY}
  for _, record in ipairs({'cl', 'kn', 'k'}) do
    local at = tonumber(st[record .. 't:' .. name])
    if at and now - at >= LAG_DELAY then return tonumber(st[record .. ':' .. name]) or 0 end
  end
  return 0
end
local function put_lag(changes, name, taken)
  local mark = checkpoints[name]
  if not mark then return end
  if mark.shift then
    if mark.newer_at then
      put(changes, 'k:' .. name, mark.newer)
      put(changes, 'kt:' .. name, mark.newer_at)
    end
    put(changes, 'kn:' .. name, taken)
    put(changes, 'knt:' .. name, now)
  end
  put(changes, 'cl:' .. name, taken)
  put(changes, 'clt:' .. name, now)
end

-- How long until a bucket at this level is full and holds nothing in
-- flight: what is in flight lapses when its generation and the next are
-- over.
local function idle_after(level, rate, inflight)
  local ttl = level / rate
  if inflight.current > 0 then
    ttl = math.max(ttl, (inflight.gen + 2) * INFLIGHT_GEN - now)
  elseif inflight.previous > 0 then
    ttl = math.max(ttl, (inflight.gen + 1) * INFLIGHT_GEN - now)
  end
  return ttl
end

-- Extends the hash's expiry to ttl µs (plus a second), and never shortens
-- it. Once the scope learned anything it lives at least LEARN_TTL, so that
-- a scope idle overnight starts the morning with what it knew.
local function extend_ttl(key, st, ttl)
  if st.l then ttl = math.max(ttl, LEARN_TTL) end
  local ttl_ms = math.ceil(ttl / 1000) + 1000
  if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
end
