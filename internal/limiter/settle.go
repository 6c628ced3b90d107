package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// What Settle learns, and how fast (docs/ARCHITECTURE.md, "What the limiter
// learns from the provider").
const (
	// factorDecrease multiplies a bucket's limit factor on an unpredicted
	// 429, at most once per factorCooldown, down to factorFloor.
	factorDecrease = 0.85
	factorCooldown = 5 * time.Second
	factorFloor    = 0.1
	// drainMinSpan is how long the provider's bucket must have been seen
	// busy before a drain is assumed.
	drainMinSpan = 15 * time.Second
	// drainMax bounds the share of the refill others may be thought to take.
	drainMax = 0.9
	// busyShare: the provider's bucket is busy (its counts say something
	// about the others' use) while less than this share of it is free.
	busyShare = 0.5
	// refundWindow is the memory of the drain and refund estimates.
	refundWindow = 2 * time.Minute
	// distrustAfter unpredicted 429s within a minute stop the
	// provider's counts from lowering the buckets for distrustFor.
	distrustAfter = 3
	distrustFor   = 10 * time.Minute
	// calibrationSamples is how many prompt ratios the calibration keeps.
	calibrationSamples = 31
	// refusalsKept is how many refused calls a bucket remembers, so the
	// provider's answers are not read as if it had charged them.
	refusalsKept = 64
	// burstDecrease multiplies a bucket's burst on a 429 that showed a
	// shorter window; shortDecrease multiplies its pace's rate instead when
	// the burst is below burstMin of its window already.
	burstDecrease = 0.25
	burstMin      = 0.5
	shortDecrease = 0.95
	// Two unpredicted 429s at least estimateMin and at most the bucket's
	// period apart bound the provider's rate by what was let through
	// between them (it had no room at either), taken at estimateSafety of
	// it.
	estimateMin    = 2 * time.Second
	estimateSafety = 0.95
	// A bucket's pace lets its refill out at paceMax times its rate at
	// most, and paceMin at least: it grows by paceGrowth of the rate a second (counted over at
	// most paceStep between answers) while the provider's counts show at
	// least paceSpare of its bucket free, and goes back to the rate, for
	// paceHold, after a 429 the buckets did not predict.
	paceMax    = 2.0
	paceMin    = 0.5
	paceSpare  = 0.5
	paceStep   = time.Second
	paceGrowth = 0.01
	paceHold   = 10 * time.Minute
)

// Feedback is what a provider's answer says about one call, for Settle.
type Feedback struct {
	// Charged is what the provider most likely charged the call: its own
	// count of the prompt plus max_tokens, as OpenAI counts at admission.
	// What it charged beyond the reservation is taken too; what it charged
	// less is not given back (a provider that refunds shows it in its
	// counts). Zero fields mean the reservation's.
	Charged Cost
	// Unused is the part of max_tokens the call left unused: what a
	// provider that refunds gives back, for the refund estimate.
	Unused Cost
	// Observed are the provider's own views of some of the scope's buckets,
	// from its x-ratelimit-* headers.
	Observed []Observed
	// Evidence names the buckets a 429 showed to be ahead of the
	// provider's: it refused a call they admitted while its counts showed
	// them without room (or it sent no counts).
	Evidence []string
	// ShortWindow names the buckets a 429 showed to be counted by the
	// provider over a shorter window than their period: it refused a call
	// they admitted while its counts showed room for it. Their burst is
	// lowered (see Bucket.Burst).
	ShortWindow []string
	// BlockWindow names those of ShortWindow whose window the provider's
	// wait showed to free in a block (a fixed window: the wait is longer
	// than the call's cost takes to refill): their pace is lowered too,
	// since the calls crossing the window's edge count in it together.
	BlockWindow []string
	// PromptRatio is the provider's count of the prompt over llmq's
	// estimate, for the calibration; 0 when unknown.
	PromptRatio float64
	// Refused is set when the provider refused the call (a 429): it
	// charged nothing. Buckets it reported on then give the call back
	// before following its view; the others keep it, since the 429 shows
	// them ahead of the provider.
	Refused bool
}

// Observed is the provider's view of one bucket when it answered.
type Observed struct {
	// Bucket is the scope's bucket it concerns ("rpm", "tpm").
	Bucket string
	// Remaining is what the provider said it still held.
	Remaining int64
	// Limit is the provider's limit for the bucket; 0 when it did not say.
	Limit int64
}

// Settlement is what a Settle applied and what the scope has learned.
type Settlement struct {
	// Applied is false when the reservation was settled before.
	Applied bool
	// Calibration is the scope's prompt-token correction after this call.
	Calibration Calibration
	// Buckets has one entry per bucket of the reservation's scope.
	Buckets []BucketSettlement
}

// BucketSettlement is one bucket after a Settle.
type BucketSettlement struct {
	Name string
	// Model is the level the bucket's own counting gave, Level the level
	// it holds after following the provider's view (tokens used).
	Model, Level int64
	// ProviderBound is the most the provider can have used by now, from
	// its answer; -1 when it said nothing about this bucket.
	ProviderBound int64
	// Drain is the share of the refill others take; Factor the share of
	// the limit the bucket may use after unpredicted 429s; BurstFactor the
	// share of its burst it lets out at once after 429s that showed a
	// shorter window.
	Drain, Factor, BurstFactor float64
}

// Calibration is a scope's correction of llmq's prompt-token estimates: the
// median of the provider's counts over llmq's in its last calls.
type Calibration struct {
	// Factor multiplies prompt estimates; 1 until enough calls were seen.
	Factor float64
	// Samples is how many calls the median is of.
	Samples int
}

// Apply returns a prompt estimate corrected by c, rounded up.
func (c Calibration) Apply(promptTokens int64) int64 {
	if c.Factor == 1 || c.Factor <= 0 {
		return promptTokens
	}
	return int64(math.Ceil(float64(promptTokens) * c.Factor))
}

// minCalibrationSamples is how many calls a correction needs before it
// applies; calibrationBounds the correction applied.
const minCalibrationSamples = 3

var calibrationBounds = [2]float64{0.25, 4}

func calibration(micros, n int64) Calibration {
	c := Calibration{Factor: 1, Samples: int(n)}
	if n >= minCalibrationSamples && micros > 0 {
		c.Factor = min(max(float64(micros)/1e6, calibrationBounds[0]), calibrationBounds[1])
	}
	return c
}

// settleScript settles a reservation once: what the call was charged, what
// the provider's answer says of its buckets, what it teaches the scope.
//
// KEYS[1] -> the scope's hash (rkeys.LimiterScope; its state as reserveScript's,
// plus s:<name> the lag of the freshest answer followed, pr:<name> and
// prt:<name> the provider's last remaining count and when, ls:<name>,
// wa:<name>, n:<name>, tw:<name> and w:<name> the drain and refund sums,
// rf:<name> the last calls the provider refused (place:cost,...), hd and hn
// the distrust of the provider's counts, q, qs, qm and qn the calibration
// (the samples in arrival order and sorted, their median and count), l set
// once it learned anything)
// KEYS[2] -> the reservation's settled marker (rkeys.LimiterReconciled),
// absent when the caller guarantees a single settle (a lease)
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> how long the marker lives, in ms
// ARGV[3] -> reservation id
// ARGV[4] -> "1" when the reservation is the probe, else "0"
// ARGV[5] -> probe timeout in µs
// ARGV[6] -> the reservation's in-flight generation
// ARGV[7] -> "r" to refund down to the charge (Reconcile), "s" to settle a
// provider call (never refunds)
// ARGV[8] -> the prompt ratio for the calibration, or ""
// ARGV[9] -> "1" when the provider refused the call (a 429), else "0"
// ARGV[10+12(i-1)] .. ARGV[21+12(i-1)] -> bucket i: name, limit, period in µs,
// burst window in µs (0: none), reserved, charged, unused, taken a moment
// before the reservation (its lag) and just before it (its place), the
// provider's limit and remaining (or ""), and what a 429 showed of it: ""
// nothing, "r" its rate ahead of the provider's, "s" a shorter window than
// its period ("sb" one that frees in a block, as a fixed window does),
// "rs" either
// Returns {1, calibration in millionths, its samples, then per bucket: the
// level as counted, the level after following the provider, the provider's
// bound (-1 when none), drain, factor and burst factor in millionths}, or
// {0} when the reservation was settled before.
//
// Redis keeps what a script wrote before a runtime error, so the script
// reads and computes everything first, and writes the marker last: a failed
// run leaves no marker, and its retry applies.
var settleScript = redis.NewScript(withConstants(redisclock.Lua + bucketLua + `
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then return {0} end
local key = KEYS[1]
local probe_timeout = tonumber(ARGV[5])
local rgen = tonumber(ARGV[6])
local refund = ARGV[7] == 'r'
local sample = tonumber(ARGV[8])
local refused = ARGV[9] == '1'
local nb = (#ARGV - 9) / 12

local st, old = load_state(key)
local pu, pid, pt = tonumber(st.pu), st.pid, tonumber(st.pt)
local hd = tonumber(st.hd)
local distrust = hd and hd > now

local args, out, ttl, learned, evidence = {}, {1, 0, 0}, 0, false, false

-- the calibration: the median of the last prompt ratios. They are kept as
-- records of one width, whose order as strings is their order as numbers:
-- q in the order they came, qs sorted, so that a sample moves two records
-- instead of sorting them all.
local qm, qn = tonumber(st.qm), tonumber(st.qn) or 0
local recalibrated = false
if sample then
  local was = qn >= MIN_SAMPLES and qm or 1
  local q, qs = st.q or '', st.qs
  -- q written again in records of one width, and qs sorted from it: for a
  -- hash written before qs existed, or by a process that still writes q
  -- alone (q and qs then differ in length)
  local function rewrite()
    local vs = {}
    for v in string.gmatch(q, '[^,]+') do vs[#vs + 1] = string.format('%07.4f', tonumber(v)) end
    q = table.concat(vs, ',')
    table.sort(vs)
    qs = table.concat(vs, ',')
  end
  if not qs or #qs ~= #q then rewrite() end
  local function count(s) if s == '' then return 0 end return (#s + 1) / 8 end
  local function rec(s, j) return string.sub(s, 8 * j - 7, 8 * j - 1) end
  local r = string.format('%07.4f', math.min(math.max(sample, 0.1), 10))
  if q == '' then q = r else q = q .. ',' .. r end
  if count(q) > QSIZE then
    -- the oldest goes; a record found in qs is a whole one, since every
    -- stretch of its width across two holds a comma
    local old = string.sub(q, 1, 7)
    q = string.sub(q, 9)
    local p = string.find(qs, old, 1, true)
    if not p then
      rewrite()
    elseif p == 1 then
      qs = string.sub(qs, 9)
    else
      qs = string.sub(qs, 1, p - 2) .. string.sub(qs, p + 7)
    end
  end
  -- the new one goes before the first record above it
  local m = count(qs)
  local lo, hi = 1, m + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if rec(qs, mid) > r then hi = mid else lo = mid + 1 end
  end
  if m == 0 then
    qs = r
  elseif lo > m then
    qs = qs .. ',' .. r
  else
    qs = string.sub(qs, 1, 8 * lo - 8) .. r .. ',' .. string.sub(qs, 8 * lo - 7)
  end
  qn = m + 1
  if qn % 2 == 1 then qm = tonumber(rec(qs, (qn + 1) / 2)) else qm = (tonumber(rec(qs, qn / 2)) + tonumber(rec(qs, qn / 2 + 1))) / 2 end
  local is = qn >= MIN_SAMPLES and qm or 1
  recalibrated = math.abs(is / was - 1) > 0.05
  put(args, 'q', q)
  put(args, 'qs', qs)
  put(args, 'qm', qm)
  put(args, 'qn', qn)
  learned = true
end
for i = 1, nb do
  local a = 9 + 12 * (i - 1)
  local name, limit, period, bw = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local reserved, charged, unused, clag, cpos = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9])
  local olimit, oremain = tonumber(ARGV[a + 10]), tonumber(ARGV[a + 11])
  local ev = ARGV[a + 12]
  local rate_ev, short_ev = string.find(ev, 'r', 1, true) ~= nil, string.find(ev, 's', 1, true) ~= nil and bw > 0
  local block = string.find(ev, 'b', 1, true) ~= nil
  local slow = false

  -- A 429 that showed a shorter window than the limit's lowers the
  -- bucket's burst, once per cooldown (the 429s of calls admitted together
  -- are one piece of evidence): from 1 to BURST_DECREASE. Once it is below
  -- BURST_MIN, a short burst did not help: the window counts the pace
  -- itself (a fixed window takes what crosses its edge), and the pace goes
  -- a little below the rate instead (see below); so it does at once when
  -- the provider's wait showed a window that frees in a block ("b").
  if short_ev then
    local bt = tonumber(st['bt:' .. name])
    if not bt or now - bt >= COOLDOWN then
      local bf = burst_factor_of(st, name)
      slow = block or bf < BURST_MIN
      if bf >= BURST_MIN then
        bf = bf * BURST_DECREASE
        st['bf:' .. name], st['bt:' .. name] = bf, now
        put(args, 'bf:' .. name, bf)
        put(args, 'bt:' .. name, now)
        learned = true
      end
    end
  end

  -- a refused call's tokens, all told (rr:<name>), for the rate estimate
  local rr = tonumber(st['rr:' .. name]) or 0
  if refused then
    rr = rr + reserved
    put(args, 'rr:' .. name, rr)
  end

  -- An unpredicted 429 lowers the bucket's limit factor, once per
  -- cooldown: to DECREASE times what it was or, when the previous one came
  -- within the bucket's period (zt:<name>), to what the bucket let through
  -- between the two, if less: the provider had no room at either, and its
  -- bucket, which holds a period's refill, could not fill up in between, so
  -- what it admitted meanwhile was its refill (less what others took).
  if rate_ev then
    local xt = tonumber(st['xt:' .. name])
    if not xt or now - xt >= COOLDOWN then
      evidence = true
      local x = factor_of(st, name)
      local lowered = x * DECREASE
      local zt, zc, zr = tonumber(st['zt:' .. name]), tonumber(st['zc:' .. name]), tonumber(st['zr:' .. name])
      local c = tonumber(st['c:' .. name]) or 0
      if zt and zc and zr and now - zt >= EST_MIN and now - zt <= period then
        local through = (c - zc) - (rr - zr)
        lowered = math.min(lowered, through / (now - zt) * period / limit_of(st, name, limit) * EST_SAFETY)
      end
      x = math.max(lowered, FLOOR)
      st['x:' .. name], st['xt:' .. name] = x, now
      put(args, 'x:' .. name, x)
      put(args, 'xt:' .. name, now)
      put(args, 'zt:' .. name, now)
      put(args, 'zc:' .. name, c)
      put(args, 'zr:' .. name, rr)
      learned = true
    end
  end

  -- a lower limit the provider announced applies at once, to this bucket
  -- as the next reservations see it (load_bucket)
  if olimit and oremain and olimit < limit then
    st['pl:' .. name], st['plt:' .. name] = olimit, now
    put(args, 'pl:' .. name, olimit)
    put(args, 'plt:' .. name, now)
  end
  local b = load_bucket(st, name, limit, period, bw)
  local u, f, c = b.u, b.f, b.c
  -- the reservation is no longer in flight
  if rgen == f[1] then f[2] = math.max(f[2] - reserved, 0) elseif rgen == f[1] - 1 then f[3] = math.max(f[3] - reserved, 0) end
  local held = f[2] + f[3]
  local delta = charged - reserved
  if refund then
    -- a refund never brings the level below what other calls hold in
    -- flight (see inflightGen)
    u = math.max(u + delta, held, 0)
  elseif delta > 0 then
    u = u + delta
  end
  if delta > 0 then c = c + delta end
  local model, bound = u, -1

  -- The calls the provider refused, by their place in the total taken,
  -- among the last few: it never charged them.
  local rf, kept = {}, {}
  for p, v in string.gmatch(st['rf:' .. name] or '', '([^:,]+):([^,]+)') do
    rf[#rf + 1] = {tonumber(p), tonumber(v)}
  end
  if olimit and oremain then
    if refused then
      -- what the provider says it holds includes no charge for this call
      u = math.max(u - reserved, held, 0)
      model = u
      rf[#rf + 1] = {cpos, reserved}
    end
    -- The provider had used at most cap - remaining when it answered, and
    -- since then at most what was taken here from a moment before this
    -- call on (calls sent just before it may have reached it after it),
    -- less the calls it refused.
    local since = c - clag
    for _, r in ipairs(rf) do
      if r[1] >= clag then since = since - r[2] end
    end
    bound = (b.cap - oremain) + math.max(since, 0)
    local fresh = clag >= (tonumber(st['s:' .. name]) or -1)
    -- Only a bucket that mirrors the provider's (the same limit) follows it
    -- down: one set below the provider's keeps its own count, or the
    -- provider's larger room would take it past its limit.
    local mirror = math.abs(olimit - b.limit) <= b.limit / 100
    if distrust or not mirror then
      u = math.max(u, bound)
    elseif fresh then
      u = math.max(bound, held, 0)
      put(args, 's:' .. name, clag)
    else
      -- an older answer than one followed already only ever lowers
      u = math.min(u, math.max(bound, held, 0))
    end
    put(args, 'pr:' .. name, oremain)
    put(args, 'prt:' .. name, now)

    -- While the provider's bucket is busy, the corrections its answers
    -- make to this bucket's own count (plus the drain it already assumed)
    -- sum to what others take from the account, less what the provider
    -- refunds: the answers' own lags cancel out over time. The drain is
    -- that sum's rate, when positive; the refund estimate sets it against
    -- the tokens calls left unused.
    -- A change of the limit or of the calibration makes the corrections
    -- before it say nothing about others: the sums start again.
    local wa = (tonumber(st['wa:' .. name]) or 0) + unused
    local ls = tonumber(st['ls:' .. name])
    if tonumber(st['lim:' .. name]) ~= limit or recalibrated then
      ls = nil
      put(args, 'lim:' .. name, limit)
      for _, f in ipairs({'n:', 'tw:', 'w:', 'e:'}) do st[f .. name] = nil; put(args, f .. name, 0) end
    end
    -- The sums run over consecutive answers of a busy bucket only: an
    -- idle one is full on both sides and its corrections say nothing.
    -- (an answer whose call had no lag yet, in a scope's first moments,
    -- counts everything taken so far as since: it starts no chain)
    local busy = oremain < BUSY * olimit and clag > 0
    if busy and not distrust and ls and st['lb:' .. name] == '1' then
      local dt = now - ls
      local dec = math.exp(-dt / RHO_TAU)
      local e = tonumber(st['e:' .. name]) or 0
      local n = (tonumber(st['n:' .. name]) or 0) * dec + (u - model) + e * b.cap * dt / period
      local tw = (tonumber(st['tw:' .. name]) or 0) * dec + dt
      if tw >= MIN_SPAN then
        st['e:' .. name] = math.min(math.max(n / tw * period / b.cap, 0), EMAX)
        put(args, 'e:' .. name, st['e:' .. name])
      end
      put(args, 'n:' .. name, n)
      put(args, 'tw:' .. name, tw)
      put(args, 'w:' .. name, (tonumber(st['w:' .. name]) or 0) * dec + wa)
      wa = 0
      learned = true
    end
    put(args, 'ls:' .. name, now)
    put(args, 'lb:' .. name, busy and not distrust and '1' or '0')
    put(args, 'wa:' .. name, wa)
  end

  if refused and olimit and oremain then
    local from = math.max(#rf - RF_KEEP + 1, 1)
    for j = from, #rf do kept[#kept + 1] = string.format('%d:%d', rf[j][1], rf[j][2]) end
    put(args, 'rf:' .. name, table.concat(kept, ','))
  end
  put(args, 'u:' .. name, u)
  put(args, 't:' .. name, now)
  put(args, 'g:' .. name, f[1])
  put(args, 'f0:' .. name, f[2])
  put(args, 'f1:' .. name, f[3])
  put(args, 'c:' .. name, c)
  -- The pace gets back what a call did not cost (a refund, a release) and
  -- gives what the provider charged beyond the reservation. A 429 the
  -- buckets did not predict empties it: the provider's window is empty
  -- now, whatever the pace held, and its rate goes back to the bucket's
  -- for PACE_HOLD (pace_hold:<name>), or SHORT_DECREASE below it (at least
  -- PACE_MIN of it) when the burst is one call already. While the
  -- provider's counts show half its bucket free and no hold is on, it has
  -- more room than the pace lets out (it refunds, or nobody else draws on
  -- it): the pace's rate grows, up to PACE_MAX times the bucket's.
  if b.pace then
    local p = b.pace
    if refund or delta > 0 then p = p - delta end
    if rate_ev or short_ev then p = math.min(p, 0) end
    put(args, 'pace:' .. name, math.min(p, b.burst))
    put(args, 'pace_t:' .. name, now)
    local pm, pmt = tonumber(st['pace_m:' .. name]) or 1, tonumber(st['pace_mt:' .. name]) or now
    local hold = tonumber(st['pace_hold:' .. name]) or 0
    if rate_ev or short_ev then
      pm, hold = math.min(pm, 1), now + PACE_HOLD
      if slow then pm = math.max(pm * SHORT_DECREASE, PACE_MIN) end
      put(args, 'pace_hold:' .. name, hold)
    elseif olimit and oremain and oremain >= PACE_SPARE * olimit and not refused and hold <= now then
      pm = math.min(pm + math.min(now - pmt, PACE_STEP) * PACE_GROW, PACE_MAX)
    end
    put(args, 'pace_m:' .. name, pm)
    put(args, 'pace_mt:' .. name, now)
  end
  ttl = math.max(ttl, idle_after(u, b.rate, f))
  local k = #out
  out[k + 1], out[k + 2], out[k + 3] = math.floor(model), math.floor(u), math.floor(bound)
  out[k + 4] = math.floor((tonumber(st['e:' .. name]) or 0) * 1e6)
  out[k + 5] = math.floor(factor_of(st, name) * 1e6)
  out[k + 6] = math.floor(burst_factor_of(st, name) * 1e6)
end

-- repeated unpredicted 429s (counted in windows of a minute from the
-- first): the provider's counts stop lowering the buckets
if evidence then
  local hn, hnt = tonumber(st.hn) or 0, tonumber(st.hnt)
  if not hnt or now - hnt > 60000000 then hn, hnt = 0, now end
  hn = hn + 1
  if hn >= DISTRUST_AFTER then
    put(args, 'hd', now + DISTRUST_FOR)
    hn, hnt = 0, now
  end
  put(args, 'hn', hn)
  put(args, 'hnt', hnt)
  learned = true
end

out[2], out[3] = math.floor((qm or 1) * 1e6), qn

-- the probe's settle ends the probe phase, and a penalty that is over
local del = {}
if ARGV[4] == '1' and pid == ARGV[3] then
  del, pt = {'pid', 'pt'}, nil
  if pu and pu <= now then
    del[3], pu = 'pu', nil
  end
end
if pu then ttl = math.max(ttl, math.max(pu - now, 0) + probe_timeout) end
if pt then ttl = math.max(ttl, pt - now + probe_timeout) end
if learned then
  put(args, 'l', '1')
  st.l = '1'
end

if #args > 0 or #del > 0 then save_state(key, st, old, args, del) end
extend_ttl(key, st, ttl)
if KEYS[2] then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) end
return out
`))

// Settle settles a provider call's reservation with what the provider
// answered (see Feedback): what it charged beyond the reservation is taken,
// nothing is given back on llmq's own say; each bucket the provider
// reported on then follows the provider's view, never holding more room
// than it, and the scope learns from the difference (the drain others cause,
// the refunds the provider makes, unpredicted 429s, the prompt calibration).
// Settling the probe ends the probe phase. It is idempotent: a reservation
// settled again within Options.ReconcileTTL changes nothing.
func (tb *TokenBucket) Settle(ctx context.Context, r *Reservation, fb Feedback) (*Settlement, error) {
	if r == nil {
		return nil, errors.New("limiter: Settle of a nil reservation")
	}
	if err := r.Scope.validate(Cost{}); err != nil {
		return nil, err
	}
	if fb.Charged.Requests < 0 || fb.Charged.Tokens < 0 || fb.Unused.Requests < 0 || fb.Unused.Tokens < 0 {
		return nil, fmt.Errorf("limiter: scope %q: negative feedback %+v", r.Scope.Name, fb)
	}
	if fb.PromptRatio < 0 || math.IsNaN(fb.PromptRatio) || math.IsInf(fb.PromptRatio, 0) {
		return nil, fmt.Errorf("limiter: scope %q: invalid prompt ratio %v", r.Scope.Name, fb.PromptRatio)
	}
	charged := fb.Charged
	if charged.Requests == 0 {
		charged.Requests = r.Cost.Requests
	}
	if charged.Tokens == 0 {
		charged.Tokens = r.Cost.Tokens
	}
	sample := ""
	if fb.PromptRatio > 0 {
		sample = strconv.FormatFloat(fb.PromptRatio, 'f', 6, 64)
	}
	return tb.settle(ctx, r, "s", charged, fb, sample, true)
}

// Reconcile settles a reservation with the call's real cost: unused tokens
// go back (a bucket never fills beyond its capacity), extra ones are taken
// (a bucket may go into debt, which delays later callers). It is for
// permits whose cost is known exactly (leases, plain permits); a provider
// call is settled with Settle, which never assumes a refund. Reconciling the
// probe ends the probe phase. It is idempotent: a reservation reconciled
// again within Options.ReconcileTTL changes nothing. It uses the limits the
// reservation was made with.
func (tb *TokenBucket) Reconcile(ctx context.Context, r *Reservation, actual Cost) error {
	return tb.reconcile(ctx, r, actual, true)
}

// reconcile is Reconcile; without marker, the caller guarantees that r is
// reconciled once.
func (tb *TokenBucket) reconcile(ctx context.Context, r *Reservation, actual Cost, marker bool) error {
	if r == nil {
		return errors.New("limiter: Reconcile of a nil reservation")
	}
	if err := r.Scope.validate(Cost{}); err != nil {
		return err
	}
	if actual.Requests < 0 || actual.Tokens < 0 {
		return fmt.Errorf("limiter: scope %q: negative actual cost %+v", r.Scope.Name, actual)
	}
	_, err := tb.settle(ctx, r, "r", actual, Feedback{}, "", marker)
	return err
}

// Release gives back everything a reservation took: the call never reached
// the provider. It is Reconcile with a zero cost, and as idempotent. After a
// 429, call Penalize before releasing the probe, so the scope stays blocked.
func (tb *TokenBucket) Release(ctx context.Context, r *Reservation) error {
	return tb.Reconcile(ctx, r, Cost{})
}

func (tb *TokenBucket) settle(ctx context.Context, r *Reservation, mode string, charged Cost, fb Feedback, sample string, marker bool) (*Settlement, error) {
	probe := "0"
	if r.Probe {
		probe = "1"
	}
	refused := "0"
	if fb.Refused {
		refused = "1"
	}
	args := make([]any, 0, 9+12*len(r.Scope.Buckets))
	args = append(args, redisclock.Arg(tb.opts.Clock), tb.reconcileTTL, r.ID, probe, tb.probeTimeout, r.gen, mode, sample, refused)
	for i, b := range r.Scope.Buckets {
		var lag, pos int64
		if i < len(r.lag) {
			lag, pos = r.lag[i], r.pos[i]
		}
		olimit, oremain := "", ""
		if j := slices.IndexFunc(fb.Observed, func(o Observed) bool { return o.Bucket == b.Name }); j >= 0 {
			o := fb.Observed[j]
			oremain = strconv.FormatInt(max(o.Remaining, 0), 10)
			olimit = strconv.FormatInt(b.Limit, 10)
			if o.Limit > 0 {
				olimit = strconv.FormatInt(o.Limit, 10)
			}
		}
		evidence := ""
		if slices.Contains(fb.Evidence, b.Name) {
			evidence += "r"
		}
		if slices.Contains(fb.ShortWindow, b.Name) {
			evidence += "s"
			if slices.Contains(fb.BlockWindow, b.Name) {
				evidence += "b"
			}
		}
		args = append(args, b.Name, b.Limit, b.Period.Microseconds(), b.Burst.Microseconds(), r.Cost.Of(b.Unit), charged.Of(b.Unit),
			fb.Unused.Of(b.Unit), lag, pos, olimit, oremain, evidence)
	}
	keys := []string{tb.opts.Keys.LimiterScope(r.Scope.Name)}
	if marker {
		keys = append(keys, tb.opts.Keys.LimiterReconciled(r.Scope.Name, r.ID))
	}
	v, err := settleScript.Run(ctx, tb.rdb, keys, args...).Result()
	var a []int64
	if err == nil {
		a, err = ints(v, 1)
	}
	if err != nil {
		return nil, fmt.Errorf("limiter: settle on scope %q: %w", r.Scope.Name, err)
	}
	s := &Settlement{Applied: a[0] == 1}
	if !s.Applied {
		return s, nil
	}
	if len(a) != 3+6*len(r.Scope.Buckets) {
		return nil, fmt.Errorf("limiter: settle on scope %q: unexpected reply %v", r.Scope.Name, a)
	}
	s.Calibration = calibration(a[1], a[2])
	for i, b := range r.Scope.Buckets {
		x := a[3+6*i:]
		s.Buckets = append(s.Buckets, BucketSettlement{Name: b.Name, Model: x[0], Level: x[1], ProviderBound: x[2],
			Drain: float64(x[3]) / 1e6, Factor: float64(x[4]) / 1e6, BurstFactor: float64(x[5]) / 1e6})
	}
	return s, nil
}
