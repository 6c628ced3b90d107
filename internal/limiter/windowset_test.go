package limiter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// The windows of the API's tiers.
var apiWindows = []NamedWindow{
	{Name: "second", Window: Window{Period: time.Second}},
	{Name: "minute", Window: Window{Period: time.Minute}},
	{Name: "hour", Window: Window{Period: time.Hour}},
	{Name: "day", Window: Window{Period: 24 * time.Hour}},
}

// midWindow is a time well inside every window of apiWindows (12:30:30.5
// UTC), so a frozen clock sees no boundary.
var midWindow = time.Unix(1_900_000_000-1_900_000_000%86400, 0).Add(12*time.Hour + 30*time.Minute + 30*time.Second + 500*time.Millisecond)

func set(alg Algorithm, scope string, ws ...NamedWindow) WindowSet {
	return WindowSet{Algorithm: alg, Scope: scope, Windows: ws}
}

func nw(name string, limit int64, period time.Duration) NamedWindow {
	return NamedWindow{Name: name, Window: Window{Limit: limit, Period: period}}
}

func mustAllow(t *testing.T, w *Windows, s WindowSet, cost int64) *Result {
	t.Helper()
	r, err := w.Allow(context.Background(), s, cost)
	if err != nil {
		t.Fatalf("Allow(%s, %d): %v", s.Scope, cost, err)
	}
	return r
}

// left is the Remaining of every window of s, by name, read with a zero cost.
func left(t *testing.T, w *Windows, s WindowSet) map[string]int64 {
	t.Helper()
	return remaining(mustAllow(t, w, s, 0))
}

// Every algorithm counts a set's windows together: a denial by the day
// window takes nothing from the second and minute windows, and the denial
// names the window that frees last.
func testWindowSetAllOrNothing(t *testing.T, e *env) {
	w := must(NewWindows(e.rdb, e.opts()))
	e.clock.Set(midWindow)
	for _, alg := range Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			s := set(alg, "aon-"+string(alg), nw("second", 5, time.Second), nw("minute", 20, time.Minute), nw("day", 3, 24*time.Hour))
			for i := range 3 {
				if r := mustAllow(t, w, s, 1); !r.Allowed {
					t.Fatalf("admission %d: %+v", i, r)
				}
			}
			r := mustAllow(t, w, s, 1)
			if r.Allowed || len(r.Buckets) != 3 {
				t.Fatalf("the day's fourth was not denied: %+v", r)
			}
			if got := remaining(r); got["second"] != 2 || got["minute"] != 17 || got["day"] != 0 {
				t.Fatalf("the denial by the day window took from the others: %v", got)
			}
			if r.Buckets[0].RetryAfter != 0 || r.Buckets[1].RetryAfter != 0 || r.Buckets[2].RetryAfter <= 0 {
				t.Fatalf("only the day window denies: %+v", r.Buckets)
			}
			if tight := r.Tightest(); tight != 2 || r.RetryAfter != r.Buckets[2].RetryAfter || r.Limit != 3 || r.Remaining != 0 {
				t.Fatalf("tightest %d, Retry %v, Limit %d: want the day window's", tight, r.RetryAfter, r.Limit)
			}
			// With room in the day, the second window binds, and frees first.
			s.Windows[2].Limit = 100
			for i := range 3 {
				r := mustAllow(t, w, s, 1)
				if r.Allowed != (i < 2) {
					t.Fatalf("admission %d with room in the day: %+v", i, r)
				}
				if !r.Allowed && (r.Tightest() != 0 || r.RetryAfter != r.Buckets[0].RetryAfter || r.RetryAfter > time.Second) {
					t.Fatalf("denial by the second window: %+v", r)
				}
			}
		})
	}
}

// A key's own windows and an endpoint's windows of the same scope are
// counted together when a request names both, and apart otherwise: the
// endpoint's denial takes nothing from the key's windows.
func testWindowSetEndpoint(t *testing.T, e *env) {
	w := must(NewWindows(e.rdb, e.opts()))
	e.clock.Set(midWindow)
	for _, alg := range Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			key := nw("minute", 10, time.Minute)
			own := set(alg, "ep-"+string(alg), key)
			upload := set(alg, own.Scope, key, nw("files.create:minute", 2, time.Minute))
			for i := range 3 {
				r := mustAllow(t, w, upload, 1)
				if r.Allowed != (i < 2) {
					t.Fatalf("upload %d: %+v", i, r)
				}
				if !r.Allowed && r.Buckets[r.Tightest()].Name != "files.create:minute" {
					t.Fatalf("upload denied by %q", r.Buckets[r.Tightest()].Name)
				}
			}
			admitted := 0
			for mustAllow(t, w, own, 1).Allowed {
				admitted++
			}
			if admitted != 8 {
				t.Fatalf("after 2 uploads and a denied one, the key admitted %d more, want 8", admitted)
			}
		})
	}
}

// A lease counts its slice at once, spends it locally, and gives back the
// unspent part, in every algorithm; a slice counted in a window that has
// ended since is not taken from the next one.
func testWindowPrefetchGiveBack(t *testing.T, e *env) {
	ctx := context.Background()
	w := must(NewWindows(e.rdb, e.opts()))
	for _, alg := range Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			e.clock.Set(midWindow)
			s := set(alg, "give-"+string(alg), nw("minute", 100, time.Minute), nw("day", 1000, 24*time.Hour))
			l := w.Prefetch(s, PrefetchOptions{Size: 10})
			for i := range 3 {
				r, err := l.Take(ctx, 1)
				if err != nil || !r.Allowed {
					t.Fatalf("take %d: %+v, %v", i, r, err)
				}
				// Remaining counts what is left of the slice as this
				// process's own.
				if got := remaining(r); got["minute"] != 99-int64(i) {
					t.Fatalf("take %d: remaining %v, want minute %d", i, got, 99-i)
				}
			}
			if got := left(t, w, s); got["minute"] != 90 || got["day"] != 990 {
				t.Fatalf("while leased: %v, want the whole slice counted", got)
			}
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if got := left(t, w, s); got["minute"] != 97 || got["day"] != 997 {
				t.Fatalf("after Close: %v, want the 7 unspent back", got)
			}
			if _, err := l.Take(ctx, 1); !errors.Is(err, ErrPrefetchClosed) {
				t.Fatalf("Take after Close: %v", err)
			}

			// A slice leased just before the minute ends, given back after.
			if alg == AlgTokenBucket || alg == AlgSlidingLog {
				return // they have no window boundaries
			}
			e.clock.Set(midWindow.Add(29*time.Second + 400*time.Millisecond)) // 12:30:59.9
			l = w.Prefetch(s, PrefetchOptions{Size: 10, MaxAge: time.Hour})
			if r, err := l.Take(ctx, 1); err != nil || !r.Allowed {
				t.Fatalf("take: %+v, %v", r, err)
			}
			e.clock.Add(time.Second) // 12:31:00.9: a new minute
			before := left(t, w, s)
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
			after := left(t, w, s)
			if after["day"] != before["day"]+9 {
				t.Fatalf("day window: %d before the give-back, %d after; want 9 back", before["day"], after["day"])
			}
			switch alg {
			case AlgFixedWindow:
				if after["minute"] != 100 || before["minute"] != 100 {
					t.Fatalf("the new minute: %d then %d, want 100: the slice was counted in the last one", before["minute"], after["minute"])
				}
			case AlgSlidingWindow:
				// 14 of the last minute (3 + the slice of 10 + 1 spent... less
				// the 7 given back) weigh 98.5% now; the give-back lowers
				// that previous count by 9.
				if after["minute"] <= before["minute"] {
					t.Fatalf("the previous minute's weight did not fall: %d then %d", before["minute"], after["minute"])
				}
			}
		})
	}
}

// Leases of one set never admit more than its limit at one instant, and
// reach it exactly; across a fixed window's boundary they add at most what
// they held unspent, as docs/ARCHITECTURE.md states, and that bound is
// reached.
func testWindowPrefetchBound(t *testing.T, e *env) {
	ctx := context.Background()
	w := must(NewWindows(e.rdb, e.opts()))
	take := func(l *WindowPrefetch) bool {
		t.Helper()
		r, err := l.Take(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return r.Allowed
	}
	for _, alg := range Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			e.clock.Set(midWindow)
			s := set(alg, "bound-"+string(alg), nw("minute", 20, time.Minute))
			ls := []*WindowPrefetch{w.Prefetch(s, PrefetchOptions{Size: 6}), w.Prefetch(s, PrefetchOptions{Size: 6}), w.Prefetch(s, PrefetchOptions{Size: 6})}
			spent := 0
			for range 10 {
				for _, l := range ls {
					if take(l) {
						spent++
					}
				}
			}
			if spent != 20 {
				t.Fatalf("three leases spent %d in one instant, want exactly the limit, 20", spent)
			}
			for _, l := range ls {
				if err := l.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	// Three leases hold 5 unspent each as a fixed minute ends: the next
	// minute spends 20 + 15.
	e.clock.Set(midWindow.Add(29 * time.Second))
	s := set(AlgFixedWindow, "bound-edge", nw("minute", 20, time.Minute))
	ls := []*WindowPrefetch{}
	for range 3 {
		l := w.Prefetch(s, PrefetchOptions{Size: 6, MaxAge: time.Hour})
		take(l)
		ls = append(ls, l)
	}
	e.clock.Add(2 * time.Second)
	spent := 0
	for range 20 {
		for _, l := range ls {
			if take(l) {
				spent++
			}
		}
	}
	if spent != 20+15 {
		t.Fatalf("the new minute spent %d, want its limit and the 15 held unspent", spent)
	}
	for _, l := range ls {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Bad sets and costs fail with an error naming what is wrong, and write
// nothing.
func testWindowSetInvalid(t *testing.T, e *env) {
	w := must(NewWindows(e.rdb, e.opts()))
	for _, c := range []struct {
		s    WindowSet
		cost int64
		want string
	}{
		{set(AlgFixedWindow, ""), 1, "Scope is empty"},
		{set("leaky", "x", nw("m", 1, time.Minute)), 1, `unknown Algorithm "leaky"`},
		{set(AlgFixedWindow, "x"), 1, "no windows"},
		{set(AlgFixedWindow, "x", nw("", 1, time.Minute)), 1, "window name"},
		{set(AlgFixedWindow, "x", nw("a{b}", 1, time.Minute)), 1, "braces"},
		{set(AlgFixedWindow, "x", nw("m", 1, time.Minute), nw("m", 2, time.Hour)), 1, `"m" appears twice`},
		{set(AlgSlidingLog, "x", nw("m", 0, time.Minute)), 1, "Limit 0 must be positive"},
		{set(AlgSlidingWindow, "x", nw("m", 5, time.Minute)), -1, "negative cost"},
	} {
		if _, err := w.Allow(context.Background(), c.s, c.cost); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v cost %d: err %v, want %q", c.s, c.cost, err, c.want)
		}
	}
	_, err := w.Allow(context.Background(), set(AlgTokenBucket, "x", nw("m", 5, time.Minute)), 6)
	if !errors.Is(err, ErrCostExceedsCapacity) || !strings.Contains(err.Error(), `"m"`) {
		t.Fatalf("cost above the limit: %v", err)
	}
	if keys := scanKeys(t, e.rdb, e.keys.Prefix()+":*"); len(keys) != 0 {
		t.Fatalf("refused calls wrote %v", keys)
	}
}

// Every key of a window set has a TTL that covers its longest window, a
// call naming fewer windows never shortens it, and all of a set's keys
// share the scope's hash tag.
func testWindowSetTTLs(t *testing.T, e *env) {
	ctx := context.Background()
	w := must(NewWindows(e.rdb, e.opts()))
	e.clock.Set(midWindow)
	pacer := must(NewSpacer(e.rdb, e.opts()))
	for _, alg := range Algorithms {
		scope := "ttl-" + string(alg)
		long := set(alg, scope, nw("second", 10, time.Second), nw("files.create:hour", 10, time.Hour))
		short := set(alg, scope, nw("second", 10, time.Second))
		mustAllow(t, w, long, 1)
		mustAllow(t, w, short, 1)
		l := w.Prefetch(short, PrefetchOptions{Size: 3})
		if _, err := l.Take(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pacer.Slot(ctx, "ttl-pacer", "ev", time.Second); err != nil {
		t.Fatal(err)
	}
	keys := scanKeys(t, e.rdb, e.keys.Prefix()+":*")
	if len(keys) < 7 {
		t.Fatalf("only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		ttl := e.rdb.PTTL(ctx, k).Val()
		if ttl == -2 {
			continue // expired since the scan: a second's keys may, on a slow machine
		}
		if ttl <= 0 {
			t.Errorf("key %s has no TTL (%v)", k, ttl)
		}
		if !strings.Contains(k, "{ttl-") {
			t.Errorf("key %s lacks its scope's hash tag", k)
		}
		// The hour window's count (in the hash of fixed and sliding sets,
		// in its own log for the sliding log) must outlive the short call's
		// second; a token bucket's, until the one taken of 10 per hour is
		// back (6 min).
		need := 29 * time.Minute
		switch {
		case strings.Contains(k, "second") || strings.Contains(k, "pace"):
			continue
		case strings.Contains(k, ":tb:"):
			need = 5 * time.Minute
		}
		if ttl < need {
			t.Errorf("key %s: PTTL %v, shorter than its hour window needs", k, ttl)
		}
	}
}

// A pacer gives slots an interval apart in the order events ask, keeps an
// event's slot when it asks again, and gives it a new one at the back after
// Done; scopes are paced apart.
func testSpacer(t *testing.T, e *env) {
	ctx := context.Background()
	p := must(NewSpacer(e.rdb, e.opts()))
	e.clock.Set(midWindow)
	const interval = 100 * time.Millisecond
	slot := func(scope, id string) time.Duration {
		t.Helper()
		d, err := p.Slot(ctx, scope, id, interval)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range 10 {
		if d := slot("host-a", fmt.Sprint("ev", i)); d != time.Duration(i)*interval {
			t.Fatalf("event %d: wait %v, want %v", i, d, time.Duration(i)*interval)
		}
	}
	if d := slot("host-b", "ev0"); d != 0 {
		t.Fatalf("another scope waits %v behind the first", d)
	}
	e.clock.Add(250 * time.Millisecond)
	if d := slot("host-a", "ev5"); d != 250*time.Millisecond {
		t.Fatalf("asking again: wait %v, want the rest of its slot's 500ms", d)
	}
	if d := slot("host-a", "ev1"); d != 0 {
		t.Fatalf("a slot passed: wait %v", d)
	}
	if err := p.Done(ctx, "host-a", "ev1"); err != nil {
		t.Fatal(err)
	}
	if d := slot("host-a", "ev1"); d != 750*time.Millisecond {
		t.Fatalf("after Done: wait %v, want the slot after the ten given (1s from the start)", d)
	}
	// Concurrent askers on several connections get distinct slots, an
	// interval apart.
	var mu sync.Mutex
	got := map[time.Duration]bool{}
	var wg sync.WaitGroup
	for c := range 3 {
		pc := must(NewSpacer(e.newClient(), e.opts()))
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 5 {
					d, err := pc.Slot(ctx, "host-c", fmt.Sprint(c, g, i), interval)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					got[d] = true
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for i := range 60 {
		if !got[time.Duration(i)*interval] {
			t.Fatalf("60 concurrent events: no slot at %v (%d distinct)", time.Duration(i)*interval, len(got))
		}
	}
}

// childMarker makes the test binary a child process of
// TestWindowsExactAcrossProcesses.
const childMarker = "LIMITER_WINDOWS_CHILD"

// windowsChild is that child: for each algorithm and window of apiWindows,
// 3 goroutines try 15 admissions each on the set of one window of limit
// 25, at the frozen time given; it prints how many it admitted, by set.
// Its arguments: the Redis URL, the key prefix, the time in µs.
func windowsChild() {
	opt, err := redis.ParseURL(os.Args[1])
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	at, _ := strconv.ParseInt(os.Args[3], 10, 64)
	w := must(NewWindows(rdb, Options{Keys: rkeys.New(os.Args[2]), Clock: func() time.Time { return time.UnixMicro(at) }}))
	// Start together: processes started under load may begin further
	// apart than the window of a second lives (below).
	ready, start := childBarrier(os.Args[2])
	ctx := context.Background()
	if err := rdb.Incr(ctx, ready).Err(); err != nil {
		panic(err)
	}
	if err := rdb.BLPop(ctx, time.Minute, start).Err(); err != nil {
		panic(err)
	}
	var mu sync.Mutex
	admitted := map[string]int{}
	// One window at a time, the second's first: its keys, set at the
	// stopped clock's instant, outlive it by only 1.5 s of Redis's time,
	// which a machine under load could spend on all the windows at once.
	for _, win := range apiWindows {
		var wg sync.WaitGroup
		for _, alg := range Algorithms {
			s := set(alg, string(alg)+"-"+win.Name, nw(win.Name, 25, win.Period))
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 15 {
						r, err := w.Allow(context.Background(), s, 1)
						if err != nil {
							panic(err)
						}
						if r.Allowed {
							mu.Lock()
							admitted[s.Scope]++
							mu.Unlock()
						}
					}
				}()
			}
		}
		wg.Wait()
	}
	_ = json.NewEncoder(os.Stdout).Encode(admitted)
}

// childBarrier names the keys the children of prefix count themselves
// ready in and wait on to start.
func childBarrier(prefix string) (ready, start string) {
	return prefix + ":test:ready", prefix + ":test:start"
}

// Each algorithm admits exactly its limit in each window (second, minute,
// hour, day) when four processes of three goroutines each try seven times
// the limit at once.
func TestWindowsExactAcrossProcesses(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, 1)
	prefix := testutil.Prefix(t)
	t.Cleanup(func() {
		for _, k := range scanKeys(t, rdb, prefix+":*") {
			rdb.Del(context.Background(), k)
		}
	})
	const procs = 4
	outs := make([]map[string]int, procs)
	ready, start := childBarrier(prefix)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stdout, stderr, code := testutil.MainOutput(t, childMarker, os.Environ(),
				testutil.RedisURLForDB(t, 1), prefix, strconv.FormatInt(midWindow.UnixMicro(), 10))
			if code != 0 {
				t.Errorf("child %d exited %d: %s", i, code, stderr)
				return
			}
			if err := json.Unmarshal([]byte(stdout), &outs[i]); err != nil {
				t.Errorf("child %d: %v: %q", i, err, stdout)
			}
		}()
	}
	testutil.Eventually(t, time.Minute, func() bool {
		n, _ := rdb.Get(context.Background(), ready).Int()
		return n == procs || t.Failed()
	})
	for range procs {
		rdb.RPush(context.Background(), start, "1")
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, alg := range Algorithms {
		for _, win := range apiWindows {
			scope := string(alg) + "-" + win.Name
			sum, parts := 0, []int{}
			for _, o := range outs {
				sum += o[scope]
				parts = append(parts, o[scope])
			}
			t.Logf("%s: %v", scope, parts)
			if sum != 25 {
				t.Errorf("%s: %d processes admitted %v = %d, want exactly the limit, 25", scope, procs, parts, sum)
			}
		}
	}
}
