package llm

import (
	"cmp"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RateLimitField names one value of a RateLimit, so that an absent header is
// told from a zero one.
type RateLimitField uint16

const (
	HasLimitRequests RateLimitField = 1 << iota
	HasLimitTokens
	HasRemainingRequests
	HasRemainingTokens
	HasResetRequests
	HasResetTokens
	HasRetryAfter
	HasUtilization
	HasLimitInputTokens
	HasRemainingInputTokens
	HasResetInputTokens
	HasLimitOutputTokens
	HasRemainingOutputTokens
	HasResetOutputTokens
)

// RateLimit is what a provider's response headers say about its rate-limit
// buckets. A value is 0 unless its bit is set in Has.
type RateLimit struct {
	LimitRequests     int64
	LimitTokens       int64
	RemainingRequests int64
	RemainingTokens   int64
	ResetRequests     time.Duration // until the bucket has refilled
	ResetTokens       time.Duration
	RetryAfter        time.Duration
	Utilization       float64 // a provisioned Azure deployment's capacity in use, in percent
	// Input and output tokens counted apart (Anthropic's
	// anthropic-ratelimit-input-tokens-* and -output-tokens-*).
	LimitInputTokens, RemainingInputTokens   int64
	LimitOutputTokens, RemainingOutputTokens int64
	ResetInputTokens, ResetOutputTokens      time.Duration
	Has                                      RateLimitField
}

// Known reports whether the headers gave field f.
func (r RateLimit) Known(f RateLimitField) bool { return r.Has&f != 0 }

// Delay is how long the headers ask a client to wait before the next request:
// RetryAfter when given, else the longest reset (the exhausted bucket's is
// one of them).
func (r RateLimit) Delay() (d time.Duration, ok bool) {
	if r.Known(HasRetryAfter) {
		return r.RetryAfter, r.RetryAfter > 0
	}
	d = max(r.ResetRequests, r.ResetTokens, r.ResetInputTokens, r.ResetOutputTokens)
	return d, d > 0
}

// maxHint bounds the waits believed: beyond a week is something else (a Unix
// timestamp) in a duration header.
const maxHint = 7 * 24 * time.Hour

// ParseRateLimit reads a provider's rate-limit headers (OpenAI's, Azure's,
// Anthropic's where OpenAI's give no value, a 429's retry-after in any form)
// into one RateLimit. Nonsense (limits that are not positive, remaining
// counts beside a nonsense limit or above it, zero waits, waits beyond a
// week) is treated as absent.
func ParseRateLimit(h http.Header) RateLimit {
	return parseRateLimit(h, time.Now())
}

func parseRateLimit(h http.Header, now time.Time) RateLimit {
	var r RateLimit
	if len(h) == 0 {
		return r
	}
	family := func(kind string, limit, remaining *int64, reset *time.Duration, hasLimit, hasRemaining, hasReset RateLimitField) {
		limitRaw := cmp.Or(h.Get("x-ratelimit-limit-"+kind), h.Get("anthropic-ratelimit-"+kind+"-limit"))
		limitOK := false
		if v, ok := parseInt(limitRaw); ok && v > 0 {
			*limit, limitOK = v, true
			r.Has |= hasLimit
		}
		// Azure's "limit: -1, remaining: 0" and bare "remaining: 0" are not
		// "exhausted".
		if limitOK || limitRaw == "" {
			rem, ok := parseInt(h.Get("x-ratelimit-remaining-" + kind))
			if !ok {
				if rem, ok = parseInt(h.Get("anthropic-ratelimit-" + kind + "-remaining")); ok && kind != "requests" {
					rem = max(rem-500, 0) // rounded to the thousand
				}
			}
			if ok && rem >= 0 && (limitOK && rem <= *limit || !limitOK && rem > 0) {
				*remaining = rem
				r.Has |= hasRemaining
			}
		}
		if d, ok := parseDuration(h.Get("x-ratelimit-reset-" + kind)); ok {
			*reset = d
			r.Has |= hasReset
		} else if t, err := time.Parse(time.RFC3339, strings.TrimSpace(h.Get("anthropic-ratelimit-"+kind+"-reset"))); err == nil {
			if d := t.Sub(now); d >= 0 && d <= maxHint {
				*reset = d
				r.Has |= hasReset
			}
		}
	}
	family("requests", &r.LimitRequests, &r.RemainingRequests, &r.ResetRequests, HasLimitRequests, HasRemainingRequests, HasResetRequests)
	family("tokens", &r.LimitTokens, &r.RemainingTokens, &r.ResetTokens, HasLimitTokens, HasRemainingTokens, HasResetTokens)
	family("input-tokens", &r.LimitInputTokens, &r.RemainingInputTokens, &r.ResetInputTokens,
		HasLimitInputTokens, HasRemainingInputTokens, HasResetInputTokens)
	family("output-tokens", &r.LimitOutputTokens, &r.RemainingOutputTokens, &r.ResetOutputTokens,
		HasLimitOutputTokens, HasRemainingOutputTokens, HasResetOutputTokens)

	if u, ok := parseFloat(strings.TrimSuffix(strings.TrimSpace(h.Get("azure-openai-deployment-utilization")), "%")); ok && u >= 0 && u <= 1000 {
		r.Utilization = u
		r.Has |= HasUtilization
	}

	for _, name := range []string{"retry-after-ms", "x-ms-retry-after-ms"} {
		if ms, ok := parseFloat(h.Get(name)); ok && ms > 0 {
			if d := time.Duration(math.Ceil(ms * float64(time.Millisecond))); d <= maxHint {
				r.RetryAfter = d
				r.Has |= HasRetryAfter
				return r
			}
		}
	}
	if v := strings.TrimSpace(h.Get("retry-after")); v != "" {
		var d time.Duration
		if s, ok := parseFloat(v); ok {
			d = time.Duration(math.Ceil(s * float64(time.Second)))
		} else if t, err := http.ParseTime(v); err == nil {
			d = t.Sub(now)
		}
		if d > 0 && d <= maxHint {
			r.RetryAfter = d
			r.Has |= HasRetryAfter
		}
	}
	return r
}

func parseInt(s string) (int64, bool) {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return v, err == nil
}

func parseFloat(s string) (float64, bool) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	return v, err == nil && !math.IsNaN(v) && !math.IsInf(v, 0)
}

// parseDuration reads a reset header: a Go duration or plain seconds. Zero is
// a real value (the bucket is full).
func parseDuration(s string) (time.Duration, bool) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if f, ok := parseFloat(s); ok {
		if f < 0 || f*float64(time.Second) > float64(maxHint) {
			return 0, false
		}
		d, err = time.Duration(math.Ceil(f*float64(time.Second))), nil
	}
	return d, err == nil && d >= 0 && d <= maxHint
}
