package queue

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// The fair queue's scripts as they were before they grouped their writes:
// one command per job and step. TestFairScriptsMatchTheReference runs them
// and the package's scripts on the same workloads and compares every job
// released and every key left.

var refPushScript = redis.NewScript(redisclock.Lua + `
local st, classes, members, prefix = KEYS[1], KEYS[2], KEYS[3], ARGV[2]
local at = string.format('%d', math.floor(now / 1000))
local added = {}
for i = 4, #ARGV, 5 do
  local id, class, tenant, cost, share = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  added[#added + 1] = 0
  if redis.call('SADD', members, id) == 1 then
    added[#added] = 1
    local list, tenants = prefix .. 'list:' .. class .. ':' .. tenant, prefix .. 'tenants:' .. class
    redis.call('RPUSH', list, id .. '|' .. cost .. '|' .. at)
    if share ~= '' then redis.call('HSET', st, 's:' .. tenant, share) end
    redis.call('HINCRBY', st, 'n:' .. class .. ':' .. tenant, 1)
    redis.call('HSET', st, 'w:' .. id, class .. ':' .. tenant)
    -- a tenant (or priority) that starts waiting starts at the virtual
    -- time, or after its last finish if that is later
    if not redis.call('ZSCORE', tenants, tenant) then
      local v = tonumber(redis.call('HGET', st, 'v:' .. class)) or 0
      local f = tonumber(redis.call('HGET', st, 'f:' .. class .. ':' .. tenant)) or 0
      redis.call('ZADD', tenants, math.max(v, f), tenant)
    end
    if not redis.call('ZSCORE', classes, class) then
      local v = tonumber(redis.call('HGET', st, 'vc')) or 0
      local f = tonumber(redis.call('HGET', st, 'fc:' .. class)) or 0
      redis.call('ZADD', classes, math.max(v, f), class)
    end
  end
end
redis.call('PEXPIRE', st, ARGV[3])
return added
`)

var refReleaseScript = redis.NewScript(redisclock.Lua + `
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
-- cancelled jobs are dropped as they come up, at most this many a call
local budget = 1000
while budget > 0 and outn < maxout do
  budget = budget - 1
  local c = redis.call('ZRANGE', classes, 0, 0, 'WITHSCORES')
  if #c == 0 then break end
  local class, ctag = c[1], tonumber(c[2])
  local tenants = prefix .. 'tenants:' .. class
  local t = redis.call('ZRANGE', tenants, 0, 0, 'WITHSCORES')
  if #t == 0 then
    redis.call('ZREM', classes, class)
  else
    local tenant, ttag = t[1], tonumber(t[2])
    local list = prefix .. 'list:' .. class .. ':' .. tenant
    local head = redis.call('LINDEX', list, 0)
    local id, cost, at
    if head then
      local a, b = string.find(head, '|', 1, true)
      local c2 = string.find(head, '|', b + 1, true)
      id, cost, at = string.sub(head, 1, a - 1), tonumber(string.sub(head, b + 1, c2 - 1)), tonumber(string.sub(head, c2 + 1))
    end
    local member = id and redis.call('SISMEMBER', members, id) == 1
    if member and (cost * factor > tokens or reqs < 1) and not (force and outn == 0) then break end
    if head then redis.call('LPOP', list) end
    if member then
      redis.call('HDEL', st, 'w:' .. id)
      redis.call('HINCRBY', st, 'n:' .. class .. ':' .. tenant, -1)
      tokens, reqs, outn = tokens - cost * factor, reqs - 1, outn + 1
      local share = tonumber(redis.call('HGET', st, 's:' .. tenant)) or 1
      local f = ttag + cost / share
      redis.call('HSET', st, 'v:' .. class, ttag, 'f:' .. class .. ':' .. tenant, f)
      local fc = ctag + cost / (weights[class] or 1)
      redis.call('HSET', st, 'vc', ctag, 'fc:' .. class, fc, 'o:' .. id, (cost * factor) .. '|' .. class)
      redis.call('HINCRBYFLOAT', st, 'outsum', cost * factor)
      redis.call('ZADD', out, nowms, id)
      res[#res + 1], res[#res + 2], res[#res + 3], res[#res + 4], res[#res + 5] = id, class, tenant, cost, nowms - at
      -- the next job of the tenant, and of the priority, start where this one finishes
      if redis.call('LLEN', list) > 0 then redis.call('ZADD', tenants, f, tenant) end
      ctag = fc
    end
    if redis.call('LLEN', list) == 0 then redis.call('ZREM', tenants, tenant) end
    if redis.call('ZCARD', tenants) == 0 then
      redis.call('ZREM', classes, class)
    else
      redis.call('ZADD', classes, ctag, class)
    end
  end
end
if redis.call('ZCARD', classes) == 0 then res[1] = 1 end
redis.call('PEXPIRE', st, ARGV[3])
return res
`)

var refForgetScript = redis.NewScript(`
local st, n = KEYS[1], 0
for _, id in ipairs(ARGV) do
  if redis.call('SREM', KEYS[2], id) == 1 then
    local w = redis.call('HGET', st, 'w:' .. id)
    if w then
      redis.call('HINCRBY', st, 'n:' .. w, -1)
      redis.call('HDEL', st, 'w:' .. id)
    end
  end
  if redis.call('ZREM', KEYS[3], id) == 1 then
    n = n + 1
    local o = redis.call('HGET', st, 'o:' .. id)
    if o then
      redis.call('HINCRBYFLOAT', st, 'outsum', -tonumber(string.match(o, '^[^|]+')))
      redis.call('HDEL', st, 'o:' .. id)
    end
  end
end
return n
`)

// fairScripts are a push, a release and a forget script.
type fairScripts struct{ push, release, forget *redis.Script }

// fairSide is one scope's fair queue driven through a set of scripts.
type fairSide struct {
	s    fairScripts
	rdb  redis.UniversalClient
	keys rkeys.Builder
}

func (f fairSide) pushJobs(ctx context.Context, now string, jobs [][5]string) ([]int64, error) {
	args := []any{now, f.keys.FairQueue(scope), fairTTL.Milliseconds()}
	for _, j := range jobs {
		args = append(args, j[0], j[1], j[2], j[3], j[4])
	}
	return f.s.push.Run(ctx, f.rdb, []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairMembers(scope)}, args...).Int64Slice()
}

func (f fairSide) releaseJobs(ctx context.Context, now string, room []any) ([]any, error) {
	keys := []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairMembers(scope), f.keys.FairOut(scope)}
	args := append([]any{now, f.keys.FairQueue(scope), fairTTL.Milliseconds()}, room...)
	return f.s.release.Run(ctx, f.rdb, keys, append(args, fairWeights)...).Slice()
}

func (f fairSide) forgetJobs(ctx context.Context, ids []string) (int64, error) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return f.s.forget.Run(ctx, f.rdb, []string{f.keys.FairState(scope), f.keys.FairMembers(scope), f.keys.FairOut(scope)}, args...).Int64()
}

// dump is every key of the side's scope, its name without the side's
// prefix, as a comparable string; outsum is returned apart (summed in
// another order, it may differ in its last digits).
func (f fairSide) dump(t *testing.T) (map[string]string, float64) {
	t.Helper()
	ctx := context.Background()
	prefix := f.keys.FairQueue(scope)
	keys, err := f.rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out, outsum := map[string]string{}, 0.0
	for _, k := range keys {
		var v string
		switch typ := f.rdb.Type(ctx, k).Val(); typ {
		case "hash":
			h := f.rdb.HGetAll(ctx, k).Val()
			if s, ok := h["outsum"]; ok {
				outsum, _ = strconv.ParseFloat(s, 64)
				delete(h, "outsum")
			}
			v = fmt.Sprint(h)
		case "zset":
			v = fmt.Sprint(f.rdb.ZRangeWithScores(ctx, k, 0, -1).Val())
		case "list":
			v = fmt.Sprint(f.rdb.LRange(ctx, k, 0, -1).Val())
		case "set":
			m := f.rdb.SMembers(ctx, k).Val()
			slices.Sort(m)
			v = fmt.Sprint(m)
		default:
			t.Fatalf("%s: unexpected type %s", k, typ)
		}
		out[strings.TrimPrefix(k, prefix)] = v
	}
	return out, outsum
}

// The package's fair-queue scripts, which group their writes and take a
// tenant's jobs in runs, do exactly what the one-command-a-step reference
// does: the same jobs released in the same order with the same waits, the
// same counts, and every key left the same (the released tokens' sum to
// rounding), over random pushes, releases within random rooms, and
// forgets of waiting, released and unknown jobs.
func TestFairScriptsMatchTheReference(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, redisDB)
	ctx := context.Background()
	prefix := testutil.Prefix(t)
	for seed := range 8 {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			ref := fairSide{fairScripts{refPushScript, refReleaseScript, refForgetScript}, rdb, rkeys.New(fmt.Sprintf("%s-ref%d", prefix, seed))}
			got := fairSide{fairScripts{fairPushScript, fairReleaseScript, fairForgetScript}, rdb, rkeys.New(fmt.Sprintf("%s-new%d", prefix, seed))}
			t.Cleanup(func() {
				for _, side := range []fairSide{ref, got} {
					for _, k := range rdb.Keys(ctx, side.keys.FairQueue(scope)+"*").Val() {
						rdb.Del(ctx, k)
					}
				}
			})
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			// Few tenants and shares of whole and repeating fractions make
			// equal tags, where the sets' order by name decides.
			tenants := []string{"ta", "tb", "tc", "td", "te"}[:2+seed%4]
			shares := []string{"", "1", "2", "0.5", "3"}
			costs := []int64{1, 3, 10, 100, 1000}
			var ids []string
			clock := time.UnixMilli(1_800_000_000_000)
			for step := range 200 {
				clock = clock.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
				now := redisclock.Arg(func() time.Time { return clock })
				var what string
				var a, b any
				var errA, errB error
				switch op := rng.IntN(10); {
				case op < 4:
					var jobs [][5]string
					for range 1 + rng.IntN(12) {
						id := fmt.Sprintf("job_%d", len(ids))
						if len(ids) > 0 && rng.IntN(8) == 0 {
							id = ids[rng.IntN(len(ids))] // pushed again
						} else {
							ids = append(ids, id)
						}
						cost := costs[rng.IntN(len(costs))] * int64(1+rng.IntN(3))
						jobs = append(jobs, [5]string{id, Priorities[rng.IntN(len(Priorities))], tenants[rng.IntN(len(tenants))],
							strconv.FormatInt(cost, 10), shares[rng.IntN(len(shares))]})
					}
					what = fmt.Sprint("push ", jobs)
					a, errA = ref.pushJobs(ctx, now, jobs)
					b, errB = got.pushJobs(ctx, now, jobs)
				case op < 7:
					tokens, reqs := "inf", "inf"
					if rng.IntN(2) == 0 {
						tokens = strconv.Itoa(rng.IntN(5000))
					}
					if rng.IntN(3) == 0 {
						reqs = strconv.Itoa(rng.IntN(10))
					}
					room := []any{tokens, reqs, 1 + rng.IntN(40), []string{"1", "1.3", "0.7"}[rng.IntN(3)], []string{"0", "1"}[rng.IntN(2)]}
					what = fmt.Sprint("release ", room)
					a, errA = ref.releaseJobs(ctx, now, room)
					b, errB = got.releaseJobs(ctx, now, room)
				default:
					var forget []string
					for range 1 + rng.IntN(8) {
						if len(ids) == 0 || rng.IntN(10) == 0 {
							forget = append(forget, "job_unknown")
						} else {
							forget = append(forget, ids[rng.IntN(len(ids))])
						}
					}
					what = fmt.Sprint("forget ", forget)
					a, errA = ref.forgetJobs(ctx, forget)
					b, errB = got.forgetJobs(ctx, forget)
				}
				if errA != nil || errB != nil {
					t.Fatalf("step %d %s: reference %v, package %v", step, what, errA, errB)
				}
				if fmt.Sprint(a) != fmt.Sprint(b) {
					t.Fatalf("step %d %s:\nreference %v\npackage   %v", step, what, a, b)
				}
				da, sa := ref.dump(t)
				db, sb := got.dump(t)
				if !maps.Equal(da, db) {
					t.Fatalf("step %d %s: keys differ:\nreference %v\npackage   %v", step, what, da, db)
				}
				if math.Abs(sa-sb) > 1e-6*max(1, math.Abs(sa)) {
					t.Fatalf("step %d %s: outsum %v, reference %v", step, what, sb, sa)
				}
			}
		})
	}
}

// redisCPU is testutil.RedisCPU, failing b when INFO does not say.
func redisCPU(b *testing.B, rdb redis.UniversalClient) time.Duration {
	b.Helper()
	d, ok := testutil.RedisCPU(context.Background(), rdb)
	if !ok {
		b.Fatal("INFO cpu: no used_cpu_user and used_cpu_sys")
	}
	return d
}

// BenchmarkFairQueueCycle takes 50 jobs of one tenant, or of four, through the fair
// queue as the pipeline does (pushed five at a time, released 25 at a
// time, forgotten three at a time), with the package's scripts and with
// the reference (one command a step), and reports Redis's CPU and the
// scripts' commands per job.
//
//	go test -run '^$' -bench FairQueueCycle ./internal/queue
func BenchmarkFairQueueCycle(b *testing.B) {
	rdb := testutil.Redis(b, redisDB)
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		s       fairScripts
		tenants int
	}{
		{"reference/1-tenant", fairScripts{refPushScript, refReleaseScript, refForgetScript}, 1},
		{"package/1-tenant", fairScripts{fairPushScript, fairReleaseScript, fairForgetScript}, 1},
		{"reference/4-tenants", fairScripts{refPushScript, refReleaseScript, refForgetScript}, 4},
		{"package/4-tenants", fairScripts{fairPushScript, fairReleaseScript, fairForgetScript}, 4},
	} {
		b.Run(c.name, func(b *testing.B) {
			side := fairSide{c.s, rdb, rkeys.New(testutil.Prefix(b))}
			b.Cleanup(func() {
				for _, k := range rdb.Keys(ctx, side.keys.FairQueue(scope)+"*").Val() {
					rdb.Del(ctx, k)
				}
			})
			const jobs = 50
			room := []any{"inf", "inf", 25, "1", "0"}
			var seq int
			calls0 := rdb.Info(ctx, "commandstats").Val()
			cpu0 := redisCPU(b, rdb)
			b.ResetTimer()
			for range b.N {
				var ids []string
				for i := 0; i < jobs; i += 5 {
					var batch [][5]string
					for k := range 5 {
						seq++
						id := fmt.Sprintf("job_%d", seq)
						ids = append(ids, id)
						batch = append(batch, [5]string{id, Default, fmt.Sprintf("t%d", (i+k)%c.tenants), "100", ""})
					}
					if _, err := side.pushJobs(ctx, "", batch); err != nil {
						b.Fatal(err)
					}
				}
				for range 2 {
					if _, err := side.releaseJobs(ctx, "", room); err != nil {
						b.Fatal(err)
					}
				}
				for i := 0; i < len(ids); i += 3 {
					if _, err := side.forgetJobs(ctx, ids[i:min(i+3, len(ids))]); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			n := float64(b.N * jobs)
			b.ReportMetric(float64((redisCPU(b, rdb)-cpu0).Microseconds())/n, "redis-µs/job")
			b.ReportMetric(float64(innerCalls(rdb.Info(ctx, "commandstats").Val())-innerCalls(calls0))/n, "commands/job")
		})
	}
}

// innerCalls is the calls of every command but EVALSHA, INFO and KEYS in
// an INFO commandstats answer: what the scripts ran.
func innerCalls(info string) int64 {
	var total int64
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || name == "cmdstat_evalsha" || name == "cmdstat_eval" || strings.HasPrefix(name, "cmdstat_info") || name == "cmdstat_keys" {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, _ := strconv.ParseInt(n, 10, 64)
		total += v
	}
	return total
}
