package budget_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// BenchmarkReserveSettle measures one job's budget round trips (Reserve,
// then Settle at a real cost below the estimate) with 50 concurrent callers
// on the shared test Redis, time from Redis TIME. Reported: permits/s (pairs
// of Reserve + Settle per second) and µs-redis-cpu/op, the Redis server's
// CPU per pair (of everything the server ran meanwhile: run it on a Redis
// of its own, TEST_REDIS_URL). tenants=1 is one hot tenant; tenants=50
// spreads the callers over 50 tenants' days. Under a global cap each step
// runs a script on the tenant's day and one on the global day, in one
// round trip; global=none holds the tenant's day alone.
func BenchmarkReserveSettle(b *testing.B) {
	for _, c := range []struct {
		tenants int
		global  money.Micros
		name    string
	}{{1, 1e8 * dollar, "cap"}, {50, 1e8 * dollar, "cap"}, {50, 0, "none"}} {
		b.Run(fmt.Sprintf("callers=50/tenants=%d/global=%s", c.tenants, c.name), func(b *testing.B) {
			benchReserveSettle(b, testutil.Redis(b, testDB), 50, c.tenants, c.global)
		})
	}
}

// BenchmarkReserveSettleCluster is BenchmarkReserveSettle's 50 tenants on a
// three-master cluster of its own, reporting as well the Redis CPU per
// operation of all masters together and of the busiest: the tenants' days
// spread over the masters, and the global day (under a cap) is one.
func BenchmarkReserveSettleCluster(b *testing.B) {
	rdb := testutil.StartRedisCluster(b)
	for _, c := range []struct {
		global money.Micros
		name   string
	}{{0, "none"}, {1e8 * dollar, "cap"}} {
		b.Run("callers=50/tenants=50/global="+c.name, func(b *testing.B) {
			before := masterCPU(b, rdb)
			benchReserveSettle(b, rdb, 50, 50, c.global)
			var all, busiest time.Duration
			for addr, t := range masterCPU(b, rdb) {
				d := t - before[addr]
				all += d
				busiest = max(busiest, d)
			}
			b.ReportMetric(float64(all.Microseconds())/float64(b.N), "µs-redis-cpu/op")
			b.ReportMetric(float64(busiest.Microseconds())/float64(b.N), "µs-busiest-master/op")
		})
	}
}

// masterCPU reads each master's CPU time, by address.
func masterCPU(b *testing.B, rdb *redis.ClusterClient) map[string]time.Duration {
	out := map[string]time.Duration{}
	var mu sync.Mutex
	err := rdb.ForEachMaster(b.Context(), func(ctx context.Context, c *redis.Client) error {
		d, ok := testutil.RedisCPU(ctx, c)
		if !ok {
			return fmt.Errorf("no CPU figures from %s", c.Options().Addr)
		}
		mu.Lock()
		out[c.Options().Addr] = d
		mu.Unlock()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

func benchReserveSettle(b *testing.B, rdb redis.UniversalClient, callers, tenants int, global money.Micros) {
	_, single := rdb.(*redis.Client)
	bud := testutil.Must(budget.New(rdb, newLedger(), budget.Options{Keys: rkeys.New(testutil.Prefix(b))}))
	accts := make([]budget.Account, tenants)
	for i := range accts {
		accts[i] = budget.Account{TenantID: fmt.Sprintf("ten_%02d", i), Budget: 1e6 * dollar, SoftLimit: 0.8, Global: global}
	}
	ctx := b.Context()
	// Start the day outside the timed loop (its first touch reads the ledger).
	for _, a := range accts {
		if _, err := bud.Status(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var failOnce sync.Once
	var failed error
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, _ := testutil.RedisCPU(ctx, rdb)
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			acct := accts[c%tenants]
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				res, d, err := bud.Reserve(ctx, acct, fmt.Sprintf("job_%d", n), 2_000)
				if err == nil && !d.Allowed {
					err = fmt.Errorf("denied by %s", d.DeniedBy)
				}
				if err == nil {
					err = bud.Settle(ctx, res, 1_500, true)
				}
				if err != nil {
					failOnce.Do(func() { failed = err })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "permits/s")
	if cpu1, ok := testutil.RedisCPU(ctx, rdb); ok && single {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "µs-redis-cpu/op")
	}
}
