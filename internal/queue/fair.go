package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/coalesce"
	"github.com/llmq/llmq/internal/redisbatch"
	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/rkeys"
)

// The fair queue holds the jobs waiting for a model (a limiter scope), one
// FIFO list per priority and tenant, until the scheduler releases them into
// asynq's queues, as fast as the model's limits admit them. Between
// tenants of one priority it is start-time fair queuing counted in tokens:
// each tenant's next job carries a start tag, its last finish tag or the
// priority's virtual time if later, and the job with the lowest tag goes
// first; a job advances its tenant's tag by its cost over the tenant's
// share. Between priorities the same, weighted by the queues' weights, so
// priorities keep the proportions asynq gives them. A tenant that starts
// waiting starts at the virtual time: it neither waits behind another's
// backlog nor gets credit for the time it was idle. docs/ARCHITECTURE.md
// says why it is built this way.

// fairTTL is how long a scope's fair-queue state outlives its last job.
// The lists and sets delete themselves when they empty; while jobs wait
// nothing expires.
const fairTTL = 7 * 24 * time.Hour

// fairWeights are the priorities' weights as the scripts read them.
var fairWeights = func() string {
	parts := make([]string, 0, len(Priorities))
	for _, p := range Priorities {
		parts = append(parts, p+"="+strconv.Itoa(weights[p]))
	}
	return strings.Join(parts, ",")
}()

// fairPushScript adds jobs to a scope's fair queue, each once.
//
// KEYS[1] -> the scope's state (rkeys.FairState)
// KEYS[2] -> its priorities with work (rkeys.FairClasses)
// KEYS[3] -> its job ids waiting or released (rkeys.FairMembers)
// ARGV[1] -> now (redisclock.Arg)
// ARGV[2] -> the prefix of its per-priority and per-tenant keys (rkeys.FairQueue)
// ARGV[3] -> the state's TTL in ms
// then per job: id, priority, tenant, cost in tokens, the tenant's share
// ("" keeps the one known)
// Returns per job 1 when it was added, 0 when it was already waiting or
// released.
var fairPushScript = redis.NewScript(redisclock.Lua + `
local st, classes, members, prefix = KEYS[1], KEYS[2], KEYS[3], ARGV[2]
local at = string.format('%d', math.floor(now / 1000))
-- what the jobs add is gathered and written once a list, count and field
local added, lists, order, counts, fields, seenT, seenC = {}, {}, {}, {}, {}, {}, {}
for i = 4, #ARGV, 5 do
  local id, class, tenant, cost, share = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  added[#added + 1] = 0
  if redis.call('SADD', members, id) == 1 then
    added[#added] = 1
    local ct = class .. ':' .. tenant
    local list = prefix .. 'list:' .. ct
    if not lists[list] then lists[list] = {}; order[#order + 1] = list end
    local l = lists[list]
    l[#l + 1] = id .. '|' .. cost .. '|' .. at
    if share ~= '' then fields['s:' .. tenant] = share end
    counts['n:' .. ct] = (counts['n:' .. ct] or 0) + 1
    fields['w:' .. id] = ct
    -- a tenant (or priority) that starts waiting starts at the virtual
    -- time, or after its last finish if that is later
    if not seenT[ct] then
      seenT[ct] = true
      local tenants = prefix .. 'tenants:' .. class
      if not redis.call('ZSCORE', tenants, tenant) then
        local vf = redis.call('HMGET', st, 'v:' .. class, 'f:' .. ct)
        redis.call('ZADD', tenants, math.max(tonumber(vf[1]) or 0, tonumber(vf[2]) or 0), tenant)
      end
    end
    if not seenC[class] then
      seenC[class] = true
      if not redis.call('ZSCORE', classes, class) then
        local vf = redis.call('HMGET', st, 'vc', 'fc:' .. class)
        redis.call('ZADD', classes, math.max(tonumber(vf[1]) or 0, tonumber(vf[2]) or 0), class)
      end
    end
  end
end
for _, list in ipairs(order) do redis.call('RPUSH', list, unpack(lists[list])) end
for k, n in pairs(counts) do redis.call('HINCRBY', st, k, n) end
local args = {}
for k, v in pairs(fields) do local n = #args; args[n + 1], args[n + 2] = k, v end
if #args > 0 then redis.call('HSET', st, unpack(args)) end
redis.call('PEXPIRE', st, ARGV[3])
return added
`)

// fairReleaseScript takes from a scope's fair queue, in fair order, the jobs
// the scope's limits have room for, and counts them released.
//
// KEYS[1] -> the scope's state (rkeys.FairState)
// KEYS[2] -> its priorities with work (rkeys.FairClasses)
// KEYS[3] -> its job ids waiting or released (rkeys.FairMembers)
// KEYS[4] -> its released jobs not yet started (rkeys.FairOut)
// ARGV[1] -> now (redisclock.Arg)
// ARGV[2] -> the prefix of its per-priority and per-tenant keys
// ARGV[3] -> the state's TTL in ms
// ARGV[4] -> the tokens the limits have room for (before what is released
// and not yet started), or "inf"
// ARGV[5] -> the requests they have room for, likewise
// ARGV[6] -> the most jobs released and not yet started
// ARGV[7] -> what the limiter counts per token of a job's cost (its prompt
// calibration, roughly)
// ARGV[8] -> "1" to release the next job even if it does not fit, when none
// is released and not started (a job larger than the room there can be)
// ARGV[9] -> the priorities' weights, "name=w,..."
// Returns {1 when no job waits any more, else 0, then per released job: id,
// priority, tenant, cost, ms it waited}.
var fairReleaseScript = redis.NewScript(redisclock.Lua + `
local st, classes, members, out = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, nowms = ARGV[2], math.floor(now / 1000)
local tokens, reqs = tonumber(ARGV[4]) or math.huge, tonumber(ARGV[5]) or math.huge
local maxout, factor, force = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'
local weights = {}
for name, w in string.gmatch(ARGV[9], '([^=,]+)=([^,]+)') do weights[name] = tonumber(w) end

local outn = redis.call('ZCARD', out)
tokens = tokens - (tonumber(redis.call('HGET', st, 'outsum')) or 0)
reqs = reqs - outn
local res = {0}

-- What the released jobs change is gathered and written at the end: the
-- loop reads none of it. fields are the state's fields set (the last
-- value of each), counts the waiting counts' decrements.
local fields, counts, gone, outs, outsum = {}, {}, {}, {}, 0

-- The job with the lowest tag goes first: that of the head of the lowest
-- tenant of the lowest priority (both sorted sets order equal tags by
-- name). A run takes the jobs of one tenant in a row while its tag and
-- its priority's stay below the next tenant's and the next priority's;
-- the sets are written when it ends, the list trimmed by what it took.
-- at most this many entries a call (released, or cancelled jobs dropped
-- as they come up): the writes stay within what unpack takes
local budget = 1000
local chunk = 64
local stop = false
while not stop and budget > 0 and outn < maxout do
  local c = redis.call('ZRANGE', classes, 0, 1, 'WITHSCORES')
  if #c == 0 then break end
  local class, ctag = c[1], tonumber(c[2])
  local cnext = tonumber(c[4])
  local tenants = prefix .. 'tenants:' .. class
  local t = redis.call('ZRANGE', tenants, 0, 1, 'WITHSCORES')
  if #t == 0 then
    redis.call('ZREM', classes, class)
  else
    local tenant, ttag = t[1], tonumber(t[2])
    local tnext = tonumber(t[4])
    local ct = class .. ':' .. tenant
    local list = prefix .. 'list:' .. ct
    local share = tonumber(redis.call('HGET', st, 's:' .. tenant)) or 1
    local weight = weights[class] or 1
    -- taken: entries of the list the run took (released, or cancelled and
    -- dropped); fetched: entries read; short: the last read was its end
    local taken, fetched, short, released = 0, 0, false, false
    local run = true
    while run do
      local heads = redis.call('LRANGE', list, fetched, fetched + chunk - 1)
      fetched, short = fetched + #heads, #heads < chunk
      if short then run = false end
      for k = 1, #heads do
        if budget <= 0 or outn >= maxout then run, stop = false, true; break end
        budget = budget - 1
        local head = heads[k]
        local a, b = string.find(head, '|', 1, true)
        local c2 = string.find(head, '|', b + 1, true)
        local id, cost, at = string.sub(head, 1, a - 1), tonumber(string.sub(head, b + 1, c2 - 1)), tonumber(string.sub(head, c2 + 1))
        local member = redis.call('SISMEMBER', members, id) == 1
        if member and (cost * factor > tokens or reqs < 1) and not (force and outn == 0) then
          run, stop = false, true
          break
        end
        taken = taken + 1
        if member then
          gone[#gone + 1] = 'w:' .. id
          counts['n:' .. ct] = (counts['n:' .. ct] or 0) + 1
          tokens, reqs, outn = tokens - cost * factor, reqs - 1, outn + 1
          local f = ttag + cost / share
          local fc = ctag + cost / weight
          fields['v:' .. class], fields['f:' .. ct] = ttag, f
          fields['vc'], fields['fc:' .. class] = ctag, fc
          fields['o:' .. id] = (cost * factor) .. '|' .. class
          outsum = outsum + cost * factor
          local n = #outs
          outs[n + 1], outs[n + 2] = nowms, id
          n = #res
          res[n + 1], res[n + 2], res[n + 3], res[n + 4], res[n + 5] = id, class, tenant, cost, nowms - at
          -- the next job of the tenant, and of the priority, start where
          -- this one finishes
          ttag, ctag, released = f, fc, true
          -- another tenant or priority is next: the run ends
          if (tnext and ttag >= tnext) or (cnext and ctag >= cnext) then
            run = false
            break
          end
        end
      end
    end
    -- the list is empty when the run took all it read, and read its end
    -- (or nothing follows)
    local empty = taken == fetched and (short or redis.call('LLEN', list) == taken)
    if taken > 0 then redis.call('LTRIM', list, taken, -1) end
    if empty then
      redis.call('ZREM', tenants, tenant)
    elseif released then
      redis.call('ZADD', tenants, ttag, tenant)
    end
    if empty and not tnext then
      redis.call('ZREM', classes, class)
    else
      redis.call('ZADD', classes, ctag, class)
    end
  end
end
local args = {}
for k, v in pairs(fields) do local n = #args; args[n + 1], args[n + 2] = k, v end
if #args > 0 then redis.call('HSET', st, unpack(args)) end
for k, n in pairs(counts) do redis.call('HINCRBY', st, k, -n) end
if #gone > 0 then redis.call('HDEL', st, unpack(gone)) end
if #outs > 0 then redis.call('ZADD', out, unpack(outs)) end
if outsum ~= 0 then redis.call('HINCRBYFLOAT', st, 'outsum', outsum) end
if redis.call('ZCARD', classes) == 0 then res[1] = 1 end
redis.call('PEXPIRE', st, ARGV[3])
return res
`)

// fairForgetScript forgets a job: a worker has its permit, or it was
// cancelled. A waiting job is dropped from its tenant's count at once (its
// place in the list when its turn comes); a released one stops counting as
// released.
//
// KEYS[1] -> the scope's state
// KEYS[2] -> its job ids waiting or released
// KEYS[3] -> its released jobs not yet started
// ARGV[i] -> the job ids
// Returns how many of them were released and not yet started.
var fairForgetScript = redis.NewScript(`
local st, n = KEYS[1], 0
-- the ids' fields, read at once; the state's changes written at once
local f = {}
for i, id in ipairs(ARGV) do f[2 * i - 1], f[2 * i] = 'w:' .. id, 'o:' .. id end
local v = redis.call('HMGET', st, unpack(f))
local counts, gone, outsum = {}, {}, 0
for i, id in ipairs(ARGV) do
  if redis.call('SREM', KEYS[2], id) == 1 then
    local w = v[2 * i - 1]
    if w then
      counts[w] = (counts[w] or 0) + 1
      gone[#gone + 1] = 'w:' .. id
    end
  end
  if redis.call('ZREM', KEYS[3], id) == 1 then
    n = n + 1
    local o = v[2 * i]
    if o then
      outsum = outsum + tonumber(string.match(o, '^[^|]+'))
      gone[#gone + 1] = 'o:' .. id
    end
  end
end
for w, c in pairs(counts) do redis.call('HINCRBY', st, 'n:' .. w, -c) end
if #gone > 0 then redis.call('HDEL', st, unpack(gone)) end
if outsum ~= 0 then redis.call('HINCRBYFLOAT', st, 'outsum', -outsum) end
return n
`)

// fairStaleScript lists the jobs released long ago and not yet started.
//
// KEYS[1] -> the scope's state
// KEYS[2] -> its released jobs not yet started
// ARGV[1] -> now (redisclock.Arg)
// ARGV[2] -> how long ago in ms a job was released at the latest
// ARGV[3] -> the most jobs to list
// Returns {per job: id, its state's o: field or ""}, oldest first.
var fairStaleScript = redis.NewScript(redisclock.Lua + `
local max = string.format('%d', math.floor(now / 1000) - tonumber(ARGV[2]))
local res = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', max, 'LIMIT', 0, tonumber(ARGV[3]))) do
  res[#res + 1], res[#res + 2] = id, redis.call('HGET', KEYS[1], 'o:' .. id) or ''
end
return res
`)

// fairWaitingScript reads what waits in a scope's fair queue.
//
// KEYS[1] -> the scope's state
// KEYS[2] -> its priorities with work
// KEYS[3] -> its released jobs not yet started
// ARGV[1] -> the prefix of its per-priority and per-tenant keys
// Returns {released and not started, then per priority and tenant with
// work: priority, tenant, jobs waiting, when the oldest was queued (ms)}.
var fairWaitingScript = redis.NewScript(`
local out = {redis.call('ZCARD', KEYS[3])}
for _, class in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  for _, tenant in ipairs(redis.call('ZRANGE', ARGV[1] .. 'tenants:' .. class, 0, -1)) do
    local head = redis.call('LINDEX', ARGV[1] .. 'list:' .. class .. ':' .. tenant, 0)
    local at = 0
    if head then at = tonumber(string.match(head, '([^|]+)$')) end
    local k = #out
    out[k + 1], out[k + 2], out[k + 4] = class, tenant, at
    out[k + 3] = tonumber(redis.call('HGET', KEYS[1], 'n:' .. class .. ':' .. tenant)) or 0
  end
end
return out
`)

// fair is a Client's fair queue; nil when the client has no Redis client.
type fair struct {
	rdb  redis.UniversalClient
	keys rkeys.Builder
	// clock, when set (tests), is the scripts' time instead of Redis TIME.
	clock func() time.Time

	// The pushes of single jobs and the forgets of one scope made while
	// another is under way go together in the next script run.
	pushes  coalesce.Batch[string, JobRef, bool]
	forgets coalesce.Batch[string, string, struct{}]
}

// fairChunk is the most jobs one push or forget script run takes: the
// scripts write them with one command each, within what Lua's unpack takes.
const fairChunk = 500

// groupTimeout bounds a grouped script run: it is everyone's, so no
// caller's context cancels it.
const groupTimeout = 10 * time.Second

func newFair(rdb redis.UniversalClient, keys rkeys.Builder) *fair {
	f := &fair{rdb: rdb, keys: keys}
	f.pushes.Fn = func(ctx context.Context, scope string, refs []JobRef) ([]bool, []error) {
		ctx, cancel := context.WithTimeout(ctx, groupTimeout)
		defer cancel()
		added, err := f.pushAll(ctx, scope, refs)
		return added, sameErr(len(refs), err)
	}
	f.forgets.Fn = func(ctx context.Context, scope string, ids []string) ([]struct{}, []error) {
		ctx, cancel := context.WithTimeout(ctx, groupTimeout)
		defer cancel()
		return nil, sameErr(len(ids), f.forgetAll(ctx, scope, ids))
	}
	return f
}

// sameErr is err for each of n inputs, nil when err is.
func sameErr(n int, err error) []error {
	if err == nil {
		return nil
	}
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// fairRef reports whether ref goes to the fair queue: a job to run now,
// whose model is known.
func (c *Client) fairRef(ref JobRef) bool {
	return c.fair != nil && ref.In <= 0 && ref.Scope != ""
}

// push adds refs, all of one scope, to the fair queue, and returns how
// many it added.
func (f *fair) push(ctx context.Context, scope string, refs []JobRef) (int, error) {
	if len(refs) == 1 {
		added, err := f.pushes.Do(ctx, scope, refs[0])
		if added {
			return 1, err
		}
		return 0, err
	}
	added, err := f.pushAll(ctx, scope, refs)
	n := 0
	for _, a := range added {
		if a {
			n++
		}
	}
	return n, err
}

// pushAll adds refs, all of one scope, to the fair queue, and says which
// it added. Then the scope is listed, after its jobs are in: the
// scheduler that takes it off when empty looks again (Release). On one
// Redis server the last script run and the listing go in one pipeline,
// which the server runs in order.
func (f *fair) pushAll(ctx context.Context, scope string, refs []JobRef) ([]bool, error) {
	added := make([]bool, 0, len(refs))
	_, cluster := f.rdb.(*redis.ClusterClient)
	keys := []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairMembers(scope)}
	for len(refs) > 0 {
		n := min(len(refs), fairChunk)
		args := make([]any, 0, 3+5*n)
		args = append(args, redisclock.Arg(f.clock), f.keys.FairQueue(scope), fairTTL.Milliseconds())
		for _, r := range refs[:n] {
			share := ""
			if r.Share > 0 {
				share = strconv.FormatFloat(r.Share, 'g', -1, 64)
			}
			args = append(args, r.ID, r.Queue, r.TenantID, max(r.Cost, 1), share)
		}
		refs = refs[n:]
		var (
			v   []int64
			err error
		)
		if len(refs) == 0 && !cluster {
			v, err = f.pushAndList(ctx, scope, keys, args)
			if err == nil {
				return appendAdded(added, v), nil
			}
		} else {
			v, err = fairPushScript.Run(ctx, f.rdb, keys, args...).Int64Slice()
		}
		if err != nil {
			return added, fmt.Errorf("fair queue of %s: %w", scope, err)
		}
		added = appendAdded(added, v)
	}
	if err := f.rdb.SAdd(ctx, f.keys.FairScopes(), scope).Err(); err != nil {
		return added, fmt.Errorf("fair queue scopes: %w", err)
	}
	return added, nil
}

// pushAndList runs the push script and lists the scope in one pipeline.
// A server that does not have the script yet lists the scope before the
// push: the script is run again, loading it, and the scope listed again.
func (f *fair) pushAndList(ctx context.Context, scope string, keys []string, args []any) ([]int64, error) {
	var push *redis.Cmd
	var list *redis.IntCmd
	_, err := f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		push = fairPushScript.EvalSha(ctx, p, keys, args...)
		list = p.SAdd(ctx, f.keys.FairScopes(), scope)
		return nil
	})
	if err != nil && redis.HasErrorPrefix(push.Err(), "NOSCRIPT") {
		v, err := fairPushScript.Run(ctx, f.rdb, keys, args...).Int64Slice()
		if err != nil {
			return nil, err
		}
		return v, f.rdb.SAdd(ctx, f.keys.FairScopes(), scope).Err()
	}
	if err != nil {
		return nil, err
	}
	if err := list.Err(); err != nil {
		return nil, err
	}
	return push.Int64Slice()
}

func appendAdded(added []bool, v []int64) []bool {
	for _, x := range v {
		added = append(added, x == 1)
	}
	return added
}

// Room is what a scope's limits admit now, for Release: tokens and requests
// (math.Inf(1) for none), before what is released and not yet started.
type Room struct {
	Tokens, Requests float64
	// Factor is what the limiter counts per token of a job's estimate.
	// Defaults to 1.
	Factor float64
	// MaxOutstanding bounds the jobs released and not yet started.
	MaxOutstanding int
	// Force releases the next job even if it does not fit, when nothing is
	// outstanding: a job larger than the room the limits ever show.
	Force bool
}

// Released is a job the fair queue released into asynq's queue.
type Released struct {
	ID, Queue, TenantID string
	Cost                int64
	// Waited is how long it waited in the fair queue.
	Waited time.Duration
}

// Scopes returns the scopes whose fair queue holds jobs.
func (c *Client) Scopes(ctx context.Context) ([]string, error) {
	if c.fair == nil {
		return nil, nil
	}
	return c.fair.rdb.SMembers(ctx, c.fair.keys.FairScopes()).Result()
}

// Release takes from scope's fair queue the jobs room has space for, in
// fair order, and enqueues their tasks. A job whose task already exists
// (a worker runs it) is forgotten at once. empty reports that nothing
// waits any more; the scope then leaves Scopes until a job comes.
func (c *Client) Release(ctx context.Context, scope string, room Room) (released []Released, empty bool, err error) {
	if c.fair == nil {
		return nil, true, nil
	}
	f := c.fair
	if room.Factor <= 0 {
		room.Factor = 1
	}
	num := func(v float64) string {
		if v > 1e15 {
			return "inf"
		}
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	force := "0"
	if room.Force {
		force = "1"
	}
	keys := []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairMembers(scope), f.keys.FairOut(scope)}
	v, err := fairReleaseScript.Run(ctx, f.rdb, keys, redisclock.Arg(f.clock), f.keys.FairQueue(scope), fairTTL.Milliseconds(),
		num(room.Tokens), num(room.Requests), max(room.MaxOutstanding, 1), strconv.FormatFloat(room.Factor, 'g', -1, 64), force, fairWeights).Slice()
	if err != nil {
		return nil, false, fmt.Errorf("release the fair queue of %s: %w", scope, err)
	}
	if len(v) == 0 || (len(v)-1)%5 != 0 {
		return nil, false, fmt.Errorf("release the fair queue of %s: unexpected reply %v", scope, v)
	}
	empty = v[0] == int64(1)
	for i := 1; i+4 < len(v); i += 5 {
		id, _ := v[i].(string)
		q, _ := v[i+1].(string)
		tenant, _ := v[i+2].(string)
		cost, _ := v[i+3].(int64)
		waited, _ := v[i+4].(int64)
		released = append(released, Released{ID: id, Queue: q, TenantID: tenant, Cost: cost, Waited: time.Duration(waited) * time.Millisecond})
	}
	// The script took these jobs: their tasks are enqueued even when the
	// caller stops meanwhile (a process shutting down), or they would wait
	// for RequeueStale.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// The tasks are independent: their enqueues go in one round trip.
	enqueued, errs := make([]bool, len(released)), make([]error, len(released))
	steps := make([]func(context.Context), len(released))
	for i, r := range released {
		steps[i] = func(ctx context.Context) { enqueued[i], errs[i] = c.enqueueTask(ctx, JobRef{ID: r.ID, Queue: r.Queue}) }
	}
	redisbatch.Run(ectx, steps...)
	if err := errors.Join(errs...); err != nil {
		// Those left released are enqueued again by RequeueStale.
		return released, false, err
	}
	for i, r := range released {
		if !enqueued[i] {
			if err := c.Started(ectx, scope, r.ID); err != nil {
				return released, false, err
			}
		}
	}
	if empty {
		if err := f.rdb.SRem(ctx, f.keys.FairScopes(), scope).Err(); err != nil {
			return released, empty, fmt.Errorf("fair queue scopes: %w", err)
		}
		// A job pushed meanwhile listed the scope before this took it off:
		// look again.
		if n, err := f.rdb.ZCard(ctx, f.keys.FairClasses(scope)).Result(); err == nil && n > 0 {
			err = f.rdb.SAdd(ctx, f.keys.FairScopes(), scope).Err()
			empty = false
			if err != nil {
				return released, empty, err
			}
		}
	}
	return released, empty, nil
}

// Started forgets job id of scope in the fair queue: a worker has it. It
// is a no-op for a job that never went through it.
func (c *Client) Started(ctx context.Context, scope, id string) error {
	if c.fair == nil || scope == "" {
		return nil
	}
	return c.fair.forget(ctx, scope, id)
}

// forget forgets job id of scope, in one script run with the forgets of
// the scope made meanwhile.
func (f *fair) forget(ctx context.Context, scope, id string) error {
	if _, err := f.forgets.Do(ctx, scope, id); err != nil {
		return fmt.Errorf("fair queue of %s: forget %s: %w", scope, id, err)
	}
	return nil
}

// forgetAll forgets ids of scope, at most fairChunk a script run (the
// script reads all their fields in one command).
func (f *fair) forgetAll(ctx context.Context, scope string, ids []string) error {
	keys := []string{f.keys.FairState(scope), f.keys.FairMembers(scope), f.keys.FairOut(scope)}
	for len(ids) > 0 {
		n := min(len(ids), fairChunk)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		if err := fairForgetScript.Run(ctx, f.rdb, keys, args...).Err(); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// Placement says where job id of scope is in the fair queue: "waiting",
// "released" (its task enqueued or about to be, no worker has it yet), or
// "" when it is in neither (a worker has it, or it never went through).
func (c *Client) Placement(ctx context.Context, scope, id string) (string, error) {
	if c.fair == nil || scope == "" {
		return "", nil
	}
	f := c.fair
	member, err := f.rdb.SIsMember(ctx, f.keys.FairMembers(scope), id).Result()
	if err != nil || !member {
		return "", err
	}
	if err := f.rdb.ZScore(ctx, f.keys.FairOut(scope), id).Err(); err == nil {
		return "released", nil
	} else if !errors.Is(err, redis.Nil) {
		return "", err
	}
	return "waiting", nil
}

// Dequeue takes job id out of scope's fair queue (it was cancelled): it
// no longer counts as waiting and will not be released; its place in the
// list is dropped when it comes up.
func (c *Client) Dequeue(ctx context.Context, scope, id string) error {
	if c.fair == nil || scope == "" {
		return nil
	}
	return c.fair.forget(ctx, scope, id)
}

// RequeueStale enqueues again the tasks of jobs released longer than age
// ago and not yet started (the scheduler stopped between taking them and
// enqueueing their task), and returns how many it looked at.
func (c *Client) RequeueStale(ctx context.Context, scope string, age time.Duration) (int, error) {
	if c.fair == nil {
		return 0, nil
	}
	f := c.fair
	v, err := fairStaleScript.Run(ctx, f.rdb, []string{f.keys.FairState(scope), f.keys.FairOut(scope)},
		redisclock.Arg(f.clock), age.Milliseconds(), 100).StringSlice()
	if err != nil {
		return 0, fmt.Errorf("fair queue of %s: stale jobs: %w", scope, err)
	}
	if len(v)%2 != 0 {
		return 0, fmt.Errorf("fair queue of %s: unexpected stale reply %v", scope, v)
	}
	for i := 0; i+1 < len(v); i += 2 {
		id, o := v[i], v[i+1]
		_, q, ok := strings.Cut(o, "|")
		if !ok || !ValidPriority(q) {
			q = Default
		}
		if _, err := c.enqueueTask(ctx, JobRef{ID: id, Queue: q}); err != nil {
			return i / 2, err
		}
		// The task exists now: the job counts as started, whatever the
		// worker says later.
		if err := c.Started(ctx, scope, id); err != nil {
			return i / 2, err
		}
	}
	return len(v) / 2, nil
}

// TenantWaiting is what one tenant has waiting for a model at a priority.
type TenantWaiting struct {
	Queue, TenantID string
	Jobs            int64
	// Oldest is when its oldest waiting job was queued.
	Oldest time.Time
}

// Waiting returns what waits in scope's fair queue, per priority and
// tenant, and how many jobs are released and not yet started.
func (c *Client) Waiting(ctx context.Context, scope string) ([]TenantWaiting, int64, error) {
	if c.fair == nil {
		return nil, 0, nil
	}
	f := c.fair
	v, err := fairWaitingScript.Run(ctx, f.rdb, []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairOut(scope)},
		f.keys.FairQueue(scope)).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("fair queue of %s: %w", scope, err)
	}
	if len(v) == 0 || (len(v)-1)%4 != 0 {
		return nil, 0, errors.New("fair queue: unexpected waiting reply")
	}
	out, _ := v[0].(int64)
	var ws []TenantWaiting
	for i := 1; i+3 < len(v); i += 4 {
		q, _ := v[i].(string)
		tenant, _ := v[i+1].(string)
		n, _ := v[i+2].(int64)
		at, _ := v[i+3].(int64)
		ws = append(ws, TenantWaiting{Queue: q, TenantID: tenant, Jobs: n, Oldest: time.UnixMilli(at)})
	}
	return ws, out, nil
}
