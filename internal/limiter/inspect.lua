-- Reads a scope's buckets and what they learned, writing nothing.
-- KEYS[1] -> the scope's hash (rkeys.LimiterScope), its state as lua.go lists
-- ARGV[1] -> now in µs, or "" for Redis TIME
-- ARGV[2..] -> per bucket: name, limit, period in µs, burst window in µs
-- Returns {now, distrusted until (0 when not), calibration in millionths,
-- its samples, then per bucket: capacity, remaining, drain and factor in
-- millionths, refund sum, unused sum, provider remaining (-1 when none),
-- when it was seen (µs, 0 when never), burst factor in millionths, burst
-- (-1 when none), pace factor in millionths}.
local st = load_state(KEYS[1])
local distrusted_until = tonumber(st.hd) or 0
if distrusted_until <= now then distrusted_until = 0 end
local out = {now, distrusted_until, math.floor((tonumber(st.qm) or 1) * 1e6), tonumber(st.qn) or 0}
for i = 2, #ARGV, 4 do
  local name = ARGV[i]
  local b = load_bucket(st, name, tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]))
  local k = #out
  out[k + 1], out[k + 2] = math.floor(b.cap), math.floor(b.cap - b.level)
  out[k + 3] = math.floor((tonumber(st['e:' .. name]) or 0) * 1e6)
  out[k + 4] = math.floor(factor_of(st, name) * 1e6)
  out[k + 5], out[k + 6] = math.floor(tonumber(st['n:' .. name]) or 0), math.floor(tonumber(st['w:' .. name]) or 0)
  out[k + 7], out[k + 8] = tonumber(st['pr:' .. name]) or -1, tonumber(st['prt:' .. name]) or 0
  out[k + 9], out[k + 10] = math.floor(burst_factor_of(st, name) * 1e6), b.burst and math.floor(b.burst) or -1
  out[k + 11] = math.floor((tonumber(st['pace_m:' .. name]) or 1) * 1e6)
end
return out
