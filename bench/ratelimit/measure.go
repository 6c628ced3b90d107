package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm/sim"
)

// logSize is the simulator's admission log: enough for the retry baseline's
// 429 storm of a few minutes (~1,000 calls/s on two cores), ~120 bytes each.
const logSize = 1_500_000

// sample is the simulator's counters at one moment of a scenario.
type sample struct {
	at time.Duration // since the scenario's start
	st sim.Stats
}

// sampler reads the simulator's counters once a second. Counters sampled
// at the edges of a window give what the provider's buckets kept in it:
// tokens charged at admission minus those refunded, each counted when it
// happened, exactly as the bucket counts them, and apart the external
// application's.
type sampler struct {
	srv   *sim.TestServer
	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	samples []sample
}

// startSampler resets the simulator (counters, log, buckets: full again)
// and starts sampling; the scenario's clock starts now.
func startSampler(srv *sim.TestServer) *sampler {
	srv.Reset()
	s := &sampler{srv: srv, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	s.take()
	go func() {
		defer close(s.done)
		t := time.NewTicker(time.Second)
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
	st := s.srv.Stats()
	at := time.Since(s.start)
	s.mu.Lock()
	s.samples = append(s.samples, sample{at: at, st: st})
	s.mu.Unlock()
}

// finish takes the last sample and returns them all.
func (s *sampler) finish() []sample {
	close(s.stop)
	<-s.done
	s.take()
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// result is what one scenario measured.
type result struct {
	scenario scenario
	start    time.Time // when the simulator was reset: the scenario's 0
	duration time.Duration
	samples  []sample
	// completions are when jobs (llmq) or requests (baselines) succeeded,
	// since the scenario's start, sorted.
	completions []time.Duration
	// responsesDone is how many of them were Responses API calls.
	responsesDone int
	failed        int
	// with429 is how many jobs or requests received a 429, most429 the
	// most 429s one of them received.
	with429, most429 int
	log              []sim.Admission
	dropped          int64 // log entries the simulator did not keep
	// llmqLevels is llmq's own TPM bucket, read from Redis during the run,
	// and learned what its scope learned by the end (llmq scenarios only).
	llmqLevels []levelSample
	learned    *learned
	notes      []string
}

// window is what a scenario measured between two moments.
type window struct {
	from, to time.Duration // as sampled
	// used is the tokens the provider's TPM bucket kept of the calls that
	// reached it (llmq's or the baseline's), external those of the
	// external application.
	used, external int64
	calls          int64 // requests that reached the provider's limiter
	admitted       int64
	limited        int64 // answered 429
	completions    int
}

// between measures [from, to): the counters' difference between the
// samples nearest to from and to, and the completions in between.
func (r *result) between(from, to time.Duration) window {
	at := func(d time.Duration) sample {
		i, _ := slices.BinarySearchFunc(r.samples, d, func(s sample, d time.Duration) int { return cmpDur(s.at, d) })
		switch {
		case i >= len(r.samples):
			return r.samples[len(r.samples)-1]
		case i > 0 && d-r.samples[i-1].at < r.samples[i].at-d:
			return r.samples[i-1]
		}
		return r.samples[i]
	}
	a, b := at(from), at(to)
	w := window{
		from: a.at, to: b.at,
		used:     (b.st.TokensAdmitted - b.st.TokensRefunded) - (a.st.TokensAdmitted - a.st.TokensRefunded),
		calls:    b.st.Requests - a.st.Requests,
		admitted: b.st.Admitted - a.st.Admitted,
		limited:  (b.st.RateLimited + b.st.Spurious429) - (a.st.RateLimited + a.st.Spurious429),
		external: b.st.ExternalTokens - a.st.ExternalTokens,
	}
	lo, _ := slices.BinarySearch(r.completions, a.at)
	hi, _ := slices.BinarySearch(r.completions, b.at)
	w.completions = hi - lo
	return w
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (w window) seconds() float64 { return (w.to - w.from).Seconds() }

// usedShare is the tokens kept of the callers' calls as a share of what the
// TPM allows in the window. It may pass 1 in a window that starts with the
// bucket full.
func (w window) usedShare(tpm int64) float64 { return w.share(w.used, tpm) }

// externalShare is the external application's tokens, accountShare both.
func (w window) externalShare(tpm int64) float64 { return w.share(w.external, tpm) }
func (w window) accountShare(tpm int64) float64  { return w.share(w.used+w.external, tpm) }

func (w window) share(tokens, tpm int64) float64 {
	if w.to <= w.from {
		return 0
	}
	return float64(tokens) / (float64(tpm) * (w.to - w.from).Minutes())
}

func (w window) limitedShare() float64 {
	if w.calls == 0 {
		return 0
	}
	return float64(w.limited) / float64(w.calls)
}

// bucketBin is the provider's TPM bucket over one interval, replayed from
// the admission log.
type bucketBin struct {
	// lost is refill and refunds that a full bucket could not take: capacity
	// nobody used.
	lost float64
	// levelSeconds integrates the level (the tokens the bucket held, unused)
	// over time; divided by the interval it is the mean level.
	levelSeconds float64
	// full is how long the bucket was full.
	full time.Duration
}

// replayTPM replays the provider's TPM bucket (capacity limit, refilled at
// limit per minute, full at start) from the admission log: admitted
// requests take their tokens at admission, refunds come back when the log
// says. The external application's calls are not in the log: do not replay
// a scenario that has one (scenario.replayable).
// edges are the intervals' bounds since start, from 0 up; it returns one bin
// per interval. It is the simulator's own arithmetic, so it says where
// capacity went unused: a bucket that never fills loses nothing, whatever
// the callers do.
func replayTPM(log []sim.Admission, limit int64, start time.Time, edges []time.Duration) []bucketBin {
	ev := tpmEvents(log, start)
	if len(edges) < 2 || edges[0] != 0 {
		return nil
	}
	bins := make([]bucketBin, len(edges)-1)
	lim := float64(limit)
	rate := lim / time.Minute.Seconds() // tokens per second
	level, now, bin := lim, time.Duration(0), 0
	// advance refills up to t, splitting at the edges.
	advance := func(t time.Duration) {
		for now < t {
			end := t
			if bin < len(bins) && edges[bin+1] < end {
				end = edges[bin+1]
			}
			dt := (end - now).Seconds()
			toFull := (lim - level) / rate
			var area, lost, full float64
			if dt <= toFull {
				area = level*dt + rate*dt*dt/2
				level += rate * dt
			} else {
				area = level*toFull + rate*toFull*toFull/2 + lim*(dt-toFull)
				lost, full = rate*(dt-toFull), dt-toFull
				level = lim
			}
			if bin < len(bins) {
				bins[bin].levelSeconds += area
				bins[bin].lost += lost
				bins[bin].full += time.Duration(full * float64(time.Second))
			}
			now = end
			if bin < len(bins) && now == edges[bin+1] {
				bin++
			}
		}
	}
	for _, e := range ev {
		advance(e.at)
		level += e.n
		if level > lim {
			if bin < len(bins) {
				bins[bin].lost += level - lim
			}
			level = lim
		}
	}
	advance(edges[len(edges)-1])
	return bins
}

// tpmEvent is a change of the provider's TPM bucket: an admission takes
// tokens (n < 0), a refund gives some back.
type tpmEvent struct {
	at time.Duration
	n  float64
}

// tpmEvents are the changes the admission log made to the TPM bucket, in
// time order.
func tpmEvents(log []sim.Admission, start time.Time) []tpmEvent {
	var ev []tpmEvent
	for _, a := range log {
		if a.Outcome != sim.Admitted {
			continue
		}
		ev = append(ev, tpmEvent{a.Time.Sub(start), -float64(a.Tokens)})
		if a.Refunded > 0 {
			ev = append(ev, tpmEvent{a.RefundedAt.Sub(start), float64(a.Refunded)})
		}
	}
	slices.SortStableFunc(ev, func(a, b tpmEvent) int { return cmpDur(a.at, b.at) })
	return ev
}

// tpmLevels replays the provider's TPM bucket as replayTPM does and returns
// its level at each of times (sorted, since start).
func tpmLevels(log []sim.Admission, limit int64, start time.Time, times []time.Duration) []float64 {
	ev := tpmEvents(log, start)
	lim := float64(limit)
	rate := lim / time.Minute.Seconds()
	level, now := lim, time.Duration(0)
	out := make([]float64, 0, len(times))
	advance := func(t time.Duration) {
		if t > now {
			level = math.Min(lim, level+rate*(t-now).Seconds())
			now = t
		}
	}
	i := 0
	for _, t := range times {
		for ; i < len(ev) && ev[i].at <= t; i++ {
			advance(ev[i].at)
			level = math.Min(lim, level+ev[i].n)
		}
		advance(t)
		out = append(out, level)
	}
	return out
}

// writeAdmissions writes a scenario's admission log, one JSON object a line.
func writeAdmissions(dir, scenario string, log []sim.Admission) error {
	path := filepath.Join(dir, scenario+".jsonl")
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("-admissions: %w", err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range log {
		if err := enc.Encode(&log[i]); err != nil {
			_ = f.Close()
			return fmt.Errorf("-admissions: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("-admissions: %w", err)
	}
	return f.Close()
}
