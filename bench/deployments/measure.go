package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm/sim"
)

// sample is every deployment's counters at one moment.
type sample struct {
	at    time.Time
	stats []sim.Stats
}

// sampler reads the simulators' counters four times a second.
type sampler struct {
	deps []*deployment
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples []sample
}

func startSampler(deps []*deployment) *sampler {
	s := &sampler{deps: deps, stop: make(chan struct{}), done: make(chan struct{})}
	s.take()
	go func() {
		defer close(s.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.take()
			}
		}
	}()
	return s
}

func (s *sampler) take() {
	sm := sample{at: time.Now()}
	for _, d := range s.deps {
		sm.stats = append(sm.stats, d.srv.Stats())
	}
	s.mu.Lock()
	s.samples = append(s.samples, sm)
	s.mu.Unlock()
}

// finish stops sampling (once).
func (s *sampler) finish() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// at returns the last sample taken at or before t.
func (s *sampler) at(t time.Time) sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.samples[0]
	for _, sm := range s.samples {
		if sm.at.After(t) {
			break
		}
		out = sm
	}
	return out
}

// usage is what each deployment's account counted between two samples.
type usage struct {
	window                      time.Duration
	admitted, tokens            []int64
	requests, limited           []int64
	capacity                    []float64 // requests the deployment admits in window, for this mix, at its binding limit
	used                        []float64 // admitted / capacity
	totalAdmitted, totalCap     float64
	totalRequests, totalLimited int64
}

// between measures [from, to] from the samples: each deployment's use of
// its limits by its own count (the larger of its requests' and its tokens'
// share, as the binding one), and their sum against the sum of what each
// can admit for the mix of the window.
func (s *sampler) between(from, to time.Time, deps []*deployment) *usage {
	a, b := s.at(from), s.at(to)
	u := &usage{window: b.at.Sub(a.at)}
	minutes := u.window.Minutes()
	for i, d := range deps {
		adm := b.stats[i].Admitted - a.stats[i].Admitted
		tok := b.stats[i].TokensAdmitted - a.stats[i].TokensAdmitted
		req := b.stats[i].Requests - a.stats[i].Requests
		lim := b.stats[i].RateLimited + b.stats[i].Spurious429 - a.stats[i].RateLimited - a.stats[i].Spurious429
		capReq := float64(d.rpm) * minutes
		if adm > 0 {
			// The tokens a call of the window cost, as the account counted.
			perCall := float64(tok) / float64(adm)
			capReq = min(capReq, float64(d.tpm)*minutes/perCall)
		}
		used := 0.0
		if capReq > 0 {
			used = float64(adm) / capReq
		}
		u.admitted, u.tokens = append(u.admitted, adm), append(u.tokens, tok)
		u.requests, u.limited = append(u.requests, req), append(u.limited, lim)
		u.capacity, u.used = append(u.capacity, capReq), append(u.used, used)
		u.totalAdmitted += float64(adm)
		u.totalCap += capReq
		u.totalRequests += req
		u.totalLimited += lim
	}
	return u
}

// total is the three deployments' use of the sum of their limits.
func (u *usage) total() float64 {
	if u.totalCap == 0 {
		return 0
	}
	return u.totalAdmitted / u.totalCap
}

// share429 is the share of calls the accounts answered 429.
func (u *usage) share429() float64 {
	if u.totalRequests == 0 {
		return 0
	}
	return float64(u.totalLimited) / float64(u.totalRequests)
}

// lines describes u, one line per deployment and one for the sum.
func (u *usage) lines(deps []*deployment) []string {
	var out []string
	for i, d := range deps {
		out = append(out, fmt.Sprintf("%-26s %5d calls %8d tokens in %v: %5.1f%% of its limits (%.0f calls at its binding limit), %d answered 429",
			d.name(), u.admitted[i], u.tokens[i], u.window.Round(time.Second), 100*u.used[i], u.capacity[i], u.limited[i]))
	}
	out = append(out, fmt.Sprintf("%-26s %5.0f calls of %.0f: %5.1f%% of the sum of the limits; %d of %d calls answered 429 (%.2f%%)",
		"together", u.totalAdmitted, u.totalCap, 100*u.total(), u.totalLimited, u.totalRequests, 100*u.share429()))
	return out
}

// check is one target of a scenario and whether it was met.
type check struct {
	what string
	ok   bool
}

// report is a scenario's outcome.
type report struct {
	lines  []string
	checks []check
}

func (r *report) line(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func (r *report) target(ok bool, format string, args ...any) {
	r.checks = append(r.checks, check{what: fmt.Sprintf(format, args...), ok: ok})
}
