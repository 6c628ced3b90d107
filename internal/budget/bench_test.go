package budget_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// BenchmarkReserveSettle measures one job's budget round trips (Reserve,
// then Settle at a real cost below the estimate) with 50 concurrent callers
// on the shared test Redis, time from Redis TIME. Reported: permits/s (pairs
// of Reserve + Settle per second). tenants=1 is one hot tenant; tenants=50
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
			benchReserveSettle(b, 50, c.tenants, c.global)
		})
	}
}

func benchReserveSettle(b *testing.B, callers, tenants int, global money.Micros) {
	rdb := testutil.Redis(b, testDB)
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
}
