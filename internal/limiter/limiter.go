// Package limiter is the Redis mechanism of llmq's rate limits: the
// multi-bucket weighted token bucket (reserve, settle with what a provider
// answered, penalize with a single probe afterwards, wait), the window sets
// of the API's per-key limits (Windows and WindowPrefetch), and the Spacer
// of webhook deliveries; pacer is the front. Every check-and-take is one Lua
// script and one round trip on Redis TIME (or an injected clock in tests),
// and every key has the scope's hash tag and expires once idle.
package limiter

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/rkeys"
)

// ErrCostExceedsCapacity is returned (wrapped) for a cost larger than a
// bucket or window can ever hold, at once instead of waiting forever.
var ErrCostExceedsCapacity = errors.New("limiter: cost exceeds capacity")

// Unit is what a bucket counts.
type Unit int

const (
	UnitRequests     Unit = iota // Cost.Requests
	UnitTokens                   // Cost.Tokens: input and output together
	UnitInputTokens              // Cost.Input
	UnitOutputTokens             // Cost.Output
)

func (u Unit) String() string {
	switch u {
	case UnitTokens:
		return "tokens"
	case UnitInputTokens:
		return "input tokens"
	case UnitOutputTokens:
		return "output tokens"
	}
	return "requests"
}

// Counts reports whether u counts tokens of any kind.
func (u Unit) Counts() bool { return u != UnitRequests }

// settlesToUsage: a bucket of input or output tokens is settled to the
// call's real count of its kind, up or down, as the providers that limit
// them apart count (an output limit charged max_tokens at admission and
// corrected when the call ends); requests and total tokens take only what
// the provider charged beyond the reservation.
func (u Unit) settlesToUsage() bool { return u == UnitInputTokens || u == UnitOutputTokens }

// Bucket is one token bucket of a scope. It holds Limit (its capacity) and
// refills continuously at Limit per Period.
type Bucket struct {
	Name   string // unique in its scope: "rps", "rpm", "tpm", "itpm"…
	Unit   Unit
	Limit  int64
	Period time.Duration
	// Burst bounds what the bucket lets out at once to its refill over
	// Burst (or one call's cost, when more), for a provider counting over a
	// shorter window than the period; 0: no bound but the capacity.
	Burst time.Duration
}

// Scope is a set of buckets taken from all at once, e.g. one model at one
// provider; without buckets it only carries penalties. Its name becomes the
// hash tag of its keys.
type Scope struct {
	Name    string // e.g. "openai/gpt-4o-mini"
	Buckets []Bucket
}

// ModelBuckets are the buckets a model's scope may have, one per dimension
// of limit a provider sets (a unit over a window), in ModelScope's order;
// each name is the policy's key of its limit.
var ModelBuckets = []ModelBucket{
	{"rps", UnitRequests, time.Second, true},
	{"rpm", UnitRequests, time.Minute, true},
	{"rpd", UnitRequests, 24 * time.Hour, false},
	{"tpm", UnitTokens, time.Minute, true},
	{"tpd", UnitTokens, 24 * time.Hour, false},
	{"itpm", UnitInputTokens, time.Minute, true},
	{"itpd", UnitInputTokens, 24 * time.Hour, false},
	{"otpm", UnitOutputTokens, time.Minute, true},
	{"otpd", UnitOutputTokens, 24 * time.Hour, false},
}

// ModelBucket is one dimension of a model's limits.
type ModelBucket struct {
	Name   string
	Unit   Unit
	Period time.Duration
	paced  bool // a day's bucket is a quota, not a pace: no burst bound
}

// ModelScope returns the scope of one model with its limits by bucket name
// (ModelBuckets); 0 or absent means no such bucket. burst is the paced
// buckets' Bucket.Burst.
func ModelScope(name string, limits map[string]int64, burst time.Duration) Scope {
	s := Scope{Name: name}
	for _, b := range ModelBuckets {
		if limit := limits[b.Name]; limit > 0 {
			s.Buckets = append(s.Buckets, Bucket{Name: b.Name, Unit: b.Unit, Limit: limit, Period: b.Period})
			if b.paced {
				s.Buckets[len(s.Buckets)-1].Burst = burst
			}
		}
	}
	return s
}

// Cost is what one call takes: requests, and its tokens all told (Tokens)
// and of each kind (Input, the prompt; Output, the most output).
type Cost struct{ Requests, Tokens, Input, Output int64 }

// Of returns the part of c that a bucket of unit u counts.
func (c Cost) Of(u Unit) int64 {
	switch u {
	case UnitTokens:
		return c.Tokens
	case UnitInputTokens:
		return c.Input
	case UnitOutputTokens:
		return c.Output
	}
	return c.Requests
}

func (c Cost) negative() bool { return c.Requests < 0 || c.Tokens < 0 || c.Input < 0 || c.Output < 0 }

// validate checks s, and c against every bucket's capacity.
func (s Scope) validate(c Cost) error {
	if s.Name == "" {
		return errors.New("limiter: Scope.Name is empty")
	}
	if c.negative() {
		return fmt.Errorf("limiter: scope %q: negative cost %+v", s.Name, c)
	}
	for i, b := range s.Buckets {
		switch {
		case b.Name == "":
			return fmt.Errorf("limiter: scope %q: Buckets[%d].Name is empty", s.Name, i)
		case b.Unit < UnitRequests || b.Unit > UnitOutputTokens:
			return fmt.Errorf("limiter: scope %q bucket %q: unknown Unit %d", s.Name, b.Name, b.Unit)
		case b.Limit <= 0:
			return fmt.Errorf("limiter: scope %q bucket %q: Limit %d must be positive", s.Name, b.Name, b.Limit)
		case b.Period < time.Microsecond:
			return fmt.Errorf("limiter: scope %q bucket %q: Period %v must be at least 1µs", s.Name, b.Name, b.Period)
		case b.Burst < 0:
			return fmt.Errorf("limiter: scope %q bucket %q: Burst %v must not be negative", s.Name, b.Name, b.Burst)
		case slices.ContainsFunc(s.Buckets[:i], func(o Bucket) bool { return o.Name == b.Name }):
			return fmt.Errorf("limiter: scope %q: bucket name %q appears twice", s.Name, b.Name)
		case c.Of(b.Unit) > b.Limit:
			return fmt.Errorf("%w: scope %q bucket %q: cost %d %s > capacity %d",
				ErrCostExceedsCapacity, s.Name, b.Name, c.Of(b.Unit), b.Unit, b.Limit)
		}
	}
	return nil
}

// BucketState is one bucket's (or window's) level after a decision.
type BucketState struct {
	Name       string
	Unit       Unit
	Limit      int64
	Remaining  int64         // rounded down; negative while in debt
	RetryAfter time.Duration // when this bucket alone covers the cost; 0 now
	ResetAfter time.Duration // until full again
	Burst      int64         // what the bucket lets out at once now; -1: only its capacity bounds it
	Taken      int64         // all a token bucket ever took (reservations and charges beyond them)
}

// Result is the decision of every limiter of this package.
type Result struct {
	Allowed bool
	// Limit and Remaining (never negative) are the tightest bucket's
	// (Tightest), for X-RateLimit-* headers.
	Limit, Remaining int64
	// RetryAfter is 0 when allowed; else when every bucket and any penalty
	// cover the cost if nobody else takes meanwhile, or, while a probe or
	// reservations in flight hold it back, when to check again.
	RetryAfter time.Duration
	ResetAfter time.Duration // until every bucket is full again
	Buckets    []BucketState // one per bucket or window, in order
	// Penalized: denied by Penalize, or by the probe in flight after it.
	Penalized bool
	// HeldInFlight: denied by what reservations in flight hold back
	// (Options.HoldInFlight); a Settle may free it at any moment.
	HeldInFlight bool
	// Reservation is set when a token bucket allowed.
	Reservation *Reservation
	// Time is Redis's (or the injected clock's) time of the decision; zero
	// for a prefetched window take.
	Time time.Time

	probeWait bool // RetryAfter is a guess: a probe is in flight
}

// fill sets Limit, Remaining and ResetAfter of r from r.Buckets.
func (r *Result) fill() {
	for _, b := range r.Buckets {
		r.ResetAfter = max(r.ResetAfter, b.ResetAfter)
	}
	if tight := r.Tightest(); tight >= 0 {
		r.Limit = r.Buckets[tight].Limit
		r.Remaining = max(r.Buckets[tight].Remaining, 0)
	}
}

// Options configure every limiter of this package. The zero value is ready
// to use.
type Options struct {
	Keys rkeys.Builder
	// Clock, when set (tests), is passed to the scripts instead of Redis TIME.
	Clock func() time.Time
	// ProbeTimeout is how long the probe after a penalty may stay unsettled
	// before another caller becomes the probe. Defaults to 30s.
	ProbeTimeout time.Duration
	// HoldInFlight holds every reservation until it is settled or released
	// (see inflightGen), so the bucket never runs ahead of the provider's:
	// for reservations that are each one provider call (the workers'), not
	// plain permits.
	HoldInFlight bool
}

// The longest RetryAfter while a probe is in flight (probeRetry) or while
// reservations in flight hold the room back (holdRetry), jittered by ±25%;
// how long a settled reservation is remembered, so that settling it again
// changes nothing (reconcileTTL); the most Wait adds at random to each
// RetryAfter (waitJitter).
const (
	probeRetry   = 500 * time.Millisecond
	holdRetry    = 100 * time.Millisecond
	reconcileTTL = time.Hour
	waitJitter   = 2 * time.Millisecond
)

func (o Options) withDefaults() Options {
	o.ProbeTimeout = cmp.Or(o.ProbeTimeout, 30*time.Second)
	return o
}

// ints reads a script's reply of at least n integers.
func ints(cmd *redis.Cmd, n int) ([]int64, error) {
	v, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < n {
		return nil, fmt.Errorf("limiter: unexpected script reply %T %v", v, v)
	}
	out := make([]int64, len(a))
	for i, x := range a {
		if out[i], ok = x.(int64); !ok {
			return nil, fmt.Errorf("limiter: unexpected script reply element %d: %T %v", i, x, x)
		}
	}
	return out, nil
}

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// newID returns a reservation or log-entry id, unique with overwhelming
// probability across processes.
func newID() string {
	var b [16]byte
	return string(strconv.AppendUint(b[:0], rand.Uint64(), 36))
}
