package pacer

import (
	"slices"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
)

// What a 429 teaches depends on what the provider's counts showed: no room
// in a bucket (its rate), room everywhere (a shorter window), nothing (either);
// a wait far longer than the call's refill shows a window that frees in a
// block.
func TestEvidenceOfA429(t *testing.T) {
	t.Parallel()
	c := &Call{Scope: limiter.ModelScope("m", map[string]int64{"rpm": 600, "tpm": 60_000}, 500*time.Millisecond), Cost: limiter.Cost{Requests: 1, Tokens: 500}}
	counts := func(req, tok int64) llm.RateLimit {
		return llm.RateLimit{RemainingRequests: req, RemainingTokens: tok, Has: llm.HasRemainingRequests | llm.HasRemainingTokens}
	}
	for _, tc := range []struct {
		name        string
		typ         string
		rl          llm.RateLimit
		rate, short []string
	}{
		{"no counts", "", llm.RateLimit{}, []string{"rpm", "tpm"}, []string{"rpm", "tpm"}},
		{"tokens exhausted", "", counts(100, 20), []string{"tpm"}, nil},
		{"room everywhere", "", counts(100, 20_000), nil, []string{"rpm", "tpm"}},
		{"room everywhere, tokens named", "tokens", counts(100, 20_000), nil, []string{"tpm"}},
		{"no counts, requests named", "requests", llm.RateLimit{}, []string{"rpm"}, []string{"rpm"}},
		{"provisioned, over capacity", "", llm.RateLimit{Utilization: 104, Has: llm.HasUtilization}, []string{"tpm"}, nil},
		{"provisioned, room", "", llm.RateLimit{Utilization: 40, Has: llm.HasUtilization}, nil, []string{"rpm", "tpm"}},
	} {
		rate, short := evidence(c, &llm.Error{Type: tc.typ}, tc.rl)
		if !slices.Equal(rate, tc.rate) || !slices.Equal(short, tc.short) {
			t.Errorf("%s: rate %v short %v, want %v and %v", tc.name, rate, short, tc.rate, tc.short)
		}
	}

	// 500 tokens refill in 500 ms at 60,000 a minute; one request in 100 ms.
	wait := func(d time.Duration) llm.RateLimit { return llm.RateLimit{RetryAfter: d, Has: llm.HasRetryAfter} }
	both := []string{"rpm", "tpm"}
	for _, tc := range []struct {
		rl   llm.RateLimit
		want []string
	}{
		{wait(350 * time.Millisecond), []string{"rpm"}},
		{wait(1500 * time.Millisecond), both},
		{wait(time.Second), nil},                        // whole seconds: rounded up, told apart from a second on
		{wait(3 * time.Second), []string{"rpm", "tpm"}}, // beyond the rounding
		{llm.RateLimit{}, nil},
	} {
		if got := blockWindows(c, tc.rl, both); !slices.Equal(got, tc.want) {
			t.Errorf("wait %v: %v, want %v", tc.rl.RetryAfter, got, tc.want)
		}
	}
}

// The provider's counts feed the bucket of the dimension they describe:
// requests to rpm, tokens to tpm, Anthropic's input and output tokens to
// itpm and otpm; a 429 whose counts show no room in otpm is otpm's rate.
func TestCountsOfEachDimension(t *testing.T) {
	t.Parallel()
	s := limiter.ModelScope("a", map[string]int64{"rpm": 50, "itpm": 40_000, "otpm": 8_000}, 500*time.Millisecond)
	rl := llm.RateLimit{RemainingRequests: 49, LimitRequests: 50, RemainingInputTokens: 39_000, LimitInputTokens: 40_000,
		RemainingOutputTokens: 100, LimitOutputTokens: 8_000,
		Has: llm.HasRemainingRequests | llm.HasLimitRequests | llm.HasRemainingInputTokens | llm.HasLimitInputTokens |
			llm.HasRemainingOutputTokens | llm.HasLimitOutputTokens}
	want := []limiter.Observed{{Bucket: "rpm", Remaining: 49, Limit: 50}, {Bucket: "itpm", Remaining: 39_000, Limit: 40_000},
		{Bucket: "otpm", Remaining: 100, Limit: 8_000}}
	if got := observed(s, rl); !slices.Equal(got, want) {
		t.Fatalf("observed %+v, want %+v", got, want)
	}
	c := &Call{Scope: s, Cost: limiter.Cost{Requests: 1, Tokens: 1_500, Input: 1_000, Output: 500}}
	rate, short := evidence(c, &llm.Error{Class: llm.ClassRateLimited}, rl)
	if !slices.Equal(rate, []string{"otpm"}) || len(short) != 0 {
		t.Fatalf("evidence rate %v short %v, want otpm's rate", rate, short)
	}
}

// The fair queue counts a job's tokens all told: an input or output bucket's
// room counts over the share its kind took of the permits, and as all of
// them before anything was taken.
func TestTokenShares(t *testing.T) {
	t.Parallel()
	got := tokenShares([]limiter.BucketState{{Name: "itpm", Unit: limiter.UnitInputTokens, Taken: 3_000},
		{Name: "otpm", Unit: limiter.UnitOutputTokens, Taken: 1_000}})
	if got[limiter.UnitInputTokens] != 0.75 || got[limiter.UnitOutputTokens] != 0.25 || got[limiter.UnitTokens] != 1 {
		t.Fatalf("shares %v", got)
	}
	got = tokenShares([]limiter.BucketState{{Name: "itpm", Unit: limiter.UnitInputTokens}})
	if got[limiter.UnitInputTokens] != 1 {
		t.Fatalf("shares before anything was taken %v", got)
	}
}
