package sim

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Outcome is what the simulator did with a request that reached it.
type Outcome string

// The outcomes of a request.
const (
	// Admitted: the request fitted the buckets, was charged, and answered 200.
	Admitted Outcome = "admitted"
	// RateLimited: the buckets could not hold it; 429, nothing charged.
	RateLimited Outcome = "rate_limited"
	// Spurious429: a configured fault; 429 although under the limits, nothing
	// charged.
	Spurious429 Outcome = "spurious_429"
	// Error500: a configured fault; 500, nothing charged.
	Error500 Outcome = "error_500"
	// Overloaded: a configured fault; 529 (503 on OpenAI's paths), the
	// platform busy, nothing charged.
	Overloaded Outcome = "overloaded"
	// Hung: a configured fault; no answer until the client gave up (or
	// HangFor passed, then 504), nothing charged.
	Hung Outcome = "hung"
)

// Admission is one entry of the admission log: a valid request that reached
// the rate limiter, whatever became of it.
type Admission struct {
	// Seq numbers requests in arrival order, from 1.
	Seq   int64     `json:"seq"`
	Time  time.Time `json:"time"`
	Model string    `json:"model"`
	// Requests is 1: the request counted against the request buckets if it
	// was admitted.
	Requests int64 `json:"requests"`
	// Tokens is what the request asked of the token buckets: prompt tokens
	// plus max_tokens for every choice (of an Anthropic call, its input but
	// cache reads, plus max_tokens). Charged only when admitted.
	Tokens int64 `json:"tokens"`
	// InputTokens and OutputTokens are what an Anthropic call asked of the
	// ITPM and OTPM buckets: its uncached input and cache writes, and
	// max_tokens; 0 for OpenAI's calls.
	InputTokens  int64 `json:"input_tokens,omitempty"`
	OutputTokens int64 `json:"output_tokens,omitempty"`
	// OutputReturned is what an Anthropic call gave back to the OTPM
	// bucket when it ended: max_tokens less its output.
	OutputReturned int64   `json:"output_returned,omitempty"`
	Outcome        Outcome `json:"outcome"`
	// RetryAfter is the wait a 429 announced (retry-after-ms); 0 otherwise,
	// or when the request can never fit.
	RetryAfter time.Duration `json:"retry_after_ns"`
	// Refunded is the unused part of max_tokens returned to the token
	// buckets when the call completed, at RefundedAt.
	Refunded   int64     `json:"refunded"`
	RefundedAt time.Time `json:"refunded_at,omitzero"`
}

// Stats counts what the simulator did since it started (or was reset).
type Stats struct {
	// Requests is every valid request to chat completions, the Responses
	// API and embeddings that reached the limiter.
	Requests int64 `json:"requests"`
	// Responses is the part of Requests that went to the Responses API.
	Responses int64 `json:"responses"`
	// Messages is the part of Requests that went to Anthropic's Messages
	// API.
	Messages    int64 `json:"messages"`
	Admitted    int64 `json:"admitted"`
	RateLimited int64 `json:"rate_limited"`
	// RateLimitedShort is the part of RateLimited that the minute's
	// buckets admitted and the short window or the ramp refused.
	RateLimitedShort int64 `json:"rate_limited_short"`
	Spurious429      int64 `json:"spurious_429"`
	Errors500        int64 `json:"errors_500"`
	Overloaded       int64 `json:"overloaded"`
	Hung             int64 `json:"hung"`
	// BadRequests were refused with 400 (invalid body) or 404 (unknown model).
	BadRequests int64 `json:"bad_requests"`
	// Unauthorized were refused with 401 (missing or wrong API key).
	Unauthorized int64 `json:"unauthorized"`
	// TokensAdmitted is what admitted requests were charged at admission;
	// TokensRefunded what came back when they completed.
	TokensAdmitted   int64 `json:"tokens_admitted"`
	TokensRefunded   int64 `json:"tokens_refunded"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	// ExternalRequests and ExternalTokens are what the external application
	// (Config.External) was admitted; they are in no other counter.
	ExternalRequests int64 `json:"external_requests"`
	ExternalTokens   int64 `json:"external_tokens"`
	// InFlight is requests being answered now.
	InFlight int64 `json:"in_flight"`
	// LogDropped is admission log entries overwritten because the log was
	// full; BillsDropped the same of the bill log (Server.Bills).
	LogDropped   int64 `json:"log_dropped"`
	BillsDropped int64 `json:"bills_dropped"`
}

// ring keeps the most recent entries of a log, numbered from 1 in the order
// added: the admission log and the bill log, bounded alike by
// Config.LogSize.
type ring[T any] struct {
	size    int
	entries []T
	next    int64 // number of the next entry
	first   int64 // number of the oldest entry kept
	dropped int64
}

func newRing[T any](size int) *ring[T] {
	return &ring[T]{size: size, entries: make([]T, 0, min(size, 4096)), next: 1, first: 1}
}

// add appends e and returns its number.
func (l *ring[T]) add(e T) int64 {
	seq := l.next
	l.next++
	if len(l.entries) < l.size {
		l.entries = append(l.entries, e)
		return seq
	}
	l.entries[(seq-1)%int64(l.size)] = e
	l.first++
	l.dropped++
	return seq
}

// get returns the entry seq if it is still kept.
func (l *ring[T]) get(seq int64) *T {
	if seq < l.first || seq >= l.next {
		return nil
	}
	return &l.entries[(seq-1)%int64(l.size)]
}

// since returns a copy of the entries numbered after after, oldest first.
func (l *ring[T]) since(after int64) []T {
	start := max(after+1, l.first)
	if start >= l.next {
		return nil
	}
	out := make([]T, 0, l.next-start)
	for seq := start; seq < l.next; seq++ {
		out = append(out, l.entries[(seq-1)%int64(l.size)])
	}
	return out
}

// WindowMax is the most that any window of one length held.
type WindowMax struct {
	Requests int64 `json:"requests"`
	Tokens   int64 `json:"tokens"`
}

// MaxInWindow returns the most requests, and the most tokens net of refunds,
// that the Admitted entries of log put into any window of length w (windows
// are [s, s+w)). A token bucket of capacity C refilled at rate r can never
// let more than C + r·w through any window of length w, refunds included, so
// tests check the result against Limits.MaxAdmissible. Pass the entries of one
// model when buckets are per model.
func MaxInWindow(log []Admission, w time.Duration) WindowMax {
	type event struct {
		t time.Time
		n int64
	}
	var reqs, toks []event
	for _, a := range log {
		if a.Outcome != Admitted {
			continue
		}
		reqs = append(reqs, event{a.Time, a.Requests})
		toks = append(toks, event{a.Time, a.Tokens})
		if a.Refunded != 0 {
			toks = append(toks, event{a.RefundedAt, -a.Refunded})
		}
	}
	maxSum := func(ev []event) int64 {
		if len(ev) == 0 {
			return 0
		}
		sort.SliceStable(ev, func(i, j int) bool { return ev[i].t.Before(ev[j].t) })
		prefix := make([]int64, len(ev)+1)
		for i, e := range ev {
			prefix[i+1] = prefix[i] + e.n
		}
		// The sum over [s, s+w) is constant between breakpoints and is
		// reached with s at an event's time or at an event's time minus w.
		starts := make([]time.Time, 0, 2*len(ev))
		for _, e := range ev {
			starts = append(starts, e.t, e.t.Add(-w))
		}
		best := int64(math.MinInt64)
		for _, s := range starts {
			lo := sort.Search(len(ev), func(i int) bool { return !ev[i].t.Before(s) })
			end := s.Add(w)
			hi := sort.Search(len(ev), func(i int) bool { return !ev[i].t.Before(end) })
			best = max(best, prefix[hi]-prefix[lo])
		}
		return best
	}
	return WindowMax{Requests: maxSum(reqs), Tokens: maxSum(toks)}
}

// OfModel returns the entries of log for model.
func OfModel(log []Admission, model string) []Admission {
	return slices.DeleteFunc(slices.Clone(log), func(a Admission) bool { return a.Model != model })
}

// MaxAdmissible is the most the buckets of l can let through any window of
// length w: for each limit, its capacity plus what it regains in w; the
// smallest over the limits that are set. math.MaxInt64 where nothing limits.
func (l Limits) MaxAdmissible(w time.Duration) WindowMax {
	bound := func(perMin, perDay int64) int64 {
		b := int64(math.MaxInt64)
		for _, lim := range []struct {
			n      int64
			period time.Duration
		}{{perMin, time.Minute}, {perDay, 24 * time.Hour}} {
			if lim.n > 0 {
				b = min(b, lim.n+int64(math.Ceil(float64(lim.n)*float64(w)/float64(lim.period))))
			}
		}
		return b
	}
	return WindowMax{Requests: bound(l.RPM, l.RPD), Tokens: bound(l.TPM, l.TPD)}
}

// EarlyArrivals returns the entries of log that arrived, for their model's
// buckets, before the end of a wait announced by an earlier 429 (its Time plus
// RetryAfter). A client that honours retry-after sends none, except requests
// already on their way when the 429 was sent. Pass shared=true when the
// simulator's buckets are shared by all models.
func EarlyArrivals(log []Admission, shared bool) []Admission {
	until := map[string]time.Time{}
	var early []Admission
	for _, a := range log {
		key := a.Model
		if shared {
			key = ""
		}
		if a.Time.Before(until[key]) {
			early = append(early, a)
		}
		if (a.Outcome == RateLimited || a.Outcome == Spurious429) && a.RetryAfter > 0 {
			if end := a.Time.Add(a.RetryAfter); end.After(until[key]) {
				until[key] = end
			}
		}
	}
	return early
}
