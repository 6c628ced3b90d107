package limiter

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// A lease takes a slice at once, spends it locally, gives back the unused
// part, respects penalties and never probes.
func testLease(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	// Periods so long that nothing refills during the test.
	s := Scope{Name: "lease", Buckets: []Bucket{
		{Name: "r", Unit: UnitRequests, Limit: 100, Period: 1000 * time.Hour},
		{Name: "t", Unit: UnitTokens, Limit: 10000, Period: 1000 * time.Hour},
	}}
	level := func(wantR, wantT int64) {
		t.Helper()
		if got := remaining(mustState(t, tb, s)); got["r"] != wantR || got["t"] != wantT {
			t.Fatalf("remaining = %v, want r %d t %d", got, wantR, wantT)
		}
	}

	l := must(NewLease(tb, s, LeaseOptions{Size: Cost{Requests: 10, Tokens: 1000}}))
	for i := range 5 {
		if r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 100}); err != nil || !r.Allowed {
			t.Fatalf("take %d: %+v, %v", i, r, err)
		}
	}
	level(90, 9000) // the whole slice is counted in Redis
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	level(95, 9500) // the unused half came back
	if _, err := l.Take(ctx, Cost{Requests: 1}); !errors.Is(err, ErrLeaseClosed) {
		t.Fatalf("Take after Close: %v", err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// A take larger than the slice leases what it needs; an old slice is
	// given back before a new one is leased.
	l = must(NewLease(tb, s, LeaseOptions{Size: Cost{Requests: 10, Tokens: 1000}, MaxAge: time.Second}))
	defer l.Close(ctx)
	if r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 3000}); err != nil || !r.Allowed {
		t.Fatalf("large take: %+v, %v", r, err)
	}
	level(85, 6500)
	e.clock.Add(time.Second)
	if r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 1}); err != nil || !r.Allowed {
		t.Fatalf("take after MaxAge: %+v, %v", r, err)
	}
	level(84, 5500) // 9 requests back, then a new slice of 10 and 1000

	// During a penalty a lease spends what it holds (for at most MaxAge)
	// and leases nothing; after it, it never becomes the probe.
	if err := tb.Penalize(ctx, s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 1}); err != nil || !r.Allowed {
		t.Fatalf("local take during a penalty: %+v, %v", r, err)
	}
	e.clock.Add(time.Second)
	if r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 1}); err != nil || r.Allowed || !r.Penalized || r.RetryAfter != 9*time.Second {
		t.Fatalf("lease after MaxAge during a penalty: %+v, %v; want denied for 9s", r, err)
	}
	e.clock.Add(9 * time.Second)
	if r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 1}); err != nil || r.Allowed || !r.Penalized {
		t.Fatalf("lease after the penalty, before the probe: %+v, %v; want denied", r, err)
	}
	probe := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 1})
	if !probe.Allowed || !probe.Reservation.Probe {
		t.Fatalf("the probe went to a lease: %+v", probe)
	}
	if err := tb.Reconcile(ctx, probe.Reservation, Cost{Requests: 1, Tokens: 1}); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Take(ctx, Cost{Requests: 1, Tokens: 1}); err != nil || !r.Allowed {
		t.Fatalf("lease after the probe: %+v, %v", r, err)
	}
}

// The documented bound: what leases spend in any window is at most
// capacity + refill over the window + what was leased and unspent at its
// start, and that bound is reached.
func testLeaseOvershootBound(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	const capacity, period = 100, 10 * time.Second
	s := Scope{Name: "bound", Buckets: []Bucket{{Name: "t", Unit: UnitTokens, Limit: capacity, Period: period}}}
	newLeases := func(maxAge time.Duration) []*Lease {
		ls := make([]*Lease, 3)
		for i := range ls {
			ls[i] = must(NewLease(tb, s, LeaseOptions{Size: Cost{Tokens: 20}, MaxAge: maxAge}))
		}
		return ls
	}
	take := func(l *Lease, n int64) bool {
		t.Helper()
		r, err := l.Take(ctx, Cost{Tokens: n})
		if err != nil {
			t.Fatal(err)
		}
		return r.Allowed
	}

	// Three leases hold 19 unspent tokens each while the bucket refills:
	// then 57 + 100 are spent in one instant, and not one more.
	leases := newLeases(time.Hour)
	for _, l := range leases {
		take(l, 1)
	}
	if r := mustReserve(t, tb, s, Cost{Tokens: 40}); !r.Allowed {
		t.Fatalf("draining the bucket: %+v", r)
	}
	e.clock.Add(period)
	spent := int64(0)
	for _, l := range append(leases, leases[0], leases[0], leases[0], leases[0], leases[0]) {
		for take(l, 1) {
			spent++
		}
	}
	if spent != capacity+57 {
		t.Fatalf("spent %d in one instant, want capacity + the 57 leased and unspent", spent)
	}
	for _, l := range leases {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// One lease alone is no exception: 19 tokens unspent while the bucket
	// refills, then 19 + 100 spent in one instant.
	l := must(NewLease(tb, Scope{Name: "bound-one", Buckets: s.Buckets}, LeaseOptions{Size: Cost{Tokens: 20}, MaxAge: time.Hour}))
	for i := range 81 {
		if !take(l, 1) {
			t.Fatalf("take %d of the first 81 denied", i)
		}
	}
	e.clock.Add(period)
	spent = 0
	for take(l, 1) {
		spent++
	}
	if spent != capacity+19 {
		t.Fatalf("one lease spent %d in one instant, want capacity + the 19 leased and unspent", spent)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Random bursts and idle spells: the bound holds for every window.
	e.clock.Add(period)
	leases = newLeases(3 * time.Second)
	type spend struct {
		at       time.Time
		cost     int64
		unspent0 int64 // leased and unspent just before
	}
	var spends []spend
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1500 {
		if rng.IntN(50) == 0 {
			e.clock.Add(time.Duration(1+rng.IntN(10)) * time.Second)
		} else {
			e.clock.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
		}
		var unspent int64
		for _, l := range leases {
			if l.res != nil {
				unspent += l.left.Tokens
			}
		}
		cost := int64(1 + rng.IntN(10))
		if take(leases[rng.IntN(len(leases))], cost) {
			spends = append(spends, spend{e.clock.Now(), cost, unspent})
		}
	}
	rate := float64(capacity) / float64(period)
	worst := 0.0
	for i := range spends {
		var sum int64
		for j := i; j < len(spends); j++ {
			sum += spends[j].cost
			w := spends[j].at.Sub(spends[i].at)
			over := float64(sum) - capacity - rate*float64(w)
			if over > float64(spends[i].unspent0)+1e-6 {
				t.Fatalf("spent %d in %v from %v: %.3f over capacity + refill, more than the %d leased and unspent",
					sum, w, spends[i].at, over, spends[i].unspent0)
			}
			worst = max(worst, over)
		}
	}
	t.Logf("%d spends; worst window %.1f over capacity + refill", len(spends), worst)
	for _, l := range leases {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
