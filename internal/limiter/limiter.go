// Package limiter owns llmq's Redis rate limiters: the multi-bucket weighted
// token bucket that guards every provider call (reserve, reconcile with the
// real usage, penalize after a 429 with a single probe afterwards, wait), its
// lease mode for hot paths, the window limiters (fixed window, sliding
// window log, sliding window counter, multi-window) and the window sets
// built on them for the API's per-key limits (Windows, any algorithm, with
// their lease mode, WindowLease), and the Spacer that spaces webhook
// deliveries. Every check-and-take is one Lua script and one round trip, time is
// Redis TIME (or an injected clock in tests), every key comes from
// rkeys.Builder with the scope's hash tag and expires once idle, and every
// limiter takes any go-redis client (a redis.Scripter; TokenBucket also
// pipelines), so single node, Sentinel and Cluster fit.
package limiter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/rkeys"
)

// ErrCostExceedsCapacity is returned (wrapped, with the scope, bucket, cost
// and capacity) when a cost is larger than a bucket or window can ever hold:
// such a request fails at once instead of waiting forever.
var ErrCostExceedsCapacity = errors.New("limiter: cost exceeds capacity")

// ttlMargin is added to every key's expiry, after the moment its state would
// be indistinguishable from a missing key.
const ttlMargin = time.Second

// Unit is what a bucket counts.
type Unit int

const (
	// UnitRequests counts calls: Cost.Requests.
	UnitRequests Unit = iota
	// UnitTokens counts tokens: Cost.Tokens.
	UnitTokens
)

func (u Unit) String() string {
	switch u {
	case UnitRequests:
		return "requests"
	case UnitTokens:
		return "tokens"
	}
	return "unit(" + strconv.Itoa(int(u)) + ")"
}

// Bucket is one token bucket of a scope. It holds Limit (its capacity) and
// refills continuously at Limit per Period.
type Bucket struct {
	// Name identifies the bucket inside its scope: "rps", "rpm", "tpm", "tpd".
	Name string
	// Unit is what the bucket counts.
	Unit Unit
	// Limit is the period's limit, which is also the bucket's capacity.
	Limit int64
	// Period is the time the bucket takes to refill from empty to full.
	Period time.Duration
	// Burst bounds what the bucket lets out at once to its refill over
	// Burst (or one call's cost, when more), however much it holds: a full
	// bucket does not send a minute's worth of calls together, which a
	// provider counting over a shorter window than its limit's period would
	// refuse. 0 means no bound but the capacity. 429s that show a shorter
	// window lower it (see Settle), for a while.
	Burst time.Duration
}

// Scope is a set of buckets taken from together, e.g. one model at one
// provider. Its name becomes the hash tag of its keys.
type Scope struct {
	// Name is e.g. "openai/gpt-4o-mini".
	Name string
	// Buckets are checked and taken from all at once. A scope without buckets
	// only carries penalties.
	Buckets []Bucket
}

// ModelScope returns the scope of one model with its request and token
// limits; 0 means no such bucket. rps is a request bucket refilling per
// second, rpm per minute, tpm and tpd token buckets per minute and per day.
// burst bounds what the rps, rpm and tpm buckets let out at once (see
// Bucket.Burst); the day's bucket is a quota, not a pace, and has none.
func ModelScope(name string, rps, rpm, tpm, tpd int64, burst time.Duration) Scope {
	s := Scope{Name: name}
	add := func(n string, u Unit, limit int64, period, burst time.Duration) {
		if limit > 0 {
			s.Buckets = append(s.Buckets, Bucket{Name: n, Unit: u, Limit: limit, Period: period, Burst: burst})
		}
	}
	add("rps", UnitRequests, rps, time.Second, burst)
	add("rpm", UnitRequests, rpm, time.Minute, burst)
	add("tpm", UnitTokens, tpm, time.Minute, burst)
	add("tpd", UnitTokens, tpd, 24*time.Hour, 0)
	return s
}

// Cost is what one call takes.
type Cost struct {
	Requests, Tokens int64
}

// Of returns the part of c that a bucket of unit u counts.
func (c Cost) Of(u Unit) int64 {
	if u == UnitTokens {
		return c.Tokens
	}
	return c.Requests
}

// validate checks s and, against every bucket's capacity, the cost c.
func (s Scope) validate(c Cost) error {
	if s.Name == "" {
		return errors.New("limiter: Scope.Name is empty")
	}
	if c.Requests < 0 || c.Tokens < 0 {
		return fmt.Errorf("limiter: scope %q: negative cost %+v", s.Name, c)
	}
	for i, b := range s.Buckets {
		switch {
		case b.Name == "":
			return fmt.Errorf("limiter: scope %q: Buckets[%d].Name is empty", s.Name, i)
		case b.Unit != UnitRequests && b.Unit != UnitTokens:
			return fmt.Errorf("limiter: scope %q bucket %q: unknown Unit %d", s.Name, b.Name, b.Unit)
		case b.Limit <= 0:
			return fmt.Errorf("limiter: scope %q bucket %q: Limit %d must be positive", s.Name, b.Name, b.Limit)
		case b.Period < time.Microsecond:
			return fmt.Errorf("limiter: scope %q bucket %q: Period %v must be at least 1µs", s.Name, b.Name, b.Period)
		case b.Burst < 0:
			return fmt.Errorf("limiter: scope %q bucket %q: Burst %v must not be negative", s.Name, b.Name, b.Burst)
		}
		for _, o := range s.Buckets[:i] {
			if o.Name == b.Name {
				return fmt.Errorf("limiter: scope %q: bucket name %q appears twice", s.Name, b.Name)
			}
		}
		if n := c.Of(b.Unit); n > b.Limit {
			return fmt.Errorf("%w: scope %q bucket %q: cost %d %s > capacity %d",
				ErrCostExceedsCapacity, s.Name, b.Name, n, b.Unit, b.Limit)
		}
	}
	return nil
}

// BucketState is one bucket's (or window's) level after a decision.
type BucketState struct {
	Name  string
	Unit  Unit
	Limit int64
	// Remaining is what the bucket still holds, rounded down; negative while
	// the bucket is in debt (Reconcile took more than was reserved).
	Remaining int64
	// RetryAfter is the time until this bucket alone can cover the cost; 0
	// when it can now.
	RetryAfter time.Duration
	// ResetAfter is the time until this bucket is full again.
	ResetAfter time.Duration
	// Burst is what the bucket lets out at once now, however much it holds
	// (Remaining): at most Bucket.Burst's refill, as 429s lowered it; a
	// call costing more goes alone once this is whole. -1 when only its
	// capacity bounds it.
	Burst int64
}

// Result is the decision of every limiter of this package.
type Result struct {
	Allowed bool
	// Limit and Remaining are those of the tightest bucket (the one that
	// denied for longest, or else the emptiest), for X-RateLimit-* headers.
	// Remaining is never negative here.
	Limit, Remaining int64
	// RetryAfter is 0 when allowed; else the time until every bucket (and
	// any penalty) can cover the cost, assuming nobody else takes meanwhile.
	// While a probe or reservations in flight hold the cost back (see
	// Penalized and HeldInFlight), whose end nobody knows in advance, it is
	// a time to check again instead.
	RetryAfter time.Duration
	// ResetAfter is the time until every bucket is full again.
	ResetAfter time.Duration
	// Buckets has one entry per bucket (token bucket) or window, in order.
	Buckets []BucketState
	// Penalized is true when the caller was denied because of Penalize, or
	// because a probe is in flight after a penalty.
	Penalized bool
	// HeldInFlight is true when the caller was denied because reservations
	// in flight (Options.HoldInFlight) hold back what the cost needs. Their
	// holds lapse only seconds later, but a Reconcile or Release of one of
	// them may admit the cost at any moment: RetryAfter is then when to
	// check again, at most Options.HoldRetry, and each bucket's RetryAfter is
	// when it covers the cost if nothing is reconciled or taken meanwhile.
	HeldInFlight bool
	// Reservation is what Reconcile and Release take; non-nil when a token
	// bucket allowed.
	Reservation *Reservation
	// Time is the Redis time (or the injected clock's) of the decision; zero
	// for a lease's local takes.
	Time time.Time

	// probeWait marks a RetryAfter that is a guess (a probe is in flight),
	// not the exact time of admission.
	probeWait bool
}

// fill sets Limit, Remaining, RetryAfter and ResetAfter of r from r.Buckets.
func (r *Result) fill() {
	for _, b := range r.Buckets {
		if b.ResetAfter > r.ResetAfter {
			r.ResetAfter = b.ResetAfter
		}
	}
	if tight := r.Tightest(); tight >= 0 {
		r.Limit = r.Buckets[tight].Limit
		r.Remaining = max(r.Buckets[tight].Remaining, 0)
	}
}

// Options configure every limiter of this package. The zero value is ready
// to use.
type Options struct {
	// Keys builds every key. Defaults to rkeys.New(""), prefix "llmq".
	Keys rkeys.Builder
	// Clock, when set, is the limiters' time: its time (in µs) is passed to
	// the scripts instead of Redis TIME. Tests only. Defaults to nil (Redis
	// TIME).
	Clock func() time.Time
	// ProbeTimeout is how long the single probe admitted after a penalty may
	// stay unreconciled before another caller becomes the probe. Defaults to
	// 30s.
	ProbeTimeout time.Duration
	// ProbeRetry is the longest RetryAfter given to callers denied while a
	// probe is in flight (shorter when the probe times out sooner), jittered
	// by ±25%. Defaults to 500ms.
	ProbeRetry time.Duration
	// HoldInFlight holds every reservation of the token bucket in flight
	// until it is reconciled or released (see inflightGen): the bucket then
	// never runs ahead of the provider it mirrors, whose charges arrive a
	// little later and whose refunds a little earlier. Set it when every
	// reservation is for one provider call and is always reconciled or
	// released (llmq's workers); leave it off for plain permits. Defaults to
	// false.
	HoldInFlight bool
	// HoldRetry is the longest RetryAfter given to callers denied because
	// reservations in flight hold back what they need (Result.HeldInFlight),
	// jittered by ±25%: a reconcile may free it at any moment, while the
	// holds themselves lapse only 5 to 10 s after their reservation.
	// Defaults to 100ms.
	HoldRetry time.Duration
	// ReconcileTTL is how long a reconciled reservation is remembered, so
	// that reconciling it again changes nothing. Defaults to 1h.
	ReconcileTTL time.Duration
	// Jitter is the upper bound of the random delay Wait adds to each
	// RetryAfter it sleeps, so callers denied together do not retry in
	// lockstep. Defaults to 2ms.
	Jitter time.Duration
	// Rand returns a random number in [0, 1), for jitter. Defaults to
	// math/rand/v2's Float64.
	Rand func() float64
}

// validate reports, naming the field, a negative duration.
func (o Options) validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"ProbeTimeout", o.ProbeTimeout}, {"ProbeRetry", o.ProbeRetry}, {"HoldRetry", o.HoldRetry},
		{"ReconcileTTL", o.ReconcileTTL}, {"Jitter", o.Jitter},
	} {
		if f.d < 0 {
			return fmt.Errorf("limiter: Options.%s must not be negative, got %v", f.name, f.d)
		}
	}
	return nil
}

// withDefaults validates o and returns it with its zero fields set to their
// defaults.
func (o Options) withDefaults() (Options, error) {
	if err := o.validate(); err != nil {
		return o, err
	}
	if o.ProbeTimeout == 0 {
		o.ProbeTimeout = 30 * time.Second
	}
	if o.ProbeRetry == 0 {
		o.ProbeRetry = 500 * time.Millisecond
	}
	if o.HoldRetry == 0 {
		o.HoldRetry = 100 * time.Millisecond
	}
	if o.ReconcileTTL == 0 {
		o.ReconcileTTL = time.Hour
	}
	if o.Jitter == 0 {
		o.Jitter = 2 * time.Millisecond
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	return o, nil
}

// ints reads a script's reply of at least n integers.
func ints(v any, n int) ([]int64, error) {
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
