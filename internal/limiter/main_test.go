package limiter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.RunMainIfChild(childMarker, "limiter-child", windowsChild)
	goleak.VerifyTestMain(m)
}

// env is what one test of the suite runs against: a Redis (single node or
// cluster), a key prefix of its own and a clock it moves by hand.
type env struct {
	rdb       redis.UniversalClient
	newClient func() redis.UniversalClient // another connection pool to the same Redis
	keys      rkeys.Builder
	clock     *testutil.Clock
}

// opts are limiter options on the test's prefix and fake clock.
func (e *env) opts() Options { return Options{Keys: e.keys, Clock: e.clock.Now} }

// realOpts are limiter options on the test's prefix and Redis TIME.
func (e *env) realOpts() Options { return Options{Keys: e.keys} }

// suite lists the tests that run against both a single Redis and a cluster.
var suite = []struct {
	name string
	run  func(t *testing.T, e *env)
}{
	{"AllOrNothing", testAllOrNothing},
	{"RetryAfterExact", testRetryAfterExact},
	{"RetryAfterRedisTime", testRetryAfterRedisTime},
	{"RetryAfterHeldInFlight", testRetryAfterHeldInFlight},
	{"CostExceedsCapacity", testCostExceedsCapacity},
	{"ReconcileRefund", testReconcileRefund},
	{"ReconcileDebt", testReconcileDebt},
	{"RefundKeepsOthersReserved", testRefundKeepsOthersReserved},
	{"ReconcileAfterScriptError", testReconcileAfterScriptError},
	{"LimitChange", testLimitChange},
	{"PenalizeAcrossClients", testPenalizeAcrossClients},
	{"ProbeTimeoutAndRepenalize", testProbeTimeoutAndRepenalize},
	{"Wait", testWait},
	{"WaitEndsWithContext", testWaitEndsWithContext},
	{"KeyTTLs", testKeyTTLs},
	{"OlderFormState", testOlderFormState},
	{"KeyTTLCoversAllBuckets", testKeyTTLCoversAllBuckets},
	{"InvalidInput", testInvalidInput},
	{"FixedWindowBoundaryBurst", testFixedWindowBoundaryBurst},
	{"SlidingLogNoBoundaryBurst", testSlidingLogNoBoundaryBurst},
	{"SlidingLogExact", testSlidingLogExact},
	{"SlidingCounterNoBoundaryBurst", testSlidingCounterNoBoundaryBurst},
	{"MultiWindowAllOrNothing", testMultiWindowAllOrNothing},
	{"WindowSetAllOrNothing", testWindowSetAllOrNothing},
	{"WindowSetEndpoint", testWindowSetEndpoint},
	{"WindowPrefetchGiveBack", testWindowPrefetchGiveBack},
	{"WindowPrefetchBound", testWindowPrefetchBound},
	{"WindowSetInvalid", testWindowSetInvalid},
	{"WindowSetTTLs", testWindowSetTTLs},
	{"Spacer", testSpacer},
	{"BatchedReserves", testBatchedReserves},
	{"BatchedReserveCancelled", testBatchedReserveCancelled},
	{"AdmissionProperty", testAdmissionProperty},
	{"SettleNeverRefunds", testSettleNeverRefunds},
	{"SettleDimensions", testSettleDimensions},
	{"SettleFollowsProvider", testSettleFollowsProvider},
	{"SettleWithoutHeaders", testSettleWithoutHeaders},
	{"SettleLearnsDrain", testSettleLearnsDrain},
	{"SettleEvidence", testSettleEvidence},
	{"SettleDistrust", testSettleDistrust},
	{"SettleCalibration", testSettleCalibration},
	{"SettleCalibrationMedian", testSettleCalibrationMedian},
	{"SettleCalibrationRecords", testSettleCalibrationRecords},
	{"SettleLearnedTTL", testSettleLearnedTTL},
	{"SettleBelowTheProvidersLimit", testSettleBelowTheProvidersLimit},
	{"PaceBoundsBursts", testPaceBoundsBursts},
	{"PaceReleaseAndRefusal", testPaceReleaseAndRefusal},
	{"PaceLearnsShortWindows", testPaceLearnsShortWindows},
	{"PaceRateEstimate", testPaceRateEstimate},
	{"PaceGrowsWhileTheProviderShowsRoom", testPaceGrowsWhileTheProviderShowsRoom},
}

func TestSingleNode(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, 1)
	runSuite(t, rdb, func(t *testing.T) redis.UniversalClient { return testutil.Redis(t, 1) })
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := testutil.StartRedisCluster(t)
	addrs := c.Options().Addrs
	runSuite(t, c, func(t *testing.T) redis.UniversalClient {
		n := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = n.Close() })
		return n
	})
}

func runSuite(t *testing.T, rdb redis.UniversalClient, newClient func(*testing.T) redis.UniversalClient) {
	for _, tc := range suite {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &env{
				rdb:       rdb,
				newClient: func() redis.UniversalClient { return newClient(t) },
				keys:      rkeys.New(testutil.Prefix(t)),
				clock:     testutil.NewClock(time.Unix(1_900_000_000, 0)),
			}
			t.Cleanup(func() {
				ctx := context.Background()
				for _, k := range scanKeys(t, rdb, e.keys.Prefix()+":*") {
					rdb.Del(ctx, k)
				}
			})
			tc.run(t, e)
		})
	}
}

// scanKeys returns the keys matching pattern, on every master of a cluster.
func scanKeys(t *testing.T, rdb redis.UniversalClient, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	scan := func(c redis.Cmdable) ([]string, error) {
		var out []string
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			out = append(out, it.Val())
		}
		return out, it.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var all []string
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			ks, err := scan(n)
			mu.Lock()
			all = append(all, ks...)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatalf("scan: %v", err)
		}
		return all
	}
	ks, err := scan(rdb)
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return ks
}

func mustReserve(t *testing.T, tb *TokenBucket, s Scope, c Cost) *Result {
	t.Helper()
	r, err := tb.Reserve(context.Background(), s, c)
	if err != nil {
		t.Fatalf("Reserve(%+v): %v", c, err)
	}
	return r
}

func mustState(t *testing.T, tb *TokenBucket, s Scope) *Result {
	t.Helper()
	r, err := tb.State(context.Background(), s)
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	return r
}

// remaining returns the Remaining of each bucket of r, by name.
func remaining(r *Result) map[string]int64 {
	m := map[string]int64{}
	for _, b := range r.Buckets {
		m[b.Name] = b.Remaining
	}
	return m
}

func bucket(t *testing.T, r *Result, name string) BucketState {
	t.Helper()
	for _, b := range r.Buckets {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no bucket %q in %+v", name, r.Buckets)
	return BucketState{}
}

// modelScope is ModelScope with the limits llmq had before its dimensions
// were named: requests per second and minute, tokens per minute and day.
func modelScope(name string, rps, rpm, tpm, tpd int64, burst time.Duration) Scope {
	return ModelScope(name, map[string]int64{"rps": rps, "rpm": rpm, "tpm": tpm, "tpd": tpd}, burst)
}
