package sim

import (
	"fmt"
	"math"
	"time"
)

// The values of ShortWindow.Kind: how a provider counts its limits over a
// window shorter than the minute it quotes.
const (
	// WindowBucket is a token bucket holding one window's share of the
	// limit, refilled continuously: OpenAI's "quantized" limits (60,000
	// requests a minute enforced as 1,000 a second) and Anthropic's
	// shorter intervals.
	WindowBucket = "bucket"
	// WindowFixed is a count reset at every multiple of the window on the
	// provider's clock: Azure OpenAI's 1 s or 10 s intervals.
	WindowFixed = "fixed"
	// WindowSliding is the exact count of the last window.
	WindowSliding = "sliding"
)

// ShortWindow makes the provider enforce its per-minute limits over a
// shorter window as well: within any window (as its Kind counts it) it
// admits at most the limit's share of the window, RPM × Period / 1 min
// requests and TPM × Period / 1 min tokens. Its 429s name the short window;
// the x-ratelimit-remaining-* headers still show the minute's buckets, as
// every provider's do.
type ShortWindow struct {
	// Period is the window's length. 0 means no short window.
	Period time.Duration `json:"period"`
	// Kind is how the window is counted: WindowBucket, WindowFixed or
	// WindowSliding. Defaults to WindowBucket.
	Kind string `json:"kind"`
	// RequestsOnly limits only requests over the window, as Azure documents
	// of its RPM; tokens are then counted over the minute only. Defaults to
	// false: both.
	RequestsOnly bool `json:"requests_only"`
}

func (w ShortWindow) validate() error {
	switch {
	case w.Period < 0:
		return fmt.Errorf("sim: Config.ShortWindow.Period must not be negative, got %v", w.Period)
	case w.Period > time.Minute:
		return fmt.Errorf("sim: Config.ShortWindow.Period must be at most 1m, got %v", w.Period)
	case w.Kind != "" && w.Kind != WindowBucket && w.Kind != WindowFixed && w.Kind != WindowSliding:
		return fmt.Errorf("sim: Config.ShortWindow.Kind must be %q, %q or %q, got %q", WindowBucket, WindowFixed, WindowSliding, w.Kind)
	}
	return nil
}

// window is one limit counted over a short window. A cost above the
// window's whole share is admitted only into an untouched window (a full
// bucket, an empty count), so a large request waits instead of failing for
// ever.
type window struct {
	kind   string
	period time.Duration
	limit  float64 // what the window admits: the limit's share of period
	// bucket: level and when it was refilled
	level float64
	last  time.Time
	// fixed: the window's index and its count
	index int64
	count float64
	// sliding: what was admitted in the last period, oldest first
	log []windowEntry
	sum float64
}

type windowEntry struct {
	at   time.Time
	cost float64
}

// newWindow returns the short window of a per-minute limit, or nil when
// there is no such limit or no short window.
func newWindow(w ShortWindow, perMinute int64, now time.Time) *window {
	if w.Period <= 0 || perMinute <= 0 {
		return nil
	}
	limit := float64(perMinute) * float64(w.Period) / float64(time.Minute)
	kind := w.Kind
	if kind == "" {
		kind = WindowBucket
	}
	return &window{kind: kind, period: w.Period, limit: limit, level: limit, last: now, index: now.UnixNano() / int64(w.Period)}
}

// advance brings the window to now.
func (w *window) advance(now time.Time) {
	switch w.kind {
	case WindowBucket:
		if d := now.Sub(w.last); d > 0 {
			w.level = min(w.limit, w.level+float64(d)*w.limit/float64(w.period))
			w.last = now
		}
	case WindowFixed:
		if i := now.UnixNano() / int64(w.period); i != w.index {
			w.index, w.count = i, 0
		}
	case WindowSliding:
		cut := now.Add(-w.period)
		k := 0
		for k < len(w.log) && !w.log[k].at.After(cut) {
			w.sum -= w.log[k].cost
			k++
		}
		w.log = w.log[k:]
		if len(w.log) == 0 {
			w.sum = 0 // no float residue
		}
	}
}

// wait is how long until the window admits cost: 0 when it does now.
func (w *window) wait(cost int64, now time.Time) time.Duration {
	w.advance(now)
	c := float64(cost)
	switch w.kind {
	case WindowBucket:
		need := min(c, w.limit) - w.level
		if need <= 1e-9 {
			return 0
		}
		return ceilMS(time.Duration(math.Ceil(need / w.limit * float64(w.period))))
	case WindowFixed:
		if w.count == 0 || w.count+c <= w.limit+1e-9 {
			return 0
		}
		return ceilMS(time.Duration((w.index+1)*int64(w.period) - now.UnixNano()))
	default: // sliding
		if w.sum == 0 || w.sum+c <= w.limit+1e-9 {
			return 0
		}
		// until enough of the oldest entries leave the window
		freed := w.sum
		for _, e := range w.log {
			freed -= e.cost
			if freed == 0 || freed+c <= w.limit+1e-9 {
				return ceilMS(e.at.Add(w.period).Sub(now))
			}
		}
		return ceilMS(w.period)
	}
}

// take charges cost, admitted now.
func (w *window) take(cost int64, now time.Time) {
	c := float64(cost)
	switch w.kind {
	case WindowBucket:
		w.level -= c
	case WindowFixed:
		w.count += c
	default:
		w.log = append(w.log, windowEntry{at: now, cost: c})
		w.sum += c
	}
}
