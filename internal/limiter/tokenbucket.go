package limiter

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// TokenBucket is the distributed, weighted token bucket over several buckets
// at once. One hash per scope (rkeys.LimiterScope) holds, per bucket, the
// tokens used and the time they were last counted, plus the penalty and the
// probe. A bucket refills continuously at Limit/Period: the used amount
// decays linearly and is never negative; it may exceed Limit (debt) after a
// Reconcile took more than was reserved.
//
// Limits are passed on every call, so they may change at any time. The used
// amount is kept as it is when they do: raising a limit frees capacity at
// once, lowering it below what was used puts the bucket in debt, repaid at
// the new rate. This matches what a provider does, which counts the tokens it
// served, whatever the limit.
//
// The hash expires once every bucket would be full again, no reservation is
// held in flight and no penalty or probe is pending (plus one second), so an
// idle scope leaves nothing behind. A call only knows the buckets it names,
// and a scope's bucket list may change (learned limits), so a call extends
// the expiry and never shortens it: after a refund the hash may outlive its
// usage by up to its longest bucket's period.
type TokenBucket struct {
	rdb  redis.Scripter
	opts Options
	// probeTimeout, probeRetry and reconcileTTL as script arguments.
	probeTimeout, probeRetry, reconcileTTL string
	// batchers holds a *batcher per scope name.
	batchers sync.Map
}

// NewTokenBucket returns a TokenBucket over rdb (any redis.UniversalClient
// fits), or an error naming a field of opts that is invalid.
func NewTokenBucket(rdb redis.Scripter, opts Options) (*TokenBucket, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &TokenBucket{
		rdb:          rdb,
		opts:         o,
		probeTimeout: strconv.FormatInt(o.ProbeTimeout.Microseconds(), 10),
		probeRetry:   strconv.FormatInt(o.ProbeRetry.Microseconds(), 10),
		reconcileTTL: strconv.FormatInt(max(o.ReconcileTTL.Milliseconds(), 1), 10),
	}, nil
}

// Reservation is what an allowed Reserve took. Pass it to Reconcile (the call
// happened, with its real usage) or Release (it did not, or failed).
type Reservation struct {
	ID    string
	Scope Scope
	Cost  Cost
	// Probe marks the single call admitted after a penalty. Until it is
	// reconciled, released or times out, every other caller is denied.
	Probe bool

	gen int64   // the in-flight generation the reservation is held in; -1 when not held
	lag []int64 // per bucket, what it had taken a moment before (see lagDelay)
	pos []int64 // per bucket, what it had taken just before this reservation
}

// inflightGen is the length of one in-flight generation. A bucket holds back,
// from refill and refunds, what was reserved in the current and the previous
// generation and is not yet reconciled ("in flight"), so it never runs ahead
// of the provider's bucket:
//
// The provider charges a call when it arrives, a little after the
// reservation here, and refunds its unused tokens when it completes, a
// little before the reconcile here. If its bucket is full at those moments
// it loses the refill or the refund that this bucket, which charged earlier
// or refunds later, still gets. Both gaps only involve calls reserved and
// not yet reconciled within the last moments, so with this floor on the
// tokens used the provider's bucket always holds at least as much as this
// one: a permit here is a call the provider admits, provided reservations
// cover what the provider counts and llmq is the account's only user.
//
// Two generations cover between one and two lengths, which must exceed the
// delay between a reservation and the call's arrival, and between the call's
// completion and its reconcile. Calls in flight longer stop being held back,
// so slow calls do not hold capacity, and a reservation never reconciled (a
// crashed worker) lapses within two lengths.
const inflightGen = 5 * time.Second

// Reserve status codes of reserveScript.
const (
	statusDenied     = 0
	statusAllowed    = 1
	statusProbe      = 2
	statusPenalty    = 3
	statusProbeWait  = 4
	modeReserve      = "r"
	modeReserveHold  = "h"
	modeReserveLease = "l"
	modeState        = "s"
)

// reserveScript decides, in order, a batch of reservations on one scope: for
// each, it checks every bucket, the penalty and the probe, and takes the cost
// from all buckets or from none, as if each ran alone at the same instant.
// Buckets refill at their learned rate (see bucketLua).
//
// KEYS[1] -> the scope's hash (rkeys.LimiterScope), whose state (stateLua)
// holds per bucket u:<name> the
// tokens used and t:<name> when (µs), f0:<name> and f1:<name> what is
// reserved and not yet reconciled in the in-flight generation g:<name> and
// the one before, c:<name> all it ever took and k*:<name> that total a
// moment ago (see lagLua in bucketLua), e:<name>, x:<name> and xt:<name> what it learned
// (see bucketLua); pu penalty end, pid and pt the probe's reservation id
// and deadline
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> probe timeout in µs
// ARGV[3] -> longest retry while a probe is in flight, in µs
// ARGV[4] -> the number of bucket lists that follow, each: n, then n buckets
// of name, limit, period in µs, burst window in µs (0: none)
// then the reservations, each: its bucket list (1-based), mode ("r" reserve,
// "h" reserve and hold in flight until reconciled,
// "l" reserve for a lease, never the probe, "s" state: no writes), id, and
// its cost in each bucket of its list
// Returns {now, then per reservation: status, retry µs, held, then per
// bucket: remaining, retry µs, reset µs, taken a moment before, taken just
// before, what its pace lets out now (-1 when no burst bounds it)} where
// status is 0
// denied by a bucket, 1 allowed, 2 allowed as the probe, 3 denied by a
// penalty, 4 denied while a probe is in flight; held is 1 when the retry is
// the time until what reservations hold in flight lapses (which a reconcile
// may free sooner), else 0; the totals taken (a moment before the
// reservation, and just before it) are for Settle. A bucket's retry is when it
// covers the cost if nothing is taken or reconciled meanwhile: its refill,
// and the ends of the in-flight generations holding it back.
var reserveScript = redis.NewScript(withConstants(redisclock.Lua + bucketLua + `
local ceil, floor = math.ceil, math.floor
local key = KEYS[1]
local probe_timeout, probe_retry = tonumber(ARGV[2]), tonumber(ARGV[3])

local st, old = load_state(key)
local pu, pid, pt = tonumber(st.pu), st.pid, tonumber(st.pt)
local new_probe = false

-- the bucket lists; used, cap and rate hold each bucket's level now and the
-- capacity and rate it refills with (those of the first list naming it),
-- fl its in-flight generations, base the level it refills from without the
-- floor of what is in flight (the level it is written with once taken from),
-- tk its total taken and lag that total a moment ago
-- burst the most it lets out at once and pace what it lets out now (nil:
-- no bound but its capacity)
local lists, used, cap, rate, fl, base, tk, lag, burst, pace, prate = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local a = 5
for l = 1, tonumber(ARGV[4]) do
  local n = tonumber(ARGV[a])
  local names = {}
  for i = 1, n do
    local name, limit, period, bw = ARGV[a + 4 * i - 3], tonumber(ARGV[a + 4 * i - 2]), tonumber(ARGV[a + 4 * i - 1]), tonumber(ARGV[a + 4 * i])
    names[i] = name
    if not used[name] then
      local b = load_bucket(st, name, limit, period, bw)
      used[name], base[name], cap[name], rate[name], fl[name] = b.u, b.d, b.cap, b.rate, b.f
      tk[name], lag[name], burst[name], pace[name], prate[name] = b.c, lag_of(st, name), b.burst, b.pace, b.pace_rate
    end
  end
  lists[l] = {n, names}
  a = a + 1 + 4 * n
end

local dirty, take = {}, false
local out, o = {now}, 1
local waits = {}
while a <= #ARGV do
  local list, mode = lists[tonumber(ARGV[a])], ARGV[a + 1]
  local n, names = list[1], list[2]
  local c0 = a + 2
  -- retry is the longest wait; held the longest set by what is in flight,
  -- exact the longest set by refill
  local status, retry, held, exact = 1, 0, 0, 0
  for i = 1, n do
    local name = names[i]
    local capa = cap[name]
    -- a cost above what the bucket holds now (it learned a lower limit)
    -- needs it empty
    local cost = math.min(tonumber(ARGV[c0 + i]), capa)
    -- a trillionth of the capacity absorbs float rounding
    local tol = capa * 1e-12
    local w, need = 0, base[name] + cost - capa
    if need > tol then w = ceil(need / rate[name]) end
    -- what is in flight stops holding the bucket back when its generation
    -- and the next one are over
    local f, wf = fl[name], 0
    if f[2] + f[3] + cost - capa > tol then
      wf = (f[1] + (f[2] + cost - capa > tol and 2 or 1)) * GEN - now
    end
    -- the pace holds the cost, or its whole burst for a cost above it
    local p = pace[name]
    if p then
      local pneed = math.min(tonumber(ARGV[c0 + i]), burst[name]) - p
      if pneed > tol then w = math.max(w, ceil(pneed / prate[name])) end
    end
    if wf > w then
      w = wf
      if w > held then held = w end
    elseif w > exact then
      exact = w
    end
    if w > 0 then status = 0 end
    if w > retry then retry = w end
    waits[i] = w
  end
  held = held > exact

  if pu then
    if pu > now then
      status = 3
      if pu - now >= retry then retry, held = pu - now, false end
    elseif pid and pt and pt > now then
      status = 4
      local w = math.min(pt - now, probe_retry)
      if w >= retry then retry, held = w, false end
    elseif status == 1 and mode ~= 's' then
      -- the penalty is over and no probe is in flight: this caller probes
      if mode == 'l' then
        status, retry = 4, probe_retry
      else
        status, pid, pt, new_probe = 2, ARGV[c0], now + probe_timeout, true
      end
    end
  end

  take = (status == 1 or status == 2) and mode ~= 's'
  out[o + 1], out[o + 2], out[o + 3] = status, retry, held and 1 or 0
  o = o + 3
  for i = 1, n do
    local name = names[i]
    local u = used[name]
    local pos = tk[name]
    if take then
      local cost = tonumber(ARGV[c0 + i])
      if pace[name] then pace[name] = pace[name] - cost end
      u = u + cost
      used[name], base[name], dirty[name] = u, u, true
      tk[name] = tk[name] + cost
      if mode == 'h' then
        local f = fl[name]
        if f[1] == gen then f[2] = f[2] + cost else f[3] = f[3] + cost end
      end
    end
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = floor(cap[name] - u), waits[i], ceil(u / rate[name]), lag[name], pos
    out[o + 6] = pace[name] and math.max(floor(pace[name]), 0) or -1
    o = o + 6
  end
  a = c0 + n + 1
end

local args = {}
for name in pairs(dirty) do
  local f = fl[name]
  put(args, 'u:' .. name, used[name])
  put(args, 't:' .. name, now)
  put(args, 'g:' .. name, f[1])
  put(args, 'f0:' .. name, f[2])
  put(args, 'f1:' .. name, f[3])
  put(args, 'c:' .. name, tk[name])
  put_lag(args, name, tk[name])
  if pace[name] then
    put(args, 'pace:' .. name, pace[name])
    put(args, 'pace_t:' .. name, now)
  end
end
if new_probe then
  put(args, 'pid', pid)
  put(args, 'pt', pt)
end
if #args > 0 then
  -- the hash lives until every bucket is full, nothing is held in flight and
  -- no penalty or probe is pending, and never less than it would already:
  -- the other bucket lists of the scope may have used it
  local ttl = 0
  for name, u in pairs(used) do ttl = math.max(ttl, idle_after(u, rate[name], fl[name])) end
  if pu then ttl = math.max(ttl, math.max(pu - now, 0) + probe_timeout) end
  if pt then ttl = math.max(ttl, pt - now + probe_timeout) end
  save_state(key, st, old, args, {})
  extend_ttl(key, st, ttl)
end
return out
`))

// Reserve takes cost from every bucket of scope, or from none: allowed only
// when every bucket can cover it and the scope is not penalized. A cost above
// a bucket's capacity fails at once with ErrCostExceedsCapacity. When
// allowed, pass Result.Reservation to Reconcile or Release after the call.
//
// Concurrent Reserves of one scope in one process share a script run and a
// round trip: the first caller runs at once, and callers arriving meanwhile
// go together in the next run, each decided alone, in arrival order. A caller
// whose context ends while it waits returns at once; what a shared run
// reserved for it is released.
func (tb *TokenBucket) Reserve(ctx context.Context, scope Scope, cost Cost) (*Result, error) {
	mode := modeReserve
	if tb.opts.HoldInFlight {
		mode = modeReserveHold
	}
	return tb.reserve(ctx, mode, scope, cost)
}

// State returns the levels of scope's buckets without taking anything:
// Allowed tells whether a zero cost would pass now (no penalty, no debt).
func (tb *TokenBucket) State(ctx context.Context, scope Scope) (*Result, error) {
	return tb.reserve(ctx, modeState, scope, Cost{})
}

// result reads one reservation's part of reserveScript's reply.
func (tb *TokenBucket) result(c *call, now time.Time, a []int64) *Result {
	status := a[0]
	res := &Result{
		Allowed:    status == statusAllowed || status == statusProbe,
		Penalized:  status == statusPenalty || status == statusProbeWait,
		RetryAfter: us(a[1]),
		Time:       now,
		Buckets:    make([]BucketState, len(c.scope.Buckets)),
	}
	lag, pos := make([]int64, len(c.scope.Buckets)), make([]int64, len(c.scope.Buckets))
	for i, b := range c.scope.Buckets {
		x := a[3+6*i:]
		lag[i], pos[i] = x[3], x[4]
		res.Buckets[i] = BucketState{
			Name: b.Name, Unit: b.Unit, Limit: b.Limit,
			Remaining: x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2]), Burst: x[5],
		}
	}
	res.fill()
	switch {
	case res.Allowed:
		res.RetryAfter = 0
		if c.mode != modeState {
			res.Reservation = &Reservation{ID: c.id, Scope: c.scope, Cost: c.cost, Probe: status == statusProbe, gen: -1, lag: lag, pos: pos}
			if c.mode == modeReserveHold {
				res.Reservation.gen = now.UnixMicro() / inflightGen.Microseconds()
			}
		}
	case status == statusProbeWait:
		// Callers denied together while a probe is in flight spread out.
		res.probeWait = true
		res.RetryAfter = time.Duration(float64(res.RetryAfter) * (0.75 + 0.5*tb.opts.Rand()))
	}
	if !res.Allowed && a[2] == 1 {
		// The holds lapse after seconds, but a reconcile may free them at
		// any moment: check again soon, and not in lockstep.
		res.HeldInFlight = true
		res.RetryAfter = min(res.RetryAfter, time.Duration(float64(tb.opts.HoldRetry)*(0.75+0.5*tb.opts.Rand())))
	}
	return res
}

// penalizeScript blocks a scope until now + d, never shortening a penalty in
// force, and cancels a probe in flight so that a new one follows.
//
// KEYS[1] -> the scope's hash (rkeys.LimiterScope)
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> the penalty in µs
// ARGV[3] -> probe timeout in µs
// Returns the end of the penalty in µs.
var penalizeScript = redis.NewScript(redisclock.Lua + stateLua + `
local key = KEYS[1]
local st, old = load_state(key)
local untl = now + tonumber(ARGV[2])
local pu = tonumber(st.pu)
if pu and pu > untl then untl = pu end
save_state(key, st, old, {'pu', untl}, {'pid', 'pt'})
local ttl = math.ceil((untl - now + tonumber(ARGV[3])) / 1000) + 1000
if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
return untl
`)

// Penalize blocks scope for every caller in every process until Redis's now
// plus d, after a provider's 429. It takes a duration, not the wall-clock
// time the provider announced, because limiter time is Redis TIME, never the
// caller's clock: pass the provider's retry-after (or reset) as d. A shorter
// penalty never shortens a longer one in force. When the penalty ends, the
// first Reserve is admitted alone as the probe (Reservation.Probe); the rest
// are denied until the probe is reconciled, released or times out. A new
// Penalize while a probe is in flight blocks again and cancels that probe.
func (tb *TokenBucket) Penalize(ctx context.Context, scope Scope, d time.Duration) error {
	if err := scope.validate(Cost{}); err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("limiter: Penalize of scope %q: negative duration %v", scope.Name, d)
	}
	if d < time.Microsecond {
		return nil
	}
	args := []any{redisclock.Arg(tb.opts.Clock), d.Microseconds(), tb.probeTimeout}
	if err := penalizeScript.Run(ctx, tb.rdb, []string{tb.opts.Keys.LimiterScope(scope.Name)}, args...).Err(); err != nil {
		return fmt.Errorf("limiter: penalize scope %q: %w", scope.Name, err)
	}
	return nil
}

// Wait reserves cost, sleeping each returned RetryAfter (plus up to
// Options.Jitter) until it is admitted; it never polls on a fixed tick. It
// ends with the context: when ctx is done it returns ctx.Err(), and when
// ctx's deadline comes before the admission RetryAfter promises, it returns
// at once, with the last Result (its RetryAfter tells how long remains) and
// an error wrapping context.DeadlineExceeded. A cost above a bucket's
// capacity fails at once with ErrCostExceedsCapacity. Wait sleeps real time:
// with an injected Clock it advances only as that clock does.
func (tb *TokenBucket) Wait(ctx context.Context, scope Scope, cost Cost) (*Result, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		res, err := tb.Reserve(ctx, scope, cost)
		if err != nil || res.Allowed {
			return res, err
		}
		if dl, ok := ctx.Deadline(); ok && !res.probeWait && !res.HeldInFlight && time.Until(dl) < res.RetryAfter {
			return res, fmt.Errorf("limiter: scope %q admits this cost in %v, after the context's deadline: %w",
				scope.Name, res.RetryAfter, context.DeadlineExceeded)
		}
		d := res.RetryAfter + time.Duration(tb.opts.Rand()*float64(tb.opts.Jitter))
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-timer.C:
		}
	}
}
