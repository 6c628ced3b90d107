package budget

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/money"
)

// Calls that come while a read is under way share the next read, never the
// one under way: it began before them.
func TestStatusReadsNeverAnswerWithAnEarlierRead(t *testing.T) {
	t.Parallel()
	var g statusReads
	acct := Account{TenantID: "ten_a", Budget: money.PerDollar}
	started := make(chan int, 10)
	release := make(chan struct{})
	n := 0
	var mu sync.Mutex
	read := func(context.Context, Account) (*Decision, error) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		started <- i
		<-release
		return &Decision{Spent: money.Micros(i)}, nil
	}
	ctx := t.Context()
	first := make(chan *Decision, 1)
	go func() { d, _ := g.do(ctx, acct, read); first <- d }()
	if i := <-started; i != 1 {
		t.Fatalf("first read is %d", i)
	}
	// Five calls while read 1 is under way.
	later := make(chan *Decision, 5)
	for range 5 {
		go func() { d, _ := g.do(ctx, acct, read); later <- d }()
	}
	waitFor(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		s := g.slots[acct]
		return s != nil && s.next != nil && s.next.callers == 5
	})
	release <- struct{}{}
	if d := <-first; d.Spent != 1 {
		t.Fatalf("first call got read %d", d.Spent)
	}
	if i := <-started; i != 2 {
		t.Fatalf("second read is %d", i)
	}
	close(release)
	seen := map[*Decision]bool{}
	for range 5 {
		d := <-later
		if d.Spent != 2 {
			t.Fatalf("a call made during read 1 got read %d, want 2", d.Spent)
		}
		if seen[d] {
			t.Fatal("two callers share one Decision: want a copy each")
		}
		seen[d] = true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reads != 2 || len(g.slots) != 0 {
		t.Fatalf("reads = %d (want 2), slots left = %d", g.reads, len(g.slots))
	}
}

// A call whose context ends stops waiting; the read it waited for still
// answers the others.
func TestStatusReadsWaiterCancelled(t *testing.T) {
	t.Parallel()
	var g statusReads
	acct := Account{TenantID: "ten_a", Budget: money.PerDollar}
	release := make(chan struct{})
	read := func(context.Context, Account) (*Decision, error) {
		<-release
		return &Decision{Spent: 7}, nil
	}
	go func() { _, _ = g.do(t.Context(), acct, read) }()
	waitFor(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.slots[acct] != nil })
	leaderDone := make(chan *Decision, 1)
	go func() { d, _ := g.do(t.Context(), acct, read); leaderDone <- d }() // leads read 2
	waitFor(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.slots[acct].next != nil })
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() { _, err := g.do(ctx, acct, read); gone <- err }()
	waitFor(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.slots[acct].next.callers == 2 })
	cancel()
	if err := <-gone; err == nil {
		t.Fatal("a cancelled waiter returned no error")
	}
	close(release)
	if d := <-leaderDone; d == nil || d.Spent != 7 {
		t.Fatalf("the next read's leader got %+v", d)
	}
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
