package limiter

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// benchCallers is the number of concurrent callers of the throughput
// benchmark.
const benchCallers = 50

// huge limits: the throughput benchmarks measure admissions, never denials.
var benchScope = ModelScope("bench/model", 0, 1e12, 1e14, 0)

// BenchmarkReserveVsRedisRate compares permits per second, with 50
// concurrent callers on one Redis, of redis_rate's AllowN on one bucket,
// Reserve on an RPM and a TPM bucket, and a Lease on the same two buckets.
func BenchmarkReserveVsRedisRate(b *testing.B) {
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
	b.Run("Reserve_RPM_TPM", func(b *testing.B) {
		tb := NewTokenBucket(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))})
		run(b, func() (bool, error) {
			r, err := tb.Reserve(ctx, benchScope, Cost{Requests: 1, Tokens: 100})
			return err == nil && r.Allowed, err
		})
	})
	b.Run("Lease", func(b *testing.B) {
		tb := NewTokenBucket(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))})
		l := NewLease(tb, benchScope, LeaseOptions{Size: Cost{Requests: 100, Tokens: 10000}})
		defer l.Close(ctx)
		run(b, func() (bool, error) {
			r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 100})
			return err == nil && r.Allowed, err
		})
	})
}

// BenchmarkReserveLatency reports the p50 and p99 latency of an uncontended
// Reserve on an RPM and a TPM bucket (one caller), beside redis_rate's
// AllowN on one bucket.
func BenchmarkReserveLatency(b *testing.B) {
	rdb := testutil.Redis(b, 1)
	ctx := context.Background()
	b.Run("Reserve_RPM_TPM", func(b *testing.B) {
		tb := NewTokenBucket(rdb, Options{Keys: rkeys.New(testutil.Prefix(b))})
		latencies(b, rdb, func() error {
			_, err := tb.Reserve(ctx, benchScope, Cost{Requests: 1, Tokens: 100})
			return err
		})
	})
	b.Run("redis_rate_AllowN", func(b *testing.B) {
		lim := redis_rate.NewLimiter(rdb)
		limit := redis_rate.Limit{Rate: 1 << 40, Burst: 1 << 40, Period: time.Second}
		key := testutil.Prefix(b)
		latencies(b, rdb, func() error {
			_, err := lim.AllowN(ctx, key, limit, 1)
			return err
		})
	})
}

// latencies times each call of f and reports the p50 and p99 in µs.
func latencies(b *testing.B, rdb *redis.Client, f func() error) {
	if err := f(); err != nil { // loads the script
		b.Fatal(err)
	}
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-µs")
}
