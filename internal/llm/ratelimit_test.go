package llm

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		headers map[string]string
		want    RateLimit
	}{
		{"none", nil, RateLimit{}},
		{"openai success", map[string]string{
			"x-ratelimit-limit-requests":     "500",
			"x-ratelimit-limit-tokens":       "300000",
			"x-ratelimit-remaining-requests": "499",
			"x-ratelimit-remaining-tokens":   "299000",
			"x-ratelimit-reset-requests":     "120ms",
			"x-ratelimit-reset-tokens":       "6m0s",
		}, RateLimit{
			LimitRequests: 500, LimitTokens: 300000, RemainingRequests: 499, RemainingTokens: 299000,
			ResetRequests: 120 * time.Millisecond, ResetTokens: 6 * time.Minute,
			Has: HasLimitRequests | HasLimitTokens | HasRemainingRequests | HasRemainingTokens | HasResetRequests | HasResetTokens,
		}},
		{"reset 1s and compound", map[string]string{
			"x-ratelimit-reset-requests": "1s",
			"x-ratelimit-reset-tokens":   "1m30.5s",
		}, RateLimit{ResetRequests: time.Second, ResetTokens: 90*time.Second + 500*time.Millisecond, Has: HasResetRequests | HasResetTokens}},
		{"reset plain seconds", map[string]string{
			"x-ratelimit-reset-requests": "1.5",
			"x-ratelimit-reset-tokens":   "0",
		}, RateLimit{ResetRequests: 1500 * time.Millisecond, ResetTokens: 0, Has: HasResetRequests | HasResetTokens}},
		{"retry-after-ms preferred", map[string]string{
			"retry-after-ms": "1500",
			"retry-after":    "2",
		}, RateLimit{RetryAfter: 1500 * time.Millisecond, Has: HasRetryAfter}},
		{"retry-after-ms fractional rounds up", map[string]string{
			"retry-after-ms": "12.3",
		}, RateLimit{RetryAfter: 12300 * time.Microsecond, Has: HasRetryAfter}},
		{"retry-after seconds", map[string]string{
			"retry-after": "20",
		}, RateLimit{RetryAfter: 20 * time.Second, Has: HasRetryAfter}},
		{"retry-after HTTP date", map[string]string{
			"retry-after": now.Add(90 * time.Second).Format(http.TimeFormat),
		}, RateLimit{RetryAfter: 90 * time.Second, Has: HasRetryAfter}},
		{"retry-after date in the past", map[string]string{
			"retry-after": now.Add(-time.Minute).Format(http.TimeFormat),
		}, RateLimit{}},
		{"retry-after-ms nonsense falls back to retry-after", map[string]string{
			"retry-after-ms": "soon",
			"retry-after":    "3",
		}, RateLimit{RetryAfter: 3 * time.Second, Has: HasRetryAfter}},
		{"retry-after zero is no hint", map[string]string{
			"retry-after-ms": "0",
			"retry-after":    "0",
		}, RateLimit{}},
		{"azure -1 everywhere", map[string]string{
			"x-ratelimit-limit-requests":     "-1",
			"x-ratelimit-limit-tokens":       "-1",
			"x-ratelimit-remaining-requests": "-1",
			"x-ratelimit-remaining-tokens":   "-1",
			"x-ratelimit-reset-requests":     "-1",
			"x-ratelimit-reset-tokens":       "-1",
			"retry-after":                    "-1",
		}, RateLimit{}},
		{"azure zero limits make remaining zero meaningless", map[string]string{
			"x-ratelimit-limit-requests":     "0",
			"x-ratelimit-limit-tokens":       "0",
			"x-ratelimit-remaining-requests": "0",
			"x-ratelimit-remaining-tokens":   "0",
		}, RateLimit{}},
		{"azure remaining counts only", map[string]string{
			"x-ratelimit-remaining-requests": "119",
			"x-ratelimit-remaining-tokens":   "19000",
		}, RateLimit{RemainingRequests: 119, RemainingTokens: 19000, Has: HasRemainingRequests | HasRemainingTokens}},
		{"azure bare zero means nothing", map[string]string{
			"x-ratelimit-remaining-requests": "0",
			"x-ratelimit-remaining-tokens":   "-1",
		}, RateLimit{}},
		{"azure x-ms-retry-after-ms", map[string]string{
			"x-ms-retry-after-ms": "250",
			"retry-after":         "1",
		}, RateLimit{RetryAfter: 250 * time.Millisecond, Has: HasRetryAfter}},
		{"azure provisioned utilization", map[string]string{
			"azure-openai-deployment-utilization": "87.5%",
			"x-ratelimit-remaining-requests":      "40",
		}, RateLimit{Utilization: 87.5, RemainingRequests: 40, Has: HasUtilization | HasRemainingRequests}},
		{"azure utilization nonsense", map[string]string{
			"azure-openai-deployment-utilization": "-1%",
		}, RateLimit{}},
		{"anthropic", map[string]string{
			"anthropic-ratelimit-requests-limit":     "50",
			"anthropic-ratelimit-requests-remaining": "49",
			"anthropic-ratelimit-requests-reset":     now.Add(2 * time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-tokens-limit":       "40000",
			"anthropic-ratelimit-tokens-remaining":   "39000",
			"anthropic-ratelimit-tokens-reset":       now.Add(90 * time.Second).Format(time.RFC3339),
			"retry-after":                            "3",
		}, RateLimit{LimitRequests: 50, RemainingRequests: 49, ResetRequests: 2 * time.Second,
			LimitTokens: 40000, RemainingTokens: 38500, ResetTokens: 90 * time.Second, RetryAfter: 3 * time.Second,
			Has: HasLimitRequests | HasRemainingRequests | HasResetRequests | HasLimitTokens | HasRemainingTokens | HasResetTokens | HasRetryAfter}},
		{"anthropic input and output tokens", map[string]string{
			"anthropic-ratelimit-input-tokens-limit":      "400000",
			"anthropic-ratelimit-input-tokens-remaining":  "399000",
			"anthropic-ratelimit-input-tokens-reset":      now.Add(time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-output-tokens-limit":     "80000",
			"anthropic-ratelimit-output-tokens-remaining": "0",
			"anthropic-ratelimit-output-tokens-reset":     now.Add(30 * time.Second).Format(time.RFC3339),
		}, RateLimit{LimitInputTokens: 400000, RemainingInputTokens: 398500, ResetInputTokens: time.Second,
			LimitOutputTokens: 80000, RemainingOutputTokens: 0, ResetOutputTokens: 30 * time.Second,
			Has: HasLimitInputTokens | HasRemainingInputTokens | HasResetInputTokens | HasLimitOutputTokens | HasRemainingOutputTokens | HasResetOutputTokens}},
		{"anthropic reset in the past or unreadable", map[string]string{
			"anthropic-ratelimit-requests-reset": now.Add(-time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-tokens-reset":   "tomorrow",
		}, RateLimit{}},
		{"remaining zero under a real limit is exhausted", map[string]string{
			"x-ratelimit-limit-tokens":     "1000",
			"x-ratelimit-remaining-tokens": "0",
		}, RateLimit{LimitTokens: 1000, RemainingTokens: 0, Has: HasLimitTokens | HasRemainingTokens}},
		{"remaining above limit is nonsense", map[string]string{
			"x-ratelimit-limit-requests":     "10",
			"x-ratelimit-remaining-requests": "11",
		}, RateLimit{LimitRequests: 10, Has: HasLimitRequests}},
		{"unparsable", map[string]string{
			"x-ratelimit-limit-requests": "lots",
			"x-ratelimit-reset-tokens":   "6 minutes",
			"retry-after":                "later",
		}, RateLimit{}},
		{"absurd waits", map[string]string{
			"x-ratelimit-reset-tokens": "1717243200", // a Unix timestamp
			"retry-after-ms":           "999999999999",
		}, RateLimit{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for k, v := range c.headers {
				h.Set(k, v)
			}
			if got := parseRateLimit(h, now); got != c.want {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestRateLimitDelay(t *testing.T) {
	t.Parallel()
	cases := []struct {
		rl     RateLimit
		want   time.Duration
		wantOK bool
	}{
		{RateLimit{}, 0, false},
		{RateLimit{RetryAfter: 2 * time.Second, ResetTokens: time.Minute, Has: HasRetryAfter | HasResetTokens}, 2 * time.Second, true},
		{RateLimit{ResetRequests: time.Second, ResetTokens: 3 * time.Second, Has: HasResetRequests | HasResetTokens}, 3 * time.Second, true},
		{RateLimit{ResetTokens: 0, Has: HasResetTokens}, 0, false},
	}
	for i, c := range cases {
		got, ok := c.rl.Delay()
		if got != c.want || ok != c.wantOK {
			t.Errorf("case %d: Delay() = %v, %v; want %v, %v", i, got, ok, c.want, c.wantOK)
		}
	}
}
