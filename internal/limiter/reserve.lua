-- Decides, in order, a batch of reservations on one scope: for each, it
-- checks every bucket, the penalty and the probe, and takes the cost from
-- all buckets or from none, as if each ran alone at the same instant.
-- KEYS[1] -> the scope's hash (rkeys.LimiterScope), its state as lua.go lists
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2] -> probe timeout in µs
-- ARGV[3] -> longest retry while a probe is in flight, in µs
-- ARGV[4] -> the number of bucket lists that follow, each: n, then n
--   buckets of name, limit, period in µs, burst window in µs (0: none)
-- then the reservations, each: its bucket list (1-based), mode (MODE_*:
--   "r" reserve, "h" reserve and hold in flight until reconciled, "l"
--   reserve for a lease, never the probe, "s" state: no writes), id, and
--   its cost in each bucket of its list
-- Returns {now, then per reservation: status, retry µs, held, then per
-- bucket: remaining, retry µs, reset µs, taken a moment before, taken just
-- before, what its pace lets out now (-1 when no burst bounds it)}.
--   status is STATUS_*: 0 denied by a bucket, 1 allowed, 2 allowed as the
--   probe, 3 denied by a penalty, 4 denied while a probe is in flight.
--   held is 1 when the retry is the time until what reservations hold in
--   flight lapses (which a reconcile may free sooner), else 0.
--   A bucket's retry is when it covers the cost if nothing is taken or
--   reconciled meanwhile: its refill, and the ends of the in-flight
--   generations holding it back.
--   The totals taken (a moment before the reservation, and just before
--   it) are for Settle.
local ceil, floor = math.ceil, math.floor
local key = KEYS[1]
local probe_timeout, probe_retry = tonumber(ARGV[2]), tonumber(ARGV[3])

local st, old_fields = load_state(key)
local penalty_until, probe_id, probe_deadline = tonumber(st.pu), st.pid, tonumber(st.pt)
local new_probe = false

-- The bucket lists, as lists of names, and the buckets by name
-- (load_bucket), each as the first list naming it gives it, with lag what
-- it had taken a moment ago (lag_of).
local lists, buckets = {}, {}
local arg = 5
for l = 1, tonumber(ARGV[4]) do
  local n = tonumber(ARGV[arg])
  local names = {}
  for i = 1, n do
    local at = arg + 4 * (i - 1)
    local name, limit, period, burst_window = ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
    names[i] = name
    if not buckets[name] then
      local b = load_bucket(st, name, limit, period, burst_window)
      b.lag = lag_of(st, name)
      buckets[name] = b
    end
  end
  lists[l] = names
  arg = arg + 1 + 4 * n
end

-- the buckets taken from, to write
local written = {}
local out = {now}
local waits = {}
while arg <= #ARGV do
  local names, mode, id = lists[tonumber(ARGV[arg])], ARGV[arg + 1], ARGV[arg + 2]
  -- ARGV[costs + i] is the cost in bucket i
  local costs = arg + 2
  -- retry is the longest wait; held_wait the longest set by what is in
  -- flight, refill_wait the longest set by refill
  local status, retry, held_wait, refill_wait = STATUS_ALLOWED, 0, 0, 0
  for i = 1, #names do
    local b = buckets[names[i]]
    local cap = b.cap
    -- a cost above what the bucket holds now (it learned a lower limit)
    -- needs it empty
    local cost = math.min(tonumber(ARGV[costs + i]), cap)
    -- a trillionth of the capacity absorbs float rounding
    local tolerance = cap * 1e-12
    local wait, need = 0, b.base + cost - cap
    if need > tolerance then wait = ceil(need / b.rate) end
    -- what is in flight stops holding the bucket back when its generation
    -- and the next one are over
    local inflight, inflight_wait = b.inflight, 0
    if inflight.current + inflight.previous + cost - cap > tolerance then
      local generations = inflight.current + cost - cap > tolerance and 2 or 1
      inflight_wait = (inflight.gen + generations) * INFLIGHT_GEN - now
    end
    -- the pace holds the cost, or its whole burst for a cost above it
    if b.pace then
      local pace_need = math.min(tonumber(ARGV[costs + i]), b.burst) - b.pace
      if pace_need > tolerance then wait = math.max(wait, ceil(pace_need / b.pace_rate)) end
    end
    if inflight_wait > wait then
      wait = inflight_wait
      if wait > held_wait then held_wait = wait end
    elseif wait > refill_wait then
      refill_wait = wait
    end
    if wait > 0 then status = STATUS_DENIED end
    if wait > retry then retry = wait end
    waits[i] = wait
  end
  local held = held_wait > refill_wait

  if penalty_until then
    if penalty_until > now then
      status = STATUS_PENALTY
      if penalty_until - now >= retry then retry, held = penalty_until - now, false end
    elseif probe_id and probe_deadline and probe_deadline > now then
      status = STATUS_PROBE_WAIT
      local wait = math.min(probe_deadline - now, probe_retry)
      if wait >= retry then retry, held = wait, false end
    elseif status == STATUS_ALLOWED and mode ~= MODE_STATE then
      -- the penalty is over and no probe is in flight: this caller probes,
      -- unless it is a prefetch, which never does
      if mode == MODE_PREFETCH then
        status, retry = STATUS_PROBE_WAIT, probe_retry
      else
        status, probe_id, probe_deadline, new_probe = STATUS_PROBE, id, now + probe_timeout, true
      end
    end
  end

  local take = (status == STATUS_ALLOWED or status == STATUS_PROBE) and mode ~= MODE_STATE
  local k = #out
  out[k + 1], out[k + 2], out[k + 3] = status, retry, held and 1 or 0
  for i = 1, #names do
    local name = names[i]
    local b = buckets[name]
    local taken_before = b.taken
    if take then
      local cost = tonumber(ARGV[costs + i])
      if b.pace then b.pace = b.pace - cost end
      b.level = b.level + cost
      b.base = b.level
      b.taken = b.taken + cost
      written[name] = true
      if mode == MODE_HOLD then
        local inflight = b.inflight
        if inflight.gen == gen then
          inflight.current = inflight.current + cost
        else
          inflight.previous = inflight.previous + cost
        end
      end
    end
    local k = #out
    out[k + 1], out[k + 2], out[k + 3] = floor(b.cap - b.level), waits[i], ceil(b.level / b.rate)
    out[k + 4], out[k + 5] = b.lag, taken_before
    out[k + 6] = b.pace and math.max(floor(b.pace), 0) or -1
  end
  arg = costs + #names + 1
end

local changes = {}
for name in pairs(written) do
  local b = buckets[name]
  put(changes, 'u:' .. name, b.level)
  put(changes, 't:' .. name, now)
  put(changes, 'g:' .. name, b.inflight.gen)
  put(changes, 'f0:' .. name, b.inflight.current)
  put(changes, 'f1:' .. name, b.inflight.previous)
  put(changes, 'c:' .. name, b.taken)
  put_lag(changes, name, b.taken)
  if b.pace then
    put(changes, 'pace:' .. name, b.pace)
    put(changes, 'pace_t:' .. name, now)
  end
end
if new_probe then
  put(changes, 'pid', probe_id)
  put(changes, 'pt', probe_deadline)
end
if #changes > 0 then
  -- The hash lives until every bucket is full, nothing is held in flight
  -- and no penalty or probe is pending, and never less than it would
  -- already: the other bucket lists of the scope may have used it.
  local ttl = 0
  for _, b in pairs(buckets) do ttl = math.max(ttl, idle_after(b.level, b.rate, b.inflight)) end
  if penalty_until then ttl = math.max(ttl, math.max(penalty_until - now, 0) + probe_timeout) end
  if probe_deadline then ttl = math.max(ttl, probe_deadline - now + probe_timeout) end
  save_state(key, st, old_fields, changes, {})
  extend_ttl(key, st, ttl)
end
return out
