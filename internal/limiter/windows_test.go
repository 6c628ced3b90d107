package limiter

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// allowFunc counts cost in one window of a limit per window, for tests that
// run on several algorithms.
type allowFunc func(ctx context.Context, key string, limit int64, window time.Duration, cost int64) (*Result, error)

// oneWindow is alg's allowFunc: a window set of one window.
func oneWindow(e *env, alg Algorithm) allowFunc {
	w := must(NewWindows(e.rdb, e.opts()))
	return func(ctx context.Context, key string, limit int64, window time.Duration, cost int64) (*Result, error) {
		return w.Allow(ctx, WindowSet{Algorithm: alg, Scope: key,
			Windows: []NamedWindow{{Name: window.String(), Window: Window{limit, window}}}}, cost)
	}
}

// burstAtBoundary fills a 10-per-second limiter 1 ms before a window
// boundary and tries again 1 ms after it; it returns how many were admitted
// in those 2 ms and the last denial, if any.
func burstAtBoundary(t *testing.T, e *env, allow allowFunc) (int, *Result) {
	t.Helper()
	ctx := context.Background()
	e.clock.Set(time.Unix(1_900_000_000, 0).Add(time.Second - time.Millisecond))
	admitted := 0
	var denied *Result
	for _, step := range []time.Duration{0, 2 * time.Millisecond} {
		e.clock.Add(step)
		for range 15 {
			r, err := allow(ctx, "burst", 10, time.Second, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			} else {
				denied = r
			}
		}
	}
	return admitted, denied
}

// The fixed window admits twice its limit across a boundary, in 2 ms.
func testFixedWindowBoundaryBurst(t *testing.T, e *env) {
	n, denied := burstAtBoundary(t, e, oneWindow(e, AlgFixedWindow))
	if n != 20 {
		t.Fatalf("fixed window admitted %d in the 2 ms around a boundary, want 20 (the boundary burst)", n)
	}
	// The last denial came 1 ms into the new window: retry at its end.
	if denied.RetryAfter != 999*time.Millisecond || denied.Remaining != 0 || denied.Limit != 10 {
		t.Fatalf("denial = %+v, want RetryAfter 999ms", denied)
	}
}

// The sliding log admits only its limit across a boundary, and its
// RetryAfter is when the oldest entry leaves the window.
func testSlidingLogNoBoundaryBurst(t *testing.T, e *env) {
	allow := oneWindow(e, AlgSlidingLog)
	n, denied := burstAtBoundary(t, e, allow)
	if n != 10 {
		t.Fatalf("sliding log admitted %d in the 2 ms around a boundary, want 10", n)
	}
	// The entries are 2 ms old: they leave the window in 998 ms.
	if denied.RetryAfter != 998*time.Millisecond {
		t.Fatalf("denial = %+v, want RetryAfter 998ms", denied)
	}
	e.clock.Add(denied.RetryAfter - time.Microsecond)
	if r, _ := allow(context.Background(), "burst", 10, time.Second, 1); r.Allowed {
		t.Fatalf("admitted before RetryAfter")
	}
	e.clock.Add(time.Microsecond)
	if r, _ := allow(context.Background(), "burst", 10, time.Second, 1); !r.Allowed {
		t.Fatalf("denied at RetryAfter: %+v", r)
	}
}

// Under random weighted traffic every decision of the sliding log is the one
// the live entries call for: a cost is admitted exactly when it fits beside
// the costs admitted in the last window, and Remaining is what they leave.
// So no window, wherever it starts, holds more than the limit, and the log
// admits up to it, also after denials that dropped expired entries.
func testSlidingLogExact(t *testing.T, e *env) {
	ctx := context.Background()
	allow := oneWindow(e, AlgSlidingLog)
	rng := rand.New(rand.NewPCG(1, 2))
	const limit, window = 50, time.Second
	type adm struct {
		at   time.Time
		cost int64
	}
	var got []adm
	full, reached := 0, false
	for i := range 400 {
		e.clock.Add(time.Duration(rng.IntN(20_000)) * time.Microsecond)
		cost := int64(1 + rng.IntN(8))
		now := e.clock.Now()
		var live int64 // an entry at t counts while t > now - window
		for _, a := range got {
			if a.at.After(now.Add(-window)) {
				live += a.cost
			}
		}
		r, err := allow(ctx, "exact", limit, window, cost)
		if err != nil {
			t.Fatal(err)
		}
		want := live+cost <= limit
		if r.Allowed != want {
			t.Fatalf("decision %d: cost %d beside %d live of %d: allowed %v, want %v (%+v)", i, cost, live, limit, r.Allowed, want, r)
		}
		if r.Allowed {
			got = append(got, adm{r.Time, cost})
			live += cost
			reached = reached || live == limit
		} else {
			full++
		}
		if r.Remaining != limit-live {
			t.Fatalf("decision %d: Remaining %d, want %d (limit less %d live)", i, r.Remaining, limit-live, live)
		}
	}
	if full == 0 || !reached {
		t.Fatalf("the traffic never reached the limit (%d denials, exactly full %v)", full, reached)
	}
	for i := range got {
		var sum int64
		for j := i; j < len(got) && got[j].at.Sub(got[i].at) < window; j++ {
			sum += got[j].cost
		}
		if sum > limit {
			t.Fatalf("window from %v holds %d > %d", got[i].at, sum, limit)
		}
	}
}

// The sliding counter has no boundary burst: the previous window still
// weighs almost fully, and RetryAfter is when its weight leaves room.
func testSlidingCounterNoBoundaryBurst(t *testing.T, e *env) {
	allow := oneWindow(e, AlgSlidingWindow)
	n, denied := burstAtBoundary(t, e, allow)
	if n != 10 {
		t.Fatalf("sliding counter admitted %d in the 2 ms around a boundary, want 10", n)
	}
	// 1 ms into the window the previous 10 weigh 9.99; one more fits once
	// they weigh 9, at 100 ms: 99 ms from now.
	if denied.RetryAfter != 99*time.Millisecond {
		t.Fatalf("denial = %+v, want RetryAfter 99ms", denied)
	}
	e.clock.Add(denied.RetryAfter - time.Microsecond)
	if r, _ := allow(context.Background(), "burst", 10, time.Second, 1); r.Allowed {
		t.Fatalf("admitted before RetryAfter")
	}
	e.clock.Add(time.Microsecond)
	if r, _ := allow(context.Background(), "burst", 10, time.Second, 1); !r.Allowed {
		t.Fatalf("denied at RetryAfter: %+v", r)
	}
	// A denial that only the next window resolves: 10 more in this window
	// weigh fully until it ends, then fade.
	e.clock.Set(time.Unix(1_900_000_100, 0))
	for range 10 {
		allow(context.Background(), "next", 10, time.Second, 1)
	}
	r, _ := allow(context.Background(), "next", 10, time.Second, 4)
	// The window ends in 1 s; then 10 weigh 6 after 400 ms.
	if r.Allowed || r.RetryAfter != 1400*time.Millisecond {
		t.Fatalf("denial = %+v, want RetryAfter 1.4s", r)
	}
	e.clock.Add(r.RetryAfter)
	if r, _ := allow(context.Background(), "next", 10, time.Second, 4); !r.Allowed {
		t.Fatalf("denied at RetryAfter: %+v", r)
	}
}

// A set of sliding windows counts in every window or none: a denial by the
// day window leaves the second and minute windows untouched.
func testMultiWindowAllOrNothing(t *testing.T, e *env) {
	ctx := context.Background()
	w := must(NewWindows(e.rdb, e.opts()))
	e.clock.Set(time.Unix(1_900_000_000-1_900_000_000%86400, 0).Add(time.Hour))
	set := WindowSet{Algorithm: AlgSlidingWindow, Scope: "tenant", Windows: []NamedWindow{
		{"second", Window{Limit: 5, Period: time.Second}}, {"minute", Window{Limit: 20, Period: time.Minute}},
		{"day", Window{Limit: 3, Period: 24 * time.Hour}}}}
	for i := range 3 {
		if r, err := w.Allow(ctx, set, 1); err != nil || !r.Allowed {
			t.Fatalf("admission %d: %+v, %v", i, r, err)
		}
	}
	r, err := w.Allow(ctx, set, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Allowed || len(r.Buckets) != 3 {
		t.Fatalf("the day's fourth was not denied: %+v", r)
	}
	if r.Buckets[0].Remaining != 2 || r.Buckets[1].Remaining != 17 || r.Buckets[0].RetryAfter != 0 || r.Buckets[1].RetryAfter != 0 {
		t.Fatalf("the denial by the day window took from the others: %+v", r.Buckets)
	}
	// The day window's count weighs until the next day ends.
	if r.RetryAfter != r.Buckets[2].RetryAfter || r.RetryAfter < 23*time.Hour || r.Limit != 3 {
		t.Fatalf("RetryAfter = %v, tightest %d; want the day window's, %+v", r.RetryAfter, r.Limit, r.Buckets)
	}
	// With room in the day, the second window binds.
	set.Windows[2].Limit = 100
	for i := range 3 {
		if r, _ := w.Allow(ctx, set, 1); !r.Allowed != (i == 2) {
			t.Fatalf("admission %d with room in the day: %+v", i, r)
		}
	}
}
