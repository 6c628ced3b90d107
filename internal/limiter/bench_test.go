package limiter

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// benchCallers is the number of concurrent callers of the throughput
// benchmark.
const benchCallers = 50

// huge limits: the throughput benchmarks measure admissions, never denials.
var benchScope = modelScope("bench/model", 0, 1e12, 1e14, 0, 0)

// BenchmarkReserveVsRedisRate compares permits per second, with 50
// concurrent callers on one Redis, of redis_rate's AllowN on one bucket,
// Reserve on an RPM and a TPM bucket (one TokenBucket, as in one process,
// and one per caller), and a Lease on the same two buckets.
func BenchmarkReserveVsRedisRate(b *testing.B) {
	rdb := testutil.Redis(b, 1)
	ctx := context.Background()
	// run runs newTake's take on 50 goroutines; newTake is called once per
	// goroutine.
	run := func(b *testing.B, newTake func() func() (bool, error)) {
		b.SetParallelism(max(1, benchCallers/runtime.GOMAXPROCS(0)))
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			take := newTake()
			for pb.Next() {
				if ok, err := take(); err != nil || !ok {
					b.Errorf("take: %v, %v", ok, err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "permits/s")
	}
	shared := func(take func() (bool, error)) func() func() (bool, error) {
		return func() func() (bool, error) { return take }
	}

	b.Run("redis_rate_AllowN", func(b *testing.B) {
		lim := redis_rate.NewLimiter(rdb)
		limit := redis_rate.Limit{Rate: 1 << 40, Burst: 1 << 40, Period: time.Second}
		key := testutil.Prefix(b)
		run(b, shared(func() (bool, error) {
			r, err := lim.AllowN(ctx, key, limit, 1)
			return err == nil && r.Allowed == 1, err
		}))
	})
	b.Run("Reserve_RPM_TPM", func(b *testing.B) {
		tb := must(NewTokenBucket(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))}))
		run(b, shared(func() (bool, error) {
			r, err := tb.Reserve(ctx, benchScope, Cost{Requests: 1, Tokens: 100})
			return err == nil && r.Allowed, err
		}))
	})
	// One TokenBucket per caller, as if each were a process of its own: no
	// two reserves share a script run.
	b.Run("Reserve_RPM_TPM_unbatched", func(b *testing.B) {
		keys := rkeys.New(testutil.Prefix(b))
		run(b, func() func() (bool, error) {
			tb := must(NewTokenBucket(rdb, Options{Keys: keys}))
			return func() (bool, error) {
				r, err := tb.Reserve(ctx, benchScope, Cost{Requests: 1, Tokens: 100})
				return err == nil && r.Allowed, err
			}
		})
	})
}

// BenchmarkReserveLatency reports the p50 and p99 latency of an uncontended
// Reserve on an RPM and a TPM bucket (one caller) and, alternating with it
// call by call so that both see the same load, of redis_rate's AllowN on one
// bucket.
func BenchmarkReserveLatency(b *testing.B) {
	rdb := testutil.Redis(b, 1)
	ctx := context.Background()
	tb := must(NewTokenBucket(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))}))
	lim := redis_rate.NewLimiter(rdb)
	limit := redis_rate.Limit{Rate: 1 << 40, Burst: 1 << 40, Period: time.Second}
	key := testutil.Prefix(b)
	calls := []func() error{
		func() error {
			_, err := tb.Reserve(ctx, benchScope, Cost{Requests: 1, Tokens: 100})
			return err
		},
		func() error {
			_, err := lim.AllowN(ctx, key, limit, 1)
			return err
		},
	}
	d := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
	for _, f := range calls { // loads the scripts
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		for j := range calls {
			j = (i + j) % 2 // alternate which goes first
			start := time.Now()
			if err := calls[j](); err != nil {
				b.Fatal(err)
			}
			d[j] = append(d[j], time.Since(start))
		}
	}
	b.StopTimer()
	for j, name := range []string{"Reserve", "redis_rate"} {
		slices.Sort(d[j])
		b.ReportMetric(float64(d[j][len(d[j])/2].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(d[j][len(d[j])*99/100].Microseconds()), name+"-p99-µs")
	}
}

// benchWindows are an API key's windows in the benchmarks: limits so large
// that every call is an admission.
var benchWindows = []NamedWindow{
	{Name: "second", Window: Window{Limit: 1e12, Period: time.Second}},
	{Name: "day", Window: Window{Limit: 1e14, Period: 24 * time.Hour}},
}

// BenchmarkWindowsVsRedisRate compares admissions per second, with 50
// concurrent callers on one key in one process (the API's per-key check),
// of redis_rate's AllowN on one bucket, Windows.Allow (a round trip per
// request) on a second window and on second + day windows, for every
// algorithm, and a WindowPrefetch (slices of 100) on second + day.
func BenchmarkWindowsVsRedisRate(b *testing.B) {
	rdb := testutil.Redis(b, 1)
	ctx := context.Background()
	run := func(b *testing.B, take func() (bool, error)) {
		b.SetParallelism(max(1, benchCallers/runtime.GOMAXPROCS(0)))
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if ok, err := take(); err != nil || !ok {
					b.Errorf("take: %v, %v", ok, err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "permits/s")
	}
	b.Run("redis_rate_AllowN", func(b *testing.B) {
		lim := redis_rate.NewLimiter(rdb)
		limit := redis_rate.Limit{Rate: 1 << 40, Burst: 1 << 40, Period: time.Second}
		key := testutil.Prefix(b)
		run(b, func() (bool, error) {
			r, err := lim.AllowN(ctx, key, limit, 1)
			return err == nil && r.Allowed == 1, err
		})
	})
	for _, alg := range Algorithms {
		for _, ws := range [][]NamedWindow{benchWindows[:1], benchWindows} {
			name := "Allow_" + string(alg) + "_" + ws[len(ws)-1].Name
			if alg == AlgSlidingLog && len(ws) > 1 {
				continue // a day's log of every admission: not what the log is for
			}
			b.Run(name, func(b *testing.B) {
				w := must(NewWindows(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))}))
				s := WindowSet{Algorithm: alg, Scope: "api:bench", Windows: ws}
				run(b, func() (bool, error) {
					r, err := w.Allow(ctx, s, 1)
					return err == nil && r.Allowed, err
				})
			})
		}
		if alg == AlgSlidingLog {
			continue
		}
		b.Run("Lease_"+string(alg)+"_day", func(b *testing.B) {
			w := must(NewWindows(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))}))
			l := w.Prefetch(WindowSet{Algorithm: alg, Scope: "api:bench", Windows: benchWindows}, PrefetchOptions{Size: 100})
			defer l.Close(ctx)
			run(b, func() (bool, error) {
				r, err := l.Take(ctx, 1)
				return err == nil && r.Allowed, err
			})
		})
	}
}

// BenchmarkWindowsLatency reports the p50 and p99 latency of an uncontended
// Windows.Allow on second + day windows (sliding window, the default) and,
// alternating with it call by call, of redis_rate's AllowN on one bucket.
func BenchmarkWindowsLatency(b *testing.B) {
	rdb := testutil.Redis(b, 1)
	ctx := context.Background()
	w := must(NewWindows(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))}))
	s := WindowSet{Algorithm: AlgSlidingWindow, Scope: "api:bench", Windows: benchWindows}
	lim := redis_rate.NewLimiter(rdb)
	limit := redis_rate.Limit{Rate: 1 << 40, Burst: 1 << 40, Period: time.Second}
	key := testutil.Prefix(b)
	calls := []func() error{
		func() error { _, err := w.Allow(ctx, s, 1); return err },
		func() error { _, err := lim.AllowN(ctx, key, limit, 1); return err },
	}
	d := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
	for _, f := range calls { // loads the scripts
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		for j := range calls {
			j = (i + j) % 2
			start := time.Now()
			if err := calls[j](); err != nil {
				b.Fatal(err)
			}
			d[j] = append(d[j], time.Since(start))
		}
	}
	b.StopTimer()
	for j, name := range []string{"Allow", "redis_rate"} {
		slices.Sort(d[j])
		b.ReportMetric(float64(d[j][len(d[j])/2].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(d[j][len(d[j])*99/100].Microseconds()), name+"-p99-µs")
	}
}

// BenchmarkScriptTime reports the time Redis spends running the reserve and
// settle scripts (INFO commandstats, EVALSHA's usec per call: the script's
// own work, without the network) for a model scope of an RPM and a TPM
// bucket settled as a worker settles a provider call: the provider's
// remaining counts for both buckets, a prompt ratio, what it charged.
// Reservations are made 50 at a time, then settled one by one.
//
//	go test -run '^$' -bench ScriptTime ./internal/limiter
func BenchmarkScriptTime(b *testing.B) {
	rdb := testutil.Redis(b, 1)
	ctx := context.Background()
	tb := must(NewTokenBucket(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))}))
	scope := modelScope("bench/script-time", 0, 1e6, 1e9, 0, 0)
	evalsha := func() (calls, usec int64) {
		info := rdb.Info(ctx, "commandstats").Val()
		for line := range strings.SplitSeq(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
				_, _ = fmt.Sscanf(rest, "calls=%d,usec=%d", &calls, &usec)
			}
		}
		return calls, usec
	}
	var reserveN, reserveUS, settleN, settleUS int64
	const batch = 50
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		rs := make([]*Reservation, 0, batch)
		n0, u0 := evalsha()
		for range min(batch, b.N-i) {
			res, err := tb.Reserve(ctx, scope, Cost{Requests: 1, Tokens: 40})
			if err != nil || !res.Allowed {
				b.Fatalf("reserve: %v %+v", err, res)
			}
			rs = append(rs, res.Reservation)
		}
		n1, u1 := evalsha()
		for j, r := range rs {
			_, err := tb.Settle(ctx, r, Feedback{
				Charged: Cost{Requests: 1, Tokens: 40},
				Unused:  Cost{Tokens: 10},
				Observed: []Observed{
					{Bucket: "rpm", Remaining: 1e6 - int64(j) - 1, Limit: 1e6},
					{Bucket: "tpm", Remaining: 1e9 - 40*int64(j) - 40, Limit: 1e9},
				},
				PromptRatio: 1 + float64(j%7)/100,
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		n2, u2 := evalsha()
		// each INFO is a command of its own, not an EVALSHA
		reserveN, reserveUS = reserveN+n1-n0, reserveUS+u1-u0
		settleN, settleUS = settleN+n2-n1, settleUS+u2-u1
	}
	b.StopTimer()
	b.ReportMetric(float64(reserveUS)/float64(reserveN), "reserve-µs/call")
	b.ReportMetric(float64(settleUS)/float64(settleN), "settle-µs/call")
}
