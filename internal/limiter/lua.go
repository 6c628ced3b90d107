package limiter

import (
	"strconv"
	"strings"
	"time"
)

// lagDelay is how far back the total a bucket took is read for a
// reservation (lagLua): reservations made up to this long before a call may
// reach the provider after it, and Settle counts them as possibly missing
// from the provider's answer.
const lagDelay = 50 * time.Millisecond

// learnTTL is how long a scope's hash outlives its last use once it holds
// what the scope learned (drain, limit factor, calibration): a scope idle
// overnight starts the morning with what it knew.
const learnTTL = 24 * time.Hour

// providerLimitTTL is how long a lower limit a provider announced applies
// inside the bucket's scripts after its last answer saying so (the pacer's
// learned limits hold it longer, for every call it plans).
const providerLimitTTL = 10 * time.Minute

// drainBelief is how long after the provider's last answer the drain it
// showed is assumed to go on.
const drainBelief = 3 * time.Second

// factorRecovery is how fast a limit factor lowered by unpredicted 429s
// comes back, as a fraction of the limit per minute.
const factorRecovery = 0.05

// burstRecovery is how fast a burst lowered by 429s that showed a shorter
// window comes back, as a fraction of the burst window per minute.
const burstRecovery = 0.1

// stateLua reads and writes a scope's state (rkeys.LimiterScope). The state
// is a table of named values (the fields the scripts' comments list), kept
// in the one field m of the scope's hash as a MessagePack map (cmsgpack, a
// library of Redis's Lua): a run reads it and writes it once, and its numbers
// stay numbers, exact. A field per value cost a Lua string for each name and
// value read and a number formatted for each written: half of the reserve
// script's time in Redis (docs/BENCHMARKS.md, "The limiter's state in one
// field"). A hash of the older form, a field per value, is read as it is and
// rewritten in this form, its fields dropped, by the first run that writes.
//
// Where Redis has no cmsgpack (dev mode's embedded Redis, miniredis), the
// state is JSON (cjson), exact there too: that Redis encodes a number as Go
// does, in its shortest exact form. A Redis has one or the other, so a hash
// is never read in the form it was not written in.
//
// load_state returns the state and, for a hash of the older form, its
// fields; save_state writes st with the changes args (name, value pairs, see
// put) and del (names) made.
const stateLua = `
local msgpack = rawget(_G, 'cmsgpack')
local pack_state = msgpack and msgpack.pack or cjson.encode
local unpack_state = msgpack and msgpack.unpack or cjson.decode

local function load_state(key)
  local raw = redis.call('HGET', key, 'm')
  if raw then return unpack_state(raw), nil end
  local h = redis.call('HGETALL', key)
  local st, old = {}, {}
  for i = 1, #h, 2 do
    st[h[i]] = h[i + 1]
    old[#old + 1] = h[i]
  end
  return st, old
end

local function save_state(key, st, old, args, del)
  for i = 1, #args, 2 do st[args[i]] = args[i + 1] end
  for _, k in ipairs(del) do st[k] = nil end
  -- m first: a hash emptied by the HDEL would go, and its expiry with it
  redis.call('HSET', key, 'm', pack_state(st))
  if old and #old > 0 then redis.call('HDEL', key, unpack(old)) end
end
`

// bucketLua holds the functions the token bucket's scripts share. st is the
// scope's hash as a table; now and gen are the script's time and in-flight
// generation.
//
// What a bucket learned from the provider's answers (Settle) changes how it
// refills: x:<name> is the factor of its limit it may use after unpredicted
// 429s (regained at RECOVER per µs since xt:<name>), and e:<name> the part of
// its refill that others drain (another application on the account), so it
// refills at limit × factor × (1 - e) per period and holds at most limit ×
// factor.
const bucketLua = stateLua + `
local gen = math.floor(now / GEN)

-- put notes a change of the state, for save_state
local function put(args, k, v)
  args[#args + 1] = k
  args[#args + 1] = v
end

-- the bucket's in-flight amounts of generation g and g - 1, seen from
-- generation gen (older generations have lapsed): {g, f0, f1}
local function inflight_of(st, name)
  local g = tonumber(st['g:' .. name]) or gen
  local f0, f1 = tonumber(st['f0:' .. name]) or 0, tonumber(st['f1:' .. name]) or 0
  if gen == g + 1 then f0, f1 = 0, f0 elseif gen > g + 1 then f0, f1 = 0, 0 end
  return {math.max(g, gen), f0, f1}
end

-- a factor that 429s lowered to st[field] at st[since], regained at per_us
-- since, up to 1
local function regained(st, field, since, per_us)
  local v = tonumber(st[field])
  if not v then return 1 end
  local t = tonumber(st[since]) or now
  return math.min(1, v + math.max(now - t, 0) * per_us)
end

-- the share of its limit a bucket may use (x:<name>, at xt:<name>)
local function factor_of(st, name)
  return regained(st, 'x:' .. name, 'xt:' .. name, RECOVER)
end

-- the share of its burst window a bucket lets out at once, lowered by 429s
-- that showed a shorter window (bf:<name>, at bt:<name>)
local function burst_factor_of(st, name)
  return regained(st, 'bf:' .. name, 'bt:' .. name, BURST_RECOVER)
end

-- the bucket's limit: the one given, or a lower one the provider announced
-- (pl:<name>, at plt:<name>), which applies at once
local function limit_of(st, name, limit)
  local pl, plt = tonumber(st['pl:' .. name]), tonumber(st['plt:' .. name])
  if pl and plt and now - plt <= PL_TTL and pl < limit then return pl end
  return limit
end

-- the bucket now: u its level (refilled, never below what is in flight, see
-- inflightGen), d the level refilled without that floor, cap and rate (per
-- µs) as learned, f its in-flight generations, c all it ever took, burst
-- the most it lets out at once (its full refill over burst_window µs, times
-- what 429s taught; nil when burst_window is 0: no bound but its capacity)
-- and pace what it lets out now (see pace_of)
local function load_bucket(st, name, limit, period, burst_window)
  limit = limit_of(st, name, limit)
  local cap = limit * factor_of(st, name)
  local full = cap / period
  local rate = full * (1 - (tonumber(st['e:' .. name]) or 0))
  local u = tonumber(st['u:' .. name]) or 0
  local ts = tonumber(st['t:' .. name]) or now
  local f = inflight_of(st, name)
  local d = u
  if now > ts then
    -- others' drain is believed only near the answers that showed it:
    -- STALL after the last one the bucket refills at its full rate again,
    -- so an overestimated drain never stalls a scope nobody answers for
    local ls = tonumber(st['ls:' .. name])
    local cut = ls and math.max(ls + STALL, ts) or ts
    if rate == full or cut >= now then
      d = u - (now - ts) * rate
    else
      d = u - (cut - ts) * rate - (now - cut) * full
    end
    u = math.max(d, f[2] + f[3], 0)
  end
  local b = {u = u, d = d, cap = cap, rate = rate, f = f, c = tonumber(st['c:' .. name]) or 0, limit = limit}
  if burst_window and burst_window > 0 then
    b.burst = math.min(full * burst_window * burst_factor_of(st, name), cap)
    -- the pace: a second bucket of the burst's size, refilled as this one
    -- (pace:<name> what it held at pace_t:<name>), from which every call
    -- takes too, so what this one holds goes out at its rate, not at once.
    -- It starts full: the first calls go at once.
    local p, pt = tonumber(st['pace:' .. name]), tonumber(st['pace_t:' .. name])
    b.pace_rate = rate * (tonumber(st['pace_m:' .. name]) or 1)
    if not p then
      p = b.burst
    elseif pt and now > pt then
      p = p + (now - pt) * b.pace_rate
    end
    b.pace = math.min(p, b.burst)
  end
  return b
end

-- lagLua: what a bucket had taken at least LAG ago, for a reservation now:
-- the newest that old of the total after its latest run (cl) and two
-- checkpoints of it (k older, kn newer, at least LAG apart), or 0 in a
-- scope's first moments. A run that takes moves them (put_lag).
local lines = {}
local function lag_of(st, name)
  local line = {kn = tonumber(st['kn:' .. name]), knt = tonumber(st['knt:' .. name])}
  line.shift = not line.knt or now - line.knt >= LAG
  lines[name] = line
  for _, f in ipairs({'cl', 'kn', 'k'}) do
    local t = tonumber(st[f .. 't:' .. name])
    if t and now - t >= LAG then return tonumber(st[f .. ':' .. name]) or 0 end
  end
  return 0
end
local function put_lag(args, name, c)
  local l = lines[name]
  if not l then return end
  if l.shift then
    if l.knt then
      put(args, 'k:' .. name, l.kn)
      put(args, 'kt:' .. name, l.knt)
    end
    put(args, 'kn:' .. name, c)
    put(args, 'knt:' .. name, now)
  end
  put(args, 'cl:' .. name, c)
  put(args, 'clt:' .. name, now)
end

-- how long until a bucket at level u is full and holds nothing in flight
local function idle_after(u, rate, f)
  local ttl = u / rate
  if f[2] > 0 then ttl = math.max(ttl, (f[1] + 2) * GEN - now) elseif f[3] > 0 then ttl = math.max(ttl, (f[1] + 1) * GEN - now) end
  return ttl
end

-- extends the hash's expiry to ttl µs (plus a second), at least LEARN_TTL
-- once it holds what the scope learned, and never shortens it
local function extend_ttl(key, st, ttl)
  if st.l then ttl = math.max(ttl, LEARN_TTL) end
  ttl = math.ceil(ttl / 1000) + 1000
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
`

// withConstants puts the package's constants into a script.
func withConstants(src string) string {
	us := func(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return strings.NewReplacer(
		"GEN", us(inflightGen),
		"LAG", us(lagDelay),
		"LEARN_TTL", us(learnTTL),
		"BURST_RECOVER", f(burstRecovery/float64(time.Minute.Microseconds())),
		"RECOVER", f(factorRecovery/float64(time.Minute.Microseconds())),
		"COOLDOWN", us(factorCooldown),
		"PACE_MAX", f(paceMax),
		"PACE_MIN", f(paceMin),
		"PACE_SPARE", f(paceSpare),
		"PACE_STEP", us(paceStep),
		"PACE_GROW", f(paceGrowth/float64(time.Second.Microseconds())),
		"PACE_HOLD", us(paceHold),
		"BURST_DECREASE", f(burstDecrease),
		"BURST_MIN", f(burstMin),
		"SHORT_DECREASE", f(shortDecrease),
		"EST_MIN", us(estimateMin),
		"EST_SAFETY", f(estimateSafety),
		"DECREASE", f(factorDecrease),
		"FLOOR", f(factorFloor),
		"MIN_SPAN", us(drainMinSpan),
		"EMAX", f(drainMax),
		"BUSY", f(busyShare),
		"RHO_TAU", us(refundWindow),
		"DISTRUST_AFTER", strconv.Itoa(distrustAfter),
		"DISTRUST_FOR", us(distrustFor),
		"QSIZE", strconv.Itoa(calibrationSamples),
		"PL_TTL", us(providerLimitTTL),
		"STALL", us(drainBelief),
		"RF_KEEP", strconv.Itoa(refusalsKept),
		"MIN_SAMPLES", strconv.Itoa(minCalibrationSamples),
	).Replace(src)
}
