package main

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/llm/sim"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs every scenario for a few seconds with few callers: worker
// processes, producers, baselines, the timelines and the table.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	args := []string{"-duration", "4s", "-warmup", "2s", "-interval", "2s", "-processes", "2", "-concurrency", "3"}
	if err := run(t.Context(), args, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"llmq, policy = provider limits", "llmq, policy = 2x provider limits",
		"baseline: retry after retry-after", "baseline: a local token bucket", "steady state: TPM used", "llmq bucket - provider's"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-duration", "0"}, {"-warmup", "5m"}, {"-processes", "0"},
		{"-tpm", "100"}, {"-interval", "500ms"}, {"-scenarios", "llmq,nope"}, {"extra"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

// TestReplayTPM checks the replay against a bucket worked by hand: 60,000
// TPM (1,000 tokens/s), full at start, all of it taken at 1s, half of it
// refunded at 2s.
func TestReplayTPM(t *testing.T) {
	start := time.Unix(1000, 0)
	log := []sim.Admission{{Time: start.Add(time.Second), Tokens: 60_000, Outcome: sim.Admitted,
		Refunded: 30_000, RefundedAt: start.Add(2 * time.Second)},
		{Time: start.Add(1500 * time.Millisecond), Tokens: 99_999, Outcome: sim.RateLimited}}
	bins := replayTPM(log, 60_000, start, []time.Duration{0, time.Second, 3 * time.Second})
	if len(bins) != 2 {
		t.Fatalf("got %d bins, want 2", len(bins))
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// Full for the first second: its whole refill is lost.
	near("bin 0 lost", bins[0].lost, 1000)
	near("bin 0 mean level", bins[0].levelSeconds, 60_000)
	if bins[0].full != time.Second {
		t.Errorf("bin 0 full for %v, want 1s", bins[0].full)
	}
	// Empty at 1s, 1,000 at 2s, 31,000 after the refund, 32,000 at 3s.
	near("bin 1 lost", bins[1].lost, 0)
	near("bin 1 level·s", bins[1].levelSeconds, 500+31_500)

	levels := tpmLevels(log, 60_000, start, []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 2500 * time.Millisecond})
	for i, want := range []float64{60_000, 500, 31_500} {
		near("level", levels[i], want)
	}
}

// TestBetween checks a window's figures from the counters at its edges.
func TestBetween(t *testing.T) {
	r := &result{
		samples: []sample{
			{at: 0, st: sim.Stats{}},
			{at: time.Minute, st: sim.Stats{Requests: 100, Admitted: 90, RateLimited: 10, TokensAdmitted: 200_000, TokensRefunded: 20_000}},
			{at: 2 * time.Minute, st: sim.Stats{Requests: 300, Admitted: 240, RateLimited: 60, TokensAdmitted: 400_000, TokensRefunded: 70_000}},
		},
		completions: []time.Duration{time.Second, 61 * time.Second, 90 * time.Second},
	}
	w := r.between(time.Minute+100*time.Millisecond, 2*time.Minute)
	if w.from != time.Minute || w.used != 150_000 || w.calls != 200 || w.limited != 50 || w.completions != 2 {
		t.Fatalf("window = %+v", w)
	}
	if got := w.usedShare(150_000); math.Abs(got-1) > 1e-9 {
		t.Errorf("usedShare = %v, want 1", got)
	}
	if got := w.limitedShare(); got != 0.25 {
		t.Errorf("limitedShare = %v, want 0.25", got)
	}
}

// TestLocalBucket checks the baseline's bucket: full at start, a cost it
// does not hold makes the caller wait, refunds never overfill it.
func TestLocalBucket(t *testing.T) {
	b := newLocalBucket(60, 600)
	if !b.take(t.Context(), 600) {
		t.Fatal("a full bucket refused its capacity")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if b.take(ctx, 600) {
		t.Fatal("an empty bucket admitted its capacity at once")
	}
	b.give(1, 10_000)
	if b.tok > 600 || b.req > 60 {
		t.Fatalf("refund overfilled the bucket: %v tokens, %v requests", b.tok, b.req)
	}
}

func TestMixIsDeterministic(t *testing.T) {
	a, b := newMix(7), newMix(7)
	for i := range 20 {
		ra, err := a.request(i)
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := b.request(i)
		if !bytes.Equal(ra.body, rb.body) || ra.cost != rb.cost {
			t.Fatalf("request %d differs between two mixes of one seed", i)
		}
		if ra.cost > maxRequestTokens || ra.maxTokens < maxTokensMin || ra.maxTokens > maxTokensMax {
			t.Fatalf("request %d out of the mix's bounds: %+v", i, ra)
		}
	}
}
