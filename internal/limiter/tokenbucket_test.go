package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A denial by one bucket takes nothing from the others.
func testAllOrNothing(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("openai/gpt-4o-mini", 0, 10, 1000, 0, 0)

	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 900})
	if !r.Allowed || r.Reservation == nil || r.Reservation.Probe {
		t.Fatalf("first reserve: %+v", r)
	}
	if got := remaining(r); got["rpm"] != 9 || got["tpm"] != 100 {
		t.Fatalf("remaining after the first reserve = %v, want rpm 9 tpm 100", got)
	}

	r = mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 200})
	if r.Allowed || r.Penalized || r.Reservation != nil {
		t.Fatalf("a reserve over the TPM was not denied: %+v", r)
	}
	// 100 tokens short at 1000 per minute: 6 s.
	if r.RetryAfter != 6*time.Second || bucket(t, r, "tpm").RetryAfter != 6*time.Second || bucket(t, r, "rpm").RetryAfter != 0 {
		t.Fatalf("RetryAfter = %v, buckets %+v; want 6s from tpm alone", r.RetryAfter, r.Buckets)
	}
	if r.Limit != 1000 || r.Remaining != 100 {
		t.Fatalf("tightest bucket = %d/%d, want tpm 100/1000", r.Remaining, r.Limit)
	}

	st := mustState(t, tb, s)
	if got := remaining(st); got["rpm"] != 9 || got["tpm"] != 100 {
		t.Fatalf("after the TPM denial, remaining = %v; want RPM untouched at 9 and tpm 100", got)
	}
	// tpm: 900 used at 1000/min is full in 54 s; rpm: 1 used at 10/min in 6 s.
	if st.ResetAfter != 54*time.Second || bucket(t, st, "rpm").ResetAfter != 6*time.Second {
		t.Fatalf("ResetAfter = %v, buckets %+v", st.ResetAfter, st.Buckets)
	}
}

// RetryAfter is the exact time until every bucket covers the cost: one
// microsecond earlier is denied, at it the cost is admitted.
func testRetryAfterExact(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := Scope{Name: "odd", Buckets: []Bucket{
		{Name: "r", Unit: UnitRequests, Limit: 7, Period: 3 * time.Second},
		{Name: "t", Unit: UnitTokens, Limit: 1000, Period: 7 * time.Second},
	}}
	if r := mustReserve(t, tb, s, Cost{Requests: 7, Tokens: 990}); !r.Allowed {
		t.Fatalf("full take denied: %+v", r)
	}
	e.clock.Add(time.Second)
	r := mustReserve(t, tb, s, Cost{Requests: 5, Tokens: 500})
	if r.Allowed {
		t.Fatalf("allowed: %+v", r)
	}
	// r: after 1 s, 7/3 back; 5 need 15/7 s from empty, so 15/7 - 1 = 8/7 s.
	// t: 990 - 1000/7 used; 500 need 490 + 1000/7 - 990 + ... exactly:
	// used 990 - 142.857.. = 847.142..; need 847.142.. + 500 - 1000 = 347.142..
	// at 1000/7 per second: 2.43 s.
	wantR := 8 * time.Second / 7
	wantT := time.Duration((990 - 1000.0/7 + 500 - 1000) / (1000.0 / 7) * float64(time.Second))
	if d := bucket(t, r, "r").RetryAfter - wantR; d < 0 || d > time.Microsecond {
		t.Fatalf("r RetryAfter = %v, want %v", bucket(t, r, "r").RetryAfter, wantR)
	}
	if d := bucket(t, r, "t").RetryAfter - wantT; d < 0 || d > time.Microsecond {
		t.Fatalf("t RetryAfter = %v, want %v", bucket(t, r, "t").RetryAfter, wantT)
	}
	if r.RetryAfter != max(bucket(t, r, "r").RetryAfter, bucket(t, r, "t").RetryAfter) {
		t.Fatalf("RetryAfter = %v, want the longest of %+v", r.RetryAfter, r.Buckets)
	}

	e.clock.Add(r.RetryAfter - 2*time.Microsecond)
	if r2 := mustReserve(t, tb, s, Cost{Requests: 5, Tokens: 500}); r2.Allowed || r2.RetryAfter > 3*time.Microsecond {
		t.Fatalf("2µs early: %+v", r2)
	}
	e.clock.Add(2 * time.Microsecond)
	if r2 := mustReserve(t, tb, s, Cost{Requests: 5, Tokens: 500}); !r2.Allowed {
		t.Fatalf("at RetryAfter: %+v", r2)
	}
}

// On Redis TIME, RetryAfter is within 5 ms of the truth, computed from the
// Redis times of the decisions.
func testRetryAfterRedisTime(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.realOpts()))
	s := Scope{Name: "real", Buckets: []Bucket{{Name: "tpm", Unit: UnitTokens, Limit: 6000, Period: time.Minute}}}
	first := mustReserve(t, tb, s, Cost{Tokens: 6000})
	if !first.Allowed {
		t.Fatalf("full take denied: %+v", first)
	}
	r := mustReserve(t, tb, s, Cost{Tokens: 300})
	if r.Allowed {
		t.Fatalf("allowed: %+v", r)
	}
	// 100 tokens per second: 300 tokens take 3 s from the first take.
	want := 3*time.Second - r.Time.Sub(first.Time)
	if d := r.RetryAfter - want; d < -5*time.Millisecond || d > 5*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want %v ± 5ms", r.RetryAfter, want)
	}
}

// A cost above a bucket's capacity fails at once, naming the bucket, and
// never reaches Redis.
func testCostExceedsCapacity(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("big", 0, 10, 1000, 0, 0)

	_, err := tb.Reserve(ctx, s, Cost{Requests: 1, Tokens: 1001})
	if !errors.Is(err, ErrCostExceedsCapacity) {
		t.Fatalf("Reserve err = %v, want ErrCostExceedsCapacity", err)
	}
	for _, want := range []string{`"big"`, `"tpm"`, "1001", "1000"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	start := time.Now()
	if _, err := tb.Wait(ctx, s, Cost{Requests: 11}); !errors.Is(err, ErrCostExceedsCapacity) || time.Since(start) > time.Second {
		t.Fatalf("Wait err = %v after %v, want ErrCostExceedsCapacity at once", err, time.Since(start))
	}
	if n := e.rdb.Exists(ctx, e.keys.LimiterScope(s.Name)).Val(); n != 0 {
		t.Fatalf("a refused cost created the scope's key")
	}
	for _, alg := range Algorithms {
		if _, err := oneWindow(e, alg)(ctx, "k", 5, time.Second, 6); !errors.Is(err, ErrCostExceedsCapacity) {
			t.Errorf("%s: err = %v, want ErrCostExceedsCapacity", alg, err)
		}
	}
}

// Reconcile gives back unused tokens, never beyond capacity, and a second
// reconcile of one reservation changes nothing.
func testReconcileRefund(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("refund", 0, 100, 1000, 0, 0)

	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 800})
	if err := tb.Reconcile(ctx, r.Reservation, Cost{Requests: 1, Tokens: 300}); err != nil {
		t.Fatal(err)
	}
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 700 || got["rpm"] != 99 {
		t.Fatalf("after the refund, remaining = %v, want tpm 700 rpm 99", got)
	}
	if err := tb.Reconcile(ctx, r.Reservation, Cost{Requests: 1, Tokens: 0}); err != nil {
		t.Fatal(err)
	}
	if err := tb.Release(ctx, r.Reservation); err != nil {
		t.Fatal(err)
	}
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 700 || got["rpm"] != 99 {
		t.Fatalf("after reconciling again, remaining = %v, want unchanged tpm 700 rpm 99", got)
	}

	// Release gives back everything.
	r = mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500})
	if err := tb.Release(ctx, r.Reservation); err != nil {
		t.Fatal(err)
	}
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 700 || got["rpm"] != 99 {
		t.Fatalf("after Release, remaining = %v, want tpm 700 rpm 99", got)
	}

	// A refund after the bucket refilled does not fill it beyond capacity.
	r = mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500})
	e.clock.Add(time.Minute)
	if err := tb.Release(ctx, r.Reservation); err != nil {
		t.Fatal(err)
	}
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 1000 || got["rpm"] != 100 {
		t.Fatalf("a late refund: remaining = %v, want the capacity (1000, 100)", got)
	}
}

// Reconcile takes the extra: the bucket goes into debt and later callers
// wait for it; a second reconcile takes nothing more.
func testReconcileDebt(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("debt", 0, 0, 1000, 0, 0)

	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500})
	for range 2 {
		if err := tb.Reconcile(ctx, r.Reservation, Cost{Requests: 1, Tokens: 1400}); err != nil {
			t.Fatal(err)
		}
	}
	st := mustState(t, tb, s)
	if b := bucket(t, st, "tpm"); b.Remaining != -400 || st.Remaining != 0 || st.Allowed {
		t.Fatalf("in debt: %+v (Result.Remaining %d, Allowed %v); want -400, 0, false", b, st.Remaining, st.Allowed)
	}
	// 400 of debt plus 100 at 1000 per minute: 30 s.
	d := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100})
	if d.Allowed || d.RetryAfter != 30*time.Second {
		t.Fatalf("after the debt: %+v, want denied for 30s", d)
	}
	e.clock.Add(30 * time.Second)
	if d := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}); !d.Allowed {
		t.Fatalf("after the debt is repaid: %+v", d)
	}
}

// Limits come with every call; the used amount is kept when they change.
func testLimitChange(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	mustReserve(t, tb, modelScope("change", 0, 0, 1000, 0, 0), Cost{Tokens: 600})
	if got := remaining(mustState(t, tb, modelScope("change", 0, 0, 2000, 0, 0))); got["tpm"] != 1400 {
		t.Fatalf("limit raised to 2000 with 600 used: remaining %v, want 1400", got)
	}
	r := mustReserve(t, tb, modelScope("change", 0, 0, 500, 0, 0), Cost{Tokens: 1})
	// 600 used of 500: 101 over, repaid at 500 per minute: 12.12 s.
	if r.Allowed || bucket(t, r, "tpm").Remaining != -100 || r.RetryAfter != 12120*time.Millisecond {
		t.Fatalf("limit lowered to 500 with 600 used: %+v, want denied, -100, 12.12s", r)
	}
}

// A penalty set through one client blocks the callers of another; a shorter
// one never shortens it; when it ends a single probe goes first.
func testPenalizeAcrossClients(t *testing.T, e *env) {
	ctx := context.Background()
	a := must(NewTokenBucket(e.rdb, e.opts()))
	b := must(NewTokenBucket(e.newClient(), e.opts()))
	s := modelScope("penalized", 0, 100, 100000, 0, 0)
	cost := Cost{Requests: 1, Tokens: 10}

	if err := a.Penalize(ctx, s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	r := mustReserve(t, b, s, cost)
	if r.Allowed || !r.Penalized || r.RetryAfter != 10*time.Second {
		t.Fatalf("penalized scope seen from another client: %+v, want denied for 10s", r)
	}
	if got := remaining(r); got["rpm"] != 100 {
		t.Fatalf("a penalized denial took tokens: %v", got)
	}
	if err := b.Penalize(ctx, s, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(4 * time.Second)
	if r := mustReserve(t, a, s, cost); r.Allowed || r.RetryAfter != 6*time.Second {
		t.Fatalf("a shorter penalty shortened the longer one: %+v", r)
	}

	e.clock.Add(6 * time.Second)
	probe := mustReserve(t, b, s, cost)
	if !probe.Allowed || !probe.Reservation.Probe {
		t.Fatalf("first caller after the penalty is not the probe: %+v", probe)
	}
	for _, tb := range []*TokenBucket{a, b} {
		r := mustReserve(t, tb, s, cost)
		if r.Allowed || !r.Penalized || r.RetryAfter <= 0 || r.RetryAfter > 625*time.Millisecond {
			t.Fatalf("while the probe is in flight: %+v, want denied for at most 500ms±25%%", r)
		}
	}
	e.clock.Add(time.Second)
	if r := mustReserve(t, a, s, cost); r.Allowed || !r.Penalized {
		t.Fatalf("1s into the probe: %+v, want denied", r)
	}
	if err := b.Reconcile(ctx, probe.Reservation, Cost{Requests: 1, Tokens: 8}); err != nil {
		t.Fatal(err)
	}
	for _, tb := range []*TokenBucket{a, b} {
		if r := mustReserve(t, tb, s, cost); !r.Allowed || r.Penalized || r.Reservation.Probe {
			t.Fatalf("after the probe succeeded: %+v, want allowed, no probe", r)
		}
	}
}

// A probe that times out is replaced by the next caller; a penalty during a
// probe blocks again, and the old probe's release does not lift it.
func testProbeTimeoutAndRepenalize(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, Options{Keys: e.keys, Clock: e.clock.Now, ProbeTimeout: 5 * time.Second}))
	s := modelScope("probe", 0, 100, 0, 0, 0)
	one := Cost{Requests: 1}

	if err := tb.Penalize(ctx, s, time.Second); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(time.Second)
	p1 := mustReserve(t, tb, s, one)
	if !p1.Allowed || !p1.Reservation.Probe {
		t.Fatalf("no probe: %+v", p1)
	}
	e.clock.Add(4 * time.Second)
	if r := mustReserve(t, tb, s, one); r.Allowed || r.RetryAfter > 625*time.Millisecond {
		t.Fatalf("before the probe times out: %+v", r)
	}
	e.clock.Add(time.Second)
	p2 := mustReserve(t, tb, s, one)
	if !p2.Allowed || !p2.Reservation.Probe {
		t.Fatalf("after the probe timed out, the next caller is not the probe: %+v", p2)
	}
	if err := tb.Release(ctx, p1.Reservation); err != nil {
		t.Fatal(err)
	}
	if r := mustReserve(t, tb, s, one); r.Allowed || !r.Penalized {
		t.Fatalf("the stale probe's release ended the new probe: %+v", r)
	}

	// The probe gets a 429: penalize, then release it.
	if err := tb.Penalize(ctx, s, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := tb.Release(ctx, p2.Reservation); err != nil {
		t.Fatal(err)
	}
	if r := mustReserve(t, tb, s, one); r.Allowed || !r.Penalized || r.RetryAfter != 3*time.Second {
		t.Fatalf("penalized while probing, then released: %+v, want denied for 3s", r)
	}
	e.clock.Add(3 * time.Second)
	p3 := mustReserve(t, tb, s, one)
	if !p3.Allowed || !p3.Reservation.Probe {
		t.Fatalf("after the second penalty: %+v, want a new probe", p3)
	}
	// A failed probe (5xx) is released: the probe phase ends.
	if err := tb.Release(ctx, p3.Reservation); err != nil {
		t.Fatal(err)
	}
	if r := mustReserve(t, tb, s, one); !r.Allowed || r.Reservation.Probe {
		t.Fatalf("after the probe's release: %+v", r)
	}
}

// countScripts counts the scripts run through a client.
type countScripts struct {
	n     atomic.Int64
	first chan struct{} // closed after the first one returns
}

func (c *countScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *countScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			if c.n.Add(1) == 1 && c.first != nil {
				close(c.first)
			}
		}
		return err
	}
}

// Wait sleeps the RetryAfter it gets instead of polling, and is admitted.
func testWait(t *testing.T, e *env) {
	ctx := context.Background()
	rdb := e.newClient()
	hook := &countScripts{}
	rdb.AddHook(hook)
	tb := must(NewTokenBucket(rdb, e.realOpts()))
	s := Scope{Name: "wait", Buckets: []Bucket{{Name: "tps", Unit: UnitTokens, Limit: 100, Period: time.Second}}}
	first := mustReserve(t, tb, s, Cost{Tokens: 100})

	r, err := tb.Wait(ctx, s, Cost{Tokens: 20})
	if err != nil || !r.Allowed {
		t.Fatalf("Wait = %+v, %v", r, err)
	}
	// 20 tokens at 100 per second come back 200 ms after the first take.
	if got := r.Time.Sub(first.Time); got < 200*time.Millisecond || got > time.Second {
		t.Fatalf("admitted %v after the bucket was emptied, want just after 200ms", got)
	}
	// One denial, one admission (and a spare for a late wake-up), not a poll.
	if n := hook.n.Load(); n > 4 {
		t.Fatalf("Wait ran %d scripts for one 200ms wait: it polls", n-1)
	}
}

// Wait ends with its context: at once when the deadline comes before the
// admission, and as soon as the context is cancelled.
func testWaitEndsWithContext(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.realOpts()))
	s := Scope{Name: "slow", Buckets: []Bucket{{Name: "rpm", Unit: UnitRequests, Limit: 1, Period: time.Hour}}}
	mustReserve(t, tb, s, Cost{Requests: 1})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	r, err := tb.Wait(ctx, s, Cost{Requests: 1})
	if !errors.Is(err, context.DeadlineExceeded) || r == nil || r.RetryAfter < 59*time.Minute || time.Since(start) > 5*time.Second {
		t.Fatalf("Wait past the deadline = %+v, %v after %v; want DeadlineExceeded at once with RetryAfter ~1h",
			r, err, time.Since(start))
	}

	rdb := e.newClient()
	hook := &countScripts{first: make(chan struct{})}
	rdb.AddHook(hook)
	tb = must(NewTokenBucket(rdb, e.realOpts()))
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		<-hook.first
		cancel()
	}()
	start = time.Now()
	if _, err := tb.Wait(ctx, s, Cost{Requests: 1}); !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("cancelled Wait = %v after %v", err, time.Since(start))
	}
}

// nearTTL fails t unless got, a PTTL, is want less at most the test's run
// time.
func nearTTL(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	if got > want || got < want-2*time.Second {
		t.Fatalf("%s: PTTL %v, want %v (less the test's run time)", what, got, want)
	}
}

// Every key has a TTL, and a scope's hash lives until every bucket would be
// full again and no penalty or probe is pending; no call shortens it.
func testKeyTTLs(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("ttl", 0, 10, 1000, 0, 0)
	key := e.keys.LimiterScope(s.Name)
	pttl := func(k string) time.Duration { return e.rdb.PTTL(ctx, k).Val() }

	// tpm full in 30 s, rpm in 6 s.
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500})
	nearTTL(t, "after a reserve", pttl(key), 31*time.Second)
	if err := tb.Reconcile(ctx, r.Reservation, Cost{Requests: 1, Tokens: 100}); err != nil {
		t.Fatal(err)
	}
	nearTTL(t, "after a refund, which does not shorten it", pttl(key), 31*time.Second)
	nearTTL(t, "reconciled marker", pttl(e.keys.LimiterReconciled(s.Name, r.Reservation.ID)), time.Hour)
	if err := tb.Penalize(ctx, s, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	// The penalty, then the probe timeout (30 s) for the probe phase.
	nearTTL(t, "after a penalty", pttl(key), 151*time.Second)

	p := modelScope("ttl-probe", 0, 10, 1000, 0, 0)
	if err := tb.Penalize(ctx, p, time.Second); err != nil {
		t.Fatal(err)
	}
	nearTTL(t, "after a short penalty", pttl(e.keys.LimiterScope(p.Name)), 32*time.Second)
	e.clock.Add(time.Second)
	mustReserve(t, tb, p, Cost{Requests: 1, Tokens: 10}) // the probe: 30 s + 30 s
	nearTTL(t, "with a probe in flight", pttl(e.keys.LimiterScope(p.Name)), 61*time.Second)

	// Every limiter's keys.
	for range 3 {
		for _, alg := range Algorithms {
			oneWindow(e, alg)(ctx, string(alg), 10, time.Minute, 1)
		}
	}
	keys := scanKeys(t, e.rdb, e.keys.Prefix()+":*")
	if len(keys) < 8 {
		t.Fatalf("only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		if ttl := e.rdb.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %s has no TTL (%v)", k, ttl)
		}
	}
	// The keys of a scope share its hash tag.
	if !strings.Contains(key, "{ttl}") || !strings.Contains(e.keys.LimiterReconciled(s.Name, "x"), "{ttl}") {
		t.Fatalf("keys %s without the scope's hash tag", key)
	}
}

// Bad scopes and costs fail with an error naming what is wrong.
func testInvalidInput(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	for _, c := range []struct {
		s    Scope
		cost Cost
		want string
	}{
		{Scope{}, Cost{}, "Scope.Name"},
		{Scope{Name: "x", Buckets: []Bucket{{Name: "", Limit: 1, Period: time.Second}}}, Cost{}, "Buckets[0].Name"},
		{Scope{Name: "x", Buckets: []Bucket{{Name: "a", Limit: 0, Period: time.Second}}}, Cost{}, "Limit"},
		{Scope{Name: "x", Buckets: []Bucket{{Name: "a", Limit: 1}}}, Cost{}, "Period"},
		{Scope{Name: "x", Buckets: []Bucket{{Name: "a", Limit: 1, Period: time.Second}, {Name: "a", Limit: 1, Period: time.Second}}}, Cost{}, "twice"},
		{modelScope("x", 0, 1, 0, 0, 0), Cost{Requests: -1}, "negative"},
	} {
		if _, err := tb.Reserve(ctx, c.s, c.cost); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Reserve(%+v, %+v) err = %v, want one naming %s", c.s, c.cost, err, c.want)
		}
	}
	if err := tb.Penalize(ctx, modelScope("x", 0, 1, 0, 0, 0), -time.Second); err == nil {
		t.Errorf("negative penalty accepted")
	}
}

// A scope without buckets only carries penalties; ModelScope leaves out the
// zero limits.
func TestModelScope(t *testing.T) {
	t.Parallel()
	s := modelScope("m", 5, 0, 1000, 7, time.Second)
	if len(s.Buckets) != 3 || s.Buckets[0] != (Bucket{"rps", UnitRequests, 5, time.Second, time.Second}) ||
		s.Buckets[1] != (Bucket{"tpm", UnitTokens, 1000, time.Minute, time.Second}) ||
		s.Buckets[2] != (Bucket{"tpd", UnitTokens, 7, 24 * time.Hour, 0}) {
		t.Fatalf("ModelScope = %+v", s)
	}
	if s := modelScope("m", 0, 0, 0, 0, 0); len(s.Buckets) != 0 || s.validate(Cost{Requests: 1, Tokens: 1}) != nil {
		t.Fatalf("ModelScope without limits = %+v", s)
	}
}

// A refund never lifts a bucket above its capacity less what other calls
// still hold reserved: the provider refunds a round trip earlier and clips
// what overflows its capacity, so giving the whole refund here once other
// calls took the room would put this bucket ahead of the provider's.
func testRefundKeepsOthersReserved(t *testing.T, e *env) {
	ctx := context.Background()
	o := e.opts()
	o.HoldInFlight = true
	tb := must(NewTokenBucket(e.rdb, o))
	s := modelScope("clip", 0, 0, 1200, 0, 0) // 20 tokens a second

	a := mustReserve(t, tb, s, Cost{Tokens: 420}).Reservation
	e.clock.Add(21 * time.Second) // 420 refilled: the bucket is full again
	b := mustReserve(t, tb, s, Cost{Tokens: 420}).Reservation
	// a used 360 of its 420. The provider got the 60 back while it was full
	// (clipped); here they come after b took 420, and must not be counted.
	if err := tb.Reconcile(ctx, a, Cost{Tokens: 360}); err != nil {
		t.Fatal(err)
	}
	if got := remaining(mustState(t, tb, s))["tpm"]; got != 780 {
		t.Fatalf("after a's refund with b in flight: remaining %d, want 780 (capacity less b's 420)", got)
	}
	// With nothing else in flight, b's own refund is given in full.
	if err := tb.Reconcile(ctx, b, Cost{Tokens: 360}); err != nil {
		t.Fatal(err)
	}
	if got := remaining(mustState(t, tb, s))["tpm"]; got != 840 {
		t.Fatalf("after b's refund: remaining %d, want 840", got)
	}

	// Nor does refill bring the tokens used below what is in flight: the
	// provider starts refilling from the call's arrival, not from here.
	e.clock.Add(time.Minute) // full again
	c := mustReserve(t, tb, s, Cost{Tokens: 600}).Reservation
	e.clock.Add(3 * time.Second)
	if got := remaining(mustState(t, tb, s))["tpm"]; got != 600 {
		t.Fatalf("refill while in flight: remaining %d, want 600 (held)", got)
	}
	if err := tb.Reconcile(ctx, c, Cost{Tokens: 600}); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(3 * time.Second)
	if got := remaining(mustState(t, tb, s))["tpm"]; got != 660 {
		t.Fatalf("refill after the reconcile: remaining %d, want 660", got)
	}

	// A reservation never reconciled (its worker crashed) stops holding
	// refill and refunds back after two in-flight generations.
	mustReserve(t, tb, s, Cost{Tokens: 500})
	e.clock.Add(2*inflightGen + time.Minute)
	d := mustReserve(t, tb, s, Cost{Tokens: 100}).Reservation
	if err := tb.Release(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got := remaining(mustState(t, tb, s))["tpm"]; got != 1200 {
		t.Fatalf("a crashed reservation still holds refunds back: remaining %d, want 1200", got)
	}
}

// A reconcile that fails inside its script leaves nothing behind: retried, it
// applies (Redis keeps what a failing script wrote, so a reconciled marker
// written before the failure would turn the retry into a no-op and lose the
// refund), and a reconcile after that one still changes nothing.
func testReconcileAfterScriptError(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("reconcile-error", 0, 0, 1000, 0, 0)
	key := e.keys.LimiterScope(s.Name)
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 800}).Reservation

	// The scope's hash turns into a string for a moment: the script fails on
	// its first read.
	saved := e.rdb.HGetAll(ctx, key).Val()
	e.rdb.Del(ctx, key)
	e.rdb.Set(ctx, key, "not a hash", time.Minute)
	if err := tb.Reconcile(ctx, r, Cost{Requests: 1, Tokens: 300}); err == nil {
		t.Fatal("Reconcile on a broken hash succeeded")
	}
	if n := e.rdb.Exists(ctx, e.keys.LimiterReconciled(s.Name, r.ID)).Val(); n != 0 {
		t.Fatal("a failed Reconcile left the reconciled marker")
	}
	e.rdb.Del(ctx, key)
	e.rdb.HSet(ctx, key, saved)
	e.rdb.Expire(ctx, key, time.Minute)

	for range 2 {
		if err := tb.Reconcile(ctx, r, Cost{Requests: 1, Tokens: 300}); err != nil {
			t.Fatal(err)
		}
		if got := remaining(mustState(t, tb, s))["tpm"]; got != 700 {
			t.Fatalf("after the retried reconcile: remaining %d, want 700 (the refund applied once)", got)
		}
	}
}

// A scope's bucket list may change (learned limits): a call naming fewer or
// shorter buckets never shortens the expiry of a hash that holds the others'
// usage. Under HoldInFlight the hash lives as long as a reservation holds
// capacity back, however little it took.
func testKeyTTLCoversAllBuckets(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	withDay := modelScope("learned", 0, 10, 0, 1_000_000, 0)
	without := modelScope("learned", 0, 10, 0, 0, 0)
	key := e.keys.LimiterScope(withDay.Name)
	pttl := func() time.Duration { return e.rdb.PTTL(ctx, key).Val() }

	mustReserve(t, tb, withDay, Cost{Requests: 1, Tokens: 500_000}) // tpd full in 12 h
	nearTTL(t, "after a reserve on the day bucket", pttl(), 12*time.Hour+time.Second)
	r := mustReserve(t, tb, without, Cost{Requests: 1}) // rpm full in 12 s
	nearTTL(t, "after a reserve without the day bucket", pttl(), 12*time.Hour+time.Second)
	if err := tb.Release(ctx, r.Reservation); err != nil {
		t.Fatal(err)
	}
	nearTTL(t, "after a release without the day bucket", pttl(), 12*time.Hour+time.Second)
	if got := remaining(mustState(t, tb, withDay))["tpd"]; got != 500_000 {
		t.Fatalf("the day bucket holds %d, want 500000", got)
	}

	o := e.opts()
	o.HoldInFlight = true
	hold := must(NewTokenBucket(e.rdb, o))
	s := modelScope("held-ttl", 0, 0, 1_000_000, 0, 0)
	// 2,000 tokens refill in 120 ms, but stay held until the end of the next
	// in-flight generation: the clock starts at a generation's start.
	if e.clock.Now().UnixMicro()%inflightGen.Microseconds() != 0 {
		t.Fatalf("the clock %v is not at the start of an in-flight generation", e.clock.Now())
	}
	mustReserve(t, hold, s, Cost{Tokens: 2000})
	nearTTL(t, "with a reservation held in flight", e.rdb.PTTL(ctx, e.keys.LimiterScope(s.Name)).Val(), 2*inflightGen+time.Second)
}

// Under HoldInFlight a cost that only what is in flight holds back is told
// so: each bucket's RetryAfter is exactly when the holds lapse (or refill
// covers it, if that comes later), and RetryAfter, since a reconcile may
// free the hold at any moment, is a check again within Options.HoldRetry;
// never the refill-based guess that the floor makes meaningless.
func testRetryAfterHeldInFlight(t *testing.T, e *env) {
	ctx := context.Background()
	o := e.opts()
	o.HoldInFlight = true
	tb := must(NewTokenBucket(e.rdb, o))
	if e.clock.Now().UnixMicro()%inflightGen.Microseconds() != 0 {
		t.Fatalf("the clock %v is not at the start of an in-flight generation", e.clock.Now())
	}
	const hold = 100 * time.Millisecond // the default HoldRetry
	held := func(what string, r *Result, bucketWait time.Duration) {
		t.Helper()
		if r.Allowed || !r.HeldInFlight || r.Penalized {
			t.Fatalf("%s: %+v, want denied, held in flight", what, r)
		}
		if got := bucket(t, r, "tpm").RetryAfter; got != bucketWait {
			t.Fatalf("%s: the bucket's RetryAfter %v, want %v (when the holds lapse)", what, got, bucketWait)
		}
		if want := min(bucketWait, hold); r.RetryAfter < min(bucketWait, 3*hold/4) || r.RetryAfter > min(bucketWait, 5*hold/4) {
			t.Fatalf("%s: RetryAfter %v, want about %v", what, r.RetryAfter, want)
		}
	}

	// 999k of 1M TPM reserved and not reconciled; refill alone would admit
	// 2,000 tokens in 60 ms and 1,001 in 60 µs, but the hold lasts until the
	// end of the next generation, 10 s after the reservation.
	s := modelScope("held", 0, 0, 1_000_000, 0, 0)
	mustReserve(t, tb, s, Cost{Tokens: 999_000})
	e.clock.Add(time.Second)
	for _, c := range []int64{2000, 1001} {
		held(fmt.Sprintf("cost %d", c), mustReserve(t, tb, s, Cost{Tokens: c}), 9*time.Second)
	}
	e.clock.Add(9*time.Second - time.Microsecond)
	held("1µs before the hold lapses", mustReserve(t, tb, s, Cost{Tokens: 2000}), time.Microsecond)
	e.clock.Add(time.Microsecond)
	if r := mustReserve(t, tb, s, Cost{Tokens: 2000}); !r.Allowed {
		t.Fatalf("when the hold lapses: %+v, want allowed", r)
	}

	// A reconcile frees the hold sooner: that is why RetryAfter is short.
	s = modelScope("held-reconciled", 0, 0, 1_000_000, 0, 0)
	a := mustReserve(t, tb, s, Cost{Tokens: 999_000}).Reservation
	held("before the reconcile", mustReserve(t, tb, s, Cost{Tokens: 2000}), 10*time.Second)
	if err := tb.Reconcile(ctx, a, Cost{Tokens: 500_000}); err != nil {
		t.Fatal(err)
	}
	if r := mustReserve(t, tb, s, Cost{Tokens: 2000}); !r.Allowed {
		t.Fatalf("after the reconcile: %+v, want allowed", r)
	}

	// Two generations: 600k held since T, 300k since T+6s, now T+7s. The
	// first hold lapses at T+10s, the second at T+15s; refill counts from
	// the write at T+6s (900k) at 16,666.67 tokens a second.
	e.clock.Set(time.Unix(1_900_000_100, 0))
	one, two := modelScope("held-one", 0, 0, 1_000_000, 0, 0), modelScope("held-two", 0, 0, 1_000_000, 0, 0)
	for _, s := range []Scope{one, two} {
		mustReserve(t, tb, s, Cost{Tokens: 600_000})
	}
	e.clock.Add(6 * time.Second)
	for _, s := range []Scope{one, two} {
		mustReserve(t, tb, s, Cost{Tokens: 300_000})
	}
	e.clock.Add(time.Second)
	// 150k fit once 850k are used: refill gets there at T+9s, the first
	// hold lapses at T+10s.
	held("150k behind the first hold", mustReserve(t, tb, one, Cost{Tokens: 150_000}), 3*time.Second)
	// 200k fit once 800k are used: refill gets there at T+12s, after the
	// first hold lapsed, so refill sets the time, exactly.
	r := mustReserve(t, tb, two, Cost{Tokens: 200_000})
	if r.Allowed || r.HeldInFlight || r.RetryAfter < 5*time.Second || r.RetryAfter > 5*time.Second+time.Microsecond {
		t.Fatalf("200k after the first hold: %+v, want denied for 5s by refill, not held", r)
	}
	e.clock.Add(3*time.Second - time.Microsecond)
	held("150k 1µs before the first hold lapses", mustReserve(t, tb, one, Cost{Tokens: 150_000}), time.Microsecond)
	e.clock.Add(time.Microsecond)
	if r := mustReserve(t, tb, one, Cost{Tokens: 150_000}); !r.Allowed {
		t.Fatalf("150k when the first hold lapses: %+v, want allowed", r)
	}
	e.clock.Add(r.RetryAfter - 3*time.Second - 2*time.Microsecond)
	if r := mustReserve(t, tb, two, Cost{Tokens: 200_000}); r.Allowed {
		t.Fatalf("200k 2µs before its RetryAfter: %+v, want denied", r)
	}
	e.clock.Add(2 * time.Microsecond)
	if r := mustReserve(t, tb, two, Cost{Tokens: 200_000}); !r.Allowed {
		t.Fatalf("200k at its RetryAfter: %+v, want allowed", r)
	}
}

// A scope's hash of the older form, a field per value, is read as it is,
// and the first run that writes keeps its state in the one field m: the
// level it held carries over, the older fields go, the expiry stays.
func testOlderFormState(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("older-form", 0, 0, 1000, 0, 0)
	key := e.keys.LimiterScope(s.Name)
	now := strconv.FormatInt(e.clock.Now().UnixMicro(), 10)
	if err := e.rdb.HSet(ctx, key, "u:tpm", "600", "t:tpm", now, "c:tpm", "600").Err(); err != nil {
		t.Fatal(err)
	}
	e.rdb.PExpire(ctx, key, time.Hour)
	if st := mustState(t, tb, s); st.Buckets[0].Remaining != 400 {
		t.Fatalf("state of the older form: remaining %d, want 400", st.Buckets[0].Remaining)
	}
	if r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 300}); !r.Allowed || r.Buckets[0].Remaining != 100 {
		t.Fatalf("reserve 300 of the 400 left: %+v", r)
	}
	if fields := e.rdb.HKeys(ctx, key).Val(); !slices.Equal(fields, []string{"m"}) {
		t.Fatalf("after a reserve the hash holds %q, want only m", fields)
	}
	nearTTL(t, "the older hash's expiry", e.rdb.PTTL(ctx, key).Val(), time.Hour)
	if r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 200}); r.Allowed {
		t.Fatalf("reserve 200 of the 100 left allowed: %+v", r)
	}
}
