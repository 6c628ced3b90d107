package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
// fits). It panics when opts has a negative duration.
func NewTokenBucket(rdb redis.Scripter, opts Options) *TokenBucket {
	o := opts.withDefaults()
	return &TokenBucket{
		rdb:          rdb,
		opts:         o,
		probeTimeout: strconv.FormatInt(o.ProbeTimeout.Microseconds(), 10),
		probeRetry:   strconv.FormatInt(o.ProbeRetry.Microseconds(), 10),
		reconcileTTL: strconv.FormatInt(max(o.ReconcileTTL.Milliseconds(), 1), 10),
	}
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

	gen int64 // the in-flight generation the reservation is held in; -1 when not held
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
//
// KEYS[1] -> the scope's hash (rkeys.LimiterScope): per bucket u:<name> the
// tokens used and t:<name> when (µs), f0:<name> and f1:<name> what is
// reserved and not yet reconciled in the in-flight generation g:<name> and
// the one before; pu penalty end, pid and pt the probe's reservation id and
// deadline
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> probe timeout in µs
// ARGV[3] -> longest retry while a probe is in flight, in µs
// ARGV[4] -> the number of bucket lists that follow, each: n, then n buckets
// of name, limit, period in µs
// then the reservations, each: its bucket list (1-based), mode ("r" reserve,
// "h" reserve and hold in flight until reconciled,
// "l" reserve for a lease, never the probe, "s" state: no writes), id, and
// its cost in each bucket of its list
// Returns {now, then per reservation: status, retry µs, held, then per
// bucket: remaining, retry µs, reset µs} where status is 0 denied by a
// bucket, 1 allowed, 2 allowed as the probe, 3 denied by a penalty, 4 denied
// while a probe is in flight; held is 1 when the retry is the time until
// what reservations hold in flight lapses (which a reconcile may free
// sooner), else 0. A bucket's retry is when it covers the cost if nothing is
// taken or reconciled meanwhile: its refill, and the ends of the in-flight
// generations holding it back.
var reserveScript = redis.NewScript(withGen(redisclock.Lua + `
local tonumber, ceil, floor, max = tonumber, math.ceil, math.floor, math.max
local key = KEYS[1]
local probe_timeout, probe_retry = tonumber(ARGV[2]), tonumber(ARGV[3])

local h = redis.call('HGETALL', key)
local st = {}
for i = 1, #h, 2 do st[h[i]] = h[i + 1] end
local pu, pid, pt = tonumber(st.pu), st.pid, tonumber(st.pt)
local new_probe = false
local gen = floor(now / GEN)

-- f0, f1: the bucket's in-flight amounts of generation g and g - 1, seen
-- from generation gen (older generations have lapsed)
local function inflight_of(name)
  local g = tonumber(st['g:' .. name]) or gen
  local f0, f1 = tonumber(st['f0:' .. name]) or 0, tonumber(st['f1:' .. name]) or 0
  if gen == g + 1 then f0, f1 = 0, f0 elseif gen > g + 1 then f0, f1 = 0, 0 end
  return {max(g, gen), f0, f1}
end

-- the bucket lists; used, lim and per hold each bucket's level now and the
-- limit and period it refills with (those of the first list naming it),
-- fl its in-flight generations, base the level it refills from without the
-- floor of what is in flight (the level it is written with once taken from)
local lists, used, lim, per, fl, base = {}, {}, {}, {}, {}, {}
local a = 5
for l = 1, tonumber(ARGV[4]) do
  local n = tonumber(ARGV[a])
  local names, limits, periods = {}, {}, {}
  for i = 1, n do
    local name, limit, period = ARGV[a + 3 * i - 2], tonumber(ARGV[a + 3 * i - 1]), tonumber(ARGV[a + 3 * i])
    names[i], limits[i], periods[i] = name, limit, period
    if not used[name] then
      local u = tonumber(st['u:' .. name]) or 0
      local ts = tonumber(st['t:' .. name]) or now
      local f = inflight_of(name)
      local d = u
      if now > ts then
        -- refill, but never below what is in flight (see inflightGen)
        d = u - (now - ts) * limit / period
        u = max(d, f[2] + f[3], 0)
      end
      used[name], base[name], lim[name], per[name], fl[name] = u, d, limit, period, f
    end
  end
  lists[l] = {n, names, limits, periods}
  a = a + 1 + 3 * n
end

local dirty, take = {}, false
local out, o = {now}, 1
local waits = {}
while a <= #ARGV do
  local list, mode = lists[tonumber(ARGV[a])], ARGV[a + 1]
  local n, names, limits, periods = list[1], list[2], list[3], list[4]
  local c0 = a + 2
  -- retry is the longest wait; held the longest set by what is in flight,
  -- exact the longest set by refill
  local status, retry, held, exact = 1, 0, 0, 0
  for i = 1, n do
    local name, limit = names[i], limits[i]
    local cost = tonumber(ARGV[c0 + i])
    -- a trillionth of the limit absorbs float rounding
    local tol = limit * 1e-12
    local w, need = 0, base[name] + cost - limit
    if need > tol then w = ceil(need * periods[i] / limit) end
    -- what is in flight stops holding the bucket back when its generation
    -- and the next one are over
    local f, wf = fl[name], 0
    if f[2] + f[3] + cost - limit > tol then
      wf = (f[1] + (f[2] + cost - limit > tol and 2 or 1)) * GEN - now
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
    local name, limit = names[i], limits[i]
    local u = used[name]
    if take then
      local cost = tonumber(ARGV[c0 + i])
      u = u + cost
      used[name], base[name], dirty[name] = u, u, true
      if mode == 'h' then
        local f = fl[name]
        if f[1] == gen then f[2] = f[2] + cost else f[3] = f[3] + cost end
      end
    end
    out[o + 1], out[o + 2], out[o + 3] = floor(limit - u), waits[i], ceil(u * periods[i] / limit)
    o = o + 3
  end
  a = c0 + n + 1
end

local args = {}
for name in pairs(dirty) do
  local f = fl[name]
  args[#args + 1] = 'u:' .. name
  args[#args + 1] = string.format('%.17g', used[name])
  args[#args + 1] = 't:' .. name
  args[#args + 1] = string.format('%d', now)
  args[#args + 1] = 'g:' .. name
  args[#args + 1] = string.format('%d', f[1])
  args[#args + 1] = 'f0:' .. name
  args[#args + 1] = string.format('%.17g', f[2])
  args[#args + 1] = 'f1:' .. name
  args[#args + 1] = string.format('%.17g', f[3])
end
if new_probe then
  args[#args + 1] = 'pid'
  args[#args + 1] = pid
  args[#args + 1] = 'pt'
  args[#args + 1] = pt
end
if #args > 0 then
  -- the hash lives until every bucket is full, nothing is held in flight and
  -- no penalty or probe is pending, and never less than it would already:
  -- the other bucket lists of the scope may have used it
  local ttl = 0
  for name, u in pairs(used) do
    local f = fl[name]
    ttl = max(ttl, u * per[name] / lim[name])
    if f[2] > 0 then ttl = max(ttl, (f[1] + 2) * GEN - now) elseif f[3] > 0 then ttl = max(ttl, (f[1] + 1) * GEN - now) end
  end
  if pu then ttl = max(ttl, max(pu - now, 0) + probe_timeout) end
  if pt then ttl = max(ttl, pt - now + probe_timeout) end
  redis.call('HSET', key, unpack(args))
  ttl = ceil(ttl / 1000) + 1000
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
return out
`))

// maxBatch bounds the reservations of one script run, so that one run never
// blocks Redis for long.
const maxBatch = 64

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

// call is one reservation waiting for, or in, a script run.
type call struct {
	mode  string
	scope Scope
	cost  Cost
	id    string
	res   *Result
	err   error
	done  chan struct{} // closed when res and err are set; nil for a batch's first caller
	state atomic.Int32  // callWaiting, callDelivered or callAbandoned
}

const (
	callWaiting = iota
	callDelivered
	callAbandoned
)

// batcher queues the reservations of one scope while a run is in flight.
type batcher struct {
	key     string // the scope's hash
	mu      sync.Mutex
	queue   []*call
	running bool
}

func (tb *TokenBucket) reserve(ctx context.Context, mode string, scope Scope, cost Cost) (*Result, error) {
	if err := scope.validate(cost); err != nil {
		return nil, err
	}
	c := &call{mode: mode, scope: scope, cost: cost}
	if mode != modeState {
		c.id = newID()
	}
	bv, ok := tb.batchers.Load(scope.Name)
	if !ok {
		bv, _ = tb.batchers.LoadOrStore(scope.Name, &batcher{key: tb.opts.Keys.LimiterScope(scope.Name)})
	}
	b := bv.(*batcher)

	b.mu.Lock()
	if !b.running {
		// Nothing in flight: run now, alone (so on ctx, which concerns no
		// other caller), and hand what queued meanwhile to a flusher.
		b.running = true
		b.mu.Unlock()
		tb.run(ctx, b.key, []*call{c})
		b.mu.Lock()
		if len(b.queue) > 0 {
			go tb.flush(ctx, b)
		} else {
			b.running = false
		}
		b.mu.Unlock()
		return c.res, c.err
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	b.mu.Unlock()

	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	if i := slices.Index(b.queue, c); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
		b.mu.Unlock()
		return nil, ctx.Err()
	}
	b.mu.Unlock()
	if c.state.CompareAndSwap(callWaiting, callAbandoned) {
		return nil, ctx.Err()
	}
	<-c.done // delivered just now
	return c.res, c.err
}

// flush runs the queued reservations of b, a batch at a time, until none is
// left; it releases what it reserved for callers that stopped waiting.
func (tb *TokenBucket) flush(ctx context.Context, b *batcher) {
	ctx = context.WithoutCancel(ctx)
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()

		tb.run(ctx, b.key, batch)
		for _, c := range batch {
			if c.state.CompareAndSwap(callWaiting, callDelivered) {
				close(c.done)
			} else if c.err == nil && c.res.Reservation != nil {
				// Best effort: on failure the tokens stay counted as used,
				// which only costs capacity until they refill.
				_ = tb.Release(ctx, c.res.Reservation)
			}
		}
	}
}

// run decides a batch of reservations of one scope in one script run, and
// sets each call's res or err.
func (tb *TokenBucket) run(ctx context.Context, key string, batch []*call) {
	// The batch's distinct bucket lists go once; usually there is one.
	var lists [][]Bucket
	list := make([]int, len(batch))
	size := 4
	for i, c := range batch {
		list[i] = slices.IndexFunc(lists, func(l []Bucket) bool { return slices.Equal(l, c.scope.Buckets) })
		if list[i] < 0 {
			list[i] = len(lists)
			lists = append(lists, c.scope.Buckets)
			size += 1 + 3*len(c.scope.Buckets)
		}
		size += 3 + len(c.scope.Buckets)
	}
	args := make([]any, 0, size)
	args = append(args, redisclock.Arg(tb.opts.Clock), tb.probeTimeout, tb.probeRetry, len(lists))
	for _, l := range lists {
		args = append(args, len(l))
		for _, b := range l {
			args = append(args, b.Name, b.Limit, b.Period.Microseconds())
		}
	}
	for i, c := range batch {
		args = append(args, list[i]+1, c.mode, c.id)
		for _, b := range c.scope.Buckets {
			args = append(args, c.cost.Of(b.Unit))
		}
	}
	v, err := reserveScript.Run(ctx, tb.rdb, []string{key}, args...).Result()
	var a []int64
	if err == nil {
		a, err = ints(v, 1) // each call's part is checked below
	}
	if err != nil {
		for _, c := range batch {
			c.err = fmt.Errorf("limiter: reserve on scope %q: %w", c.scope.Name, err)
		}
		return
	}
	now, a := time.UnixMicro(a[0]), a[1:]
	for _, c := range batch {
		n := 3 + 3*len(c.scope.Buckets)
		if len(a) < n {
			c.err = fmt.Errorf("limiter: reserve on scope %q: short script reply", c.scope.Name)
			continue
		}
		c.res = tb.result(c, now, a[:n])
		a = a[n:]
	}
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
	for i, b := range c.scope.Buckets {
		x := a[3+3*i:]
		res.Buckets[i] = BucketState{
			Name: b.Name, Unit: b.Unit, Limit: b.Limit,
			Remaining: x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2]),
		}
	}
	res.fill()
	switch {
	case res.Allowed:
		res.RetryAfter = 0
		if c.mode != modeState {
			res.Reservation = &Reservation{ID: c.id, Scope: c.scope, Cost: c.cost, Probe: status == statusProbe, gen: -1}
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

// reconcileScript gives back what a reservation took beyond its real cost, or
// takes the extra, once per reservation.
//
// KEYS[1] -> the scope's hash (rkeys.LimiterScope)
// KEYS[2] -> the reservation's reconciled marker (rkeys.LimiterReconciled),
// absent when the caller guarantees a single reconcile (a lease)
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> how long the marker lives, in ms
// ARGV[3] -> reservation id
// ARGV[4] -> "1" when the reservation is the probe, else "0"
// ARGV[5] -> probe timeout in µs
// ARGV[6] -> the reservation's in-flight generation
// ARGV[7+5(i-1)] .. ARGV[11+5(i-1)] -> bucket i: name, limit, period in µs,
// actual - reserved, reserved
// Returns 1 when applied, 0 when the reservation was already reconciled.
//
// Redis keeps what a script wrote before a runtime error, so the script
// reads and computes everything first, and writes the marker last: a failed
// run leaves no marker, and its retry applies.
var reconcileScript = redis.NewScript(withGen(redisclock.Lua + `
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local key = KEYS[1]
local probe_timeout = tonumber(ARGV[5])
local rgen = tonumber(ARGV[6])
local gen = math.floor(now / GEN)
local n = (#ARGV - 6) / 5

local fields = {'pu', 'pid', 'pt'}
for i = 1, n do
  local name = ARGV[2 + 5 * i]
  for j, f in ipairs({'u:', 't:', 'g:', 'f0:', 'f1:'}) do fields[5 * i - 2 + j] = f .. name end
end
local v = redis.call('HMGET', key, unpack(fields))
local pu, pid, pt = tonumber(v[1]), v[2], tonumber(v[3])

local args, ttl = {}, 0
for i = 1, n do
  local a = 2 + 5 * i
  local limit, period, delta, reserved = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local b = 5 * i - 1
  local u, ts = tonumber(v[b]) or 0, tonumber(v[b + 1]) or now
  local g = tonumber(v[b + 2]) or gen
  local f0, f1 = tonumber(v[b + 3]) or 0, tonumber(v[b + 4]) or 0
  if gen == g + 1 then f0, f1 = 0, f0 elseif gen > g + 1 then f0, f1 = 0, 0 end
  g = math.max(g, gen)
  if now > ts then
    -- refill, but never below what is in flight (see inflightGen)
    u = math.max(u - (now - ts) * limit / period, f0 + f1, 0)
  end
  if delta ~= 0 or reserved ~= 0 then
    -- The reservation is no longer in flight.
    if rgen == g then f0 = math.max(f0 - reserved, 0) elseif rgen == g - 1 then f1 = math.max(f1 - reserved, 0) end
    -- A refund never brings the tokens used below what other calls hold
    -- in flight (see inflightGen); an extra may put the bucket in debt.
    u = math.max(u + delta, f0 + f1, 0)
    args[#args + 1] = 'u:' .. ARGV[a]
    args[#args + 1] = string.format('%.17g', u)
    args[#args + 1] = 't:' .. ARGV[a]
    args[#args + 1] = string.format('%d', now)
    args[#args + 1] = 'g:' .. ARGV[a]
    args[#args + 1] = string.format('%d', g)
    args[#args + 1] = 'f0:' .. ARGV[a]
    args[#args + 1] = string.format('%.17g', f0)
    args[#args + 1] = 'f1:' .. ARGV[a]
    args[#args + 1] = string.format('%.17g', f1)
  end
  -- the hash lives until the bucket is full and nothing is held in flight
  ttl = math.max(ttl, u * period / limit)
  if f0 > 0 then ttl = math.max(ttl, (g + 2) * GEN - now) elseif f1 > 0 then ttl = math.max(ttl, (g + 1) * GEN - now) end
end
-- the probe's reconcile ends the probe phase, and a penalty that is over
local del = {}
if ARGV[4] == '1' and pid == ARGV[3] then
  del, pt = {'pid', 'pt'}, nil
  if pu and pu <= now then
    del[3], pu = 'pu', nil
  end
end
if pu then ttl = math.max(ttl, math.max(pu - now, 0) + probe_timeout) end
if pt then ttl = math.max(ttl, pt - now + probe_timeout) end

if #args > 0 then redis.call('HSET', key, unpack(args)) end
if #del > 0 then redis.call('HDEL', key, unpack(del)) end
-- never shorter than it would already: the other bucket lists of the scope
-- may have used the hash
ttl = math.ceil(ttl / 1000) + 1000
if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
if KEYS[2] then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) end
return 1
`))

// Reconcile settles a reservation with the call's real cost: unused tokens
// go back (a bucket never fills beyond its capacity), extra ones are taken
// (a bucket may go into debt, which delays later callers). Reconciling the
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
	probe := "0"
	if r.Probe {
		probe = "1"
	}
	args := make([]any, 0, 6+5*len(r.Scope.Buckets))
	args = append(args, redisclock.Arg(tb.opts.Clock), tb.reconcileTTL, r.ID, probe, tb.probeTimeout, r.gen)
	for _, b := range r.Scope.Buckets {
		args = append(args, b.Name, b.Limit, b.Period.Microseconds(), actual.Of(b.Unit)-r.Cost.Of(b.Unit), r.Cost.Of(b.Unit))
	}
	keys := []string{tb.opts.Keys.LimiterScope(r.Scope.Name)}
	if marker {
		keys = append(keys, tb.opts.Keys.LimiterReconciled(r.Scope.Name, r.ID))
	}
	if err := reconcileScript.Run(ctx, tb.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("limiter: reconcile on scope %q: %w", r.Scope.Name, err)
	}
	return nil
}

// Release gives back everything a reservation took: the call never happened
// or failed. It is Reconcile with a zero cost, and as idempotent. After a
// 429, call Penalize before releasing the probe, so the scope stays blocked.
func (tb *TokenBucket) Release(ctx context.Context, r *Reservation) error {
	return tb.Reconcile(ctx, r, Cost{})
}

// penalizeScript blocks a scope until now + d, never shortening a penalty in
// force, and cancels a probe in flight so that a new one follows.
//
// KEYS[1] -> the scope's hash (rkeys.LimiterScope)
// ARGV[1] -> now in µs, or "" for Redis TIME
// ARGV[2] -> the penalty in µs
// ARGV[3] -> probe timeout in µs
// Returns the end of the penalty in µs.
var penalizeScript = redis.NewScript(redisclock.Lua + `
local key = KEYS[1]
local untl = now + tonumber(ARGV[2])
local pu = tonumber(redis.call('HGET', key, 'pu'))
if pu and pu > untl then untl = pu end
redis.call('HSET', key, 'pu', string.format('%.17g', untl))
redis.call('HDEL', key, 'pid', 'pt')
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

// withGen puts the in-flight generation length, in µs, into a script.
func withGen(src string) string {
	return strings.ReplaceAll(src, "GEN", strconv.FormatInt(inflightGen.Microseconds(), 10))
}
