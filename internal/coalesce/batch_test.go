package coalesce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// Inputs that come while a call is under way go together in the next call,
// in the order they came, and each caller gets its own input's result and
// error.
func TestBatchGathersTheInputsQueuedMeanwhile(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var mu sync.Mutex
	var calls [][]int
	b := &Batch[string, int, string]{Fn: func(_ context.Context, key string, ps []int) ([]string, []error) {
		mu.Lock()
		calls = append(calls, append([]int(nil), ps...))
		first := len(calls) == 1
		mu.Unlock()
		if first {
			<-release
		}
		res, errs := make([]string, len(ps)), make([]error, len(ps))
		for i, p := range ps {
			res[i] = fmt.Sprintf("%s:%d", key, p)
			if p%3 == 0 {
				errs[i] = fmt.Errorf("refused %d", p)
			}
		}
		return res, errs
	}}
	ctx := t.Context()
	type answer struct {
		res string
		err error
	}
	answers := make([]chan answer, 12)
	for i := range answers {
		answers[i] = make(chan answer, 1)
	}
	ask := func(i int) {
		r, err := b.Do(ctx, "k", i)
		answers[i] <- answer{r, err}
	}
	go ask(0)
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 1 })
	for i := 1; i < len(answers); i++ {
		go ask(i)
		waitFor(t, func() bool { return b.Queued("k") == i })
	}
	close(release)
	for i, c := range answers {
		a := <-c
		if a.res != fmt.Sprintf("k:%d", i) || (a.err != nil) != (i%3 == 0) {
			t.Errorf("caller %d got %q, %v", i, a.res, a.err)
		}
	}
	if len(calls) != 2 || len(calls[1]) != len(answers)-1 || calls[1][0] != 1 || calls[1][10] != 11 {
		t.Fatalf("calls %v, want [0] then 1..11 in order", calls)
	}
	if b.Calls() != 2 {
		t.Fatalf("Calls() = %d", b.Calls())
	}
}

// Max bounds a call's inputs: the rest go in the calls after it; keys are
// batched apart; a lone caller's call is made at once.
func TestBatchMaxAndKeys(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var mu sync.Mutex
	sizes := map[string][]int{}
	b := &Batch[string, int, int]{Max: 4, Fn: func(_ context.Context, key string, ps []int) ([]int, []error) {
		mu.Lock()
		sizes[key] = append(sizes[key], len(ps))
		first := key == "a" && len(sizes[key]) == 1
		mu.Unlock()
		if first {
			<-release
		}
		return ps, nil
	}}
	ctx := t.Context()
	var wg sync.WaitGroup
	wg.Go(func() {
		if r, err := b.Do(ctx, "a", 0); r != 0 || err != nil {
			t.Errorf("a 0: %d, %v", r, err)
		}
	})
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes["a"]) == 1 })
	for i := 1; i <= 9; i++ {
		wg.Go(func() {
			if r, err := b.Do(ctx, "a", i); r != i || err != nil {
				t.Errorf("a %d: %d, %v", i, r, err)
			}
		})
	}
	waitFor(t, func() bool { return b.Queued("a") == 9 })
	// Another key is not held up by a's call.
	if r, err := b.Do(ctx, "b", 7); r != 7 || err != nil {
		t.Fatalf("b: %d, %v", r, err)
	}
	close(release)
	wg.Wait()
	if got := fmt.Sprint(sizes["a"]); got != "[1 4 4 1]" {
		t.Fatalf("a's calls took %s inputs, want [1 4 4 1]", got)
	}
}

// A caller's cancellation does not cut the shared call short, and every
// input's error is its own.
func TestBatchCallIsNotCancelledWithItsLeader(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	b := &Batch[int, int, int]{Fn: func(ctx context.Context, _ int, ps []int) ([]int, []error) {
		if ctx.Err() != nil {
			return nil, []error{ctx.Err()}
		}
		return []int{ps[0] * 2}, []error{errors.New("own")}
	}}
	r, err := b.Do(ctx, 1, 21)
	if r != 42 || err == nil || err.Error() != "own" {
		t.Fatalf("got %d, %v", r, err)
	}
}
