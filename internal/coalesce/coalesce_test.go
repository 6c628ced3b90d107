package coalesce

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// result is what a test's call returns: which call it was, and for how
// many callers.
type result struct{ call, n int }

// blocking returns fn, whose calls each wait for a value on release, and a
// channel that says which call started.
func blocking() (fn func(context.Context, int) result, started chan int, release chan struct{}) {
	started, release = make(chan int, 16), make(chan struct{})
	var mu sync.Mutex
	calls := 0
	fn = func(_ context.Context, n int) result {
		mu.Lock()
		calls++
		i := calls
		mu.Unlock()
		started <- i
		<-release
		return result{call: i, n: n}
	}
	return fn, started, release
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Callers that come while a call is under way share the next call, never
// the one under way: it began before them. The next call is told how many
// it answers.
func TestLaterCallersShareTheNextCall(t *testing.T) {
	t.Parallel()
	var g Group[string, result]
	fn, started, release := blocking()
	ctx := t.Context()
	first := make(chan result, 1)
	go func() { r, _, _ := g.Do(ctx, "k", fn); first <- r }()
	if i := <-started; i != 1 {
		t.Fatalf("first call is %d", i)
	}
	later := make(chan result, 5)
	for range 5 {
		go func() { r, _, _ := g.Do(ctx, "k", fn); later <- r }()
	}
	// Another key does not wait for this one.
	other := make(chan result, 1)
	go func() { r, _, _ := g.Do(ctx, "other", fn); other <- r }()
	if i := <-started; i != 2 {
		t.Fatalf("the other key's call is %d", i)
	}
	waitFor(t, func() bool { return g.waiting("k") == 5 })
	release <- struct{}{}
	release <- struct{}{}
	if r := <-first; r != (result{call: 1, n: 1}) {
		t.Fatalf("first caller got %+v", r)
	}
	if r := <-other; r != (result{call: 2, n: 1}) {
		t.Fatalf("the other key's caller got %+v", r)
	}
	if i := <-started; i != 3 {
		t.Fatalf("next call is %d", i)
	}
	close(release)
	for range 5 {
		if r := <-later; r != (result{call: 3, n: 5}) {
			t.Fatalf("a caller that came during call 1 got %+v, want call 3 for 5", r)
		}
	}
	if c := g.Calls(); c != 3 {
		t.Fatalf("calls = %d, want 3", c)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.slots) != 0 {
		t.Fatalf("%d slots left", len(g.slots))
	}
}

// A caller whose context ends stops waiting; the call it waited for still
// answers the others.
func TestCancelledCallerStopsWaiting(t *testing.T) {
	t.Parallel()
	var g Group[string, result]
	fn, started, release := blocking()
	go func() { _, _, _ = g.Do(t.Context(), "k", fn) }()
	<-started
	leader := make(chan result, 1)
	go func() { r, _, _ := g.Do(t.Context(), "k", fn); leader <- r }()
	waitFor(t, func() bool { return g.waiting("k") == 1 })
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() { _, _, err := g.Do(ctx, "k", fn); gone <- err }()
	waitFor(t, func() bool { return g.waiting("k") == 2 })
	cancel()
	if err := <-gone; err == nil {
		t.Fatal("a cancelled caller got no error")
	}
	release <- struct{}{}
	<-started
	close(release)
	if r := <-leader; r.call != 2 || r.n != 2 {
		t.Fatalf("the next call's leader got %+v, want call 2 for 2 callers", r)
	}
}

// waiting returns how many callers wait for key's next call.
func (g *Group[K, R]) waiting(key K) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.slots[key]; s != nil && s.next != nil {
		return s.next.n
	}
	return 0
}
