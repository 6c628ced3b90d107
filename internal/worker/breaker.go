package worker

import (
	"cmp"
	"sync"
	"time"
)

// Breaker states.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half-open"
)

// BreakerOptions tune the circuit breakers.
type BreakerOptions struct {
	// Failures is how many provider faults in a row (5xx, timeouts,
	// connection errors) open a provider's circuit. Defaults to 5.
	Failures int
	// Cooldown is how long an open circuit stays open before one probe call
	// may try; it doubles while probes fail. Defaults to 5s.
	Cooldown time.Duration
	// MaxCooldown caps the doubling. Defaults to 2m.
	MaxCooldown time.Duration
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	o.Failures = cmp.Or(o.Failures, 5)
	o.Cooldown = cmp.Or(o.Cooldown, 5*time.Second)
	o.MaxCooldown = cmp.Or(o.MaxCooldown, 2*time.Minute)
	return o
}

// Breakers keeps one circuit breaker per deployment in this process, free
// of Redis round trips: while a deployment fails again and again, its jobs
// wait instead of spending their retries. 4xx answers are not faults.
type Breakers struct {
	opts BreakerOptions
	obs  Observer
	now  func() time.Time

	mu sync.Mutex
	m  map[string]*breaker
}

type breaker struct {
	state    string
	fails    int
	until    time.Time // open: when a probe may go
	cooldown time.Duration
	probing  bool // half-open: the probe is out
}

// NewBreakers returns the breakers of one process, telling obs (not nil)
// their changes, on the clock now (not nil).
func NewBreakers(opts BreakerOptions, obs Observer, now func() time.Time) *Breakers {
	return &Breakers{opts: opts.withDefaults(), obs: obs, now: now, m: map[string]*breaker{}}
}

func (bs *Breakers) get(provider string) *breaker {
	b, ok := bs.m[provider]
	if !ok {
		b = &breaker{state: BreakerClosed, cooldown: bs.opts.Cooldown}
		bs.m[provider] = b
	}
	return b
}

// Allow reports whether a call to provider may go now; when not, wait is
// how long until it may. In the half-open state exactly one call (the
// probe) is allowed until its outcome is recorded.
func (bs *Breakers) Allow(provider string) (ok bool, wait time.Duration) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.get(provider)
	now := bs.now()
	switch b.state {
	case BreakerOpen:
		if now.Before(b.until) {
			return false, b.until.Sub(now)
		}
		bs.set(provider, b, BreakerHalfOpen)
		b.probing = true
		return true, 0
	case BreakerHalfOpen:
		if b.probing {
			return false, bs.opts.Cooldown
		}
		b.probing = true
		return true, 0
	}
	return true, 0
}

// Record tells the breaker how a call allowed by Allow ended: fault is true
// for a 5xx, timeout or connection error. A call that did not count either
// way (a 429, a cancelled call) must still be recorded with Done.
func (bs *Breakers) Record(provider string, fault bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.get(provider)
	b.probing = false
	if !fault {
		b.fails, b.cooldown = 0, bs.opts.Cooldown
		bs.set(provider, b, BreakerClosed)
		return
	}
	b.fails++
	if b.state == BreakerHalfOpen {
		b.cooldown = min(2*b.cooldown, bs.opts.MaxCooldown)
	}
	if b.state == BreakerHalfOpen || b.fails >= bs.opts.Failures {
		b.until = bs.now().Add(b.cooldown)
		bs.set(provider, b, BreakerOpen)
	}
}

// Done releases a half-open probe whose outcome says nothing of the
// provider's health (a 429, a shutdown).
func (bs *Breakers) Done(provider string) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.get(provider).probing = false
}

// State returns the state of provider's breaker.
func (bs *Breakers) State(provider string) string {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.get(provider).state
}

func (bs *Breakers) set(provider string, b *breaker, state string) {
	if b.state == state {
		return
	}
	b.state = state
	bs.obs.BreakerState(provider, state)
}
