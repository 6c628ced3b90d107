package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"
)

// pair runs fn on a fair stack and on a baseline stack at the same time,
// each with its own simulator, and returns both results.
func pair[T any](ctx context.Context, o *options, logger *slog.Logger, fn func(context.Context, *stack) (T, error)) (fair, base T, err error) {
	var wg sync.WaitGroup
	var errs [2]error
	var res [2]T
	for i, mode := range []string{modeFair, modeSingle} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := openStack(ctx, o, mode, logger)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", mode, err)
				return
			}
			defer s.close()
			if err := s.startWorkers(); err != nil {
				errs[i] = fmt.Errorf("%s: %w", mode, err)
				return
			}
			res[i], errs[i] = fn(ctx, s)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%s: %w", mode, errs[i])
			}
		}()
	}
	wg.Wait()
	if errs[0] != nil {
		return res[0], res[1], errs[0]
	}
	return res[0], res[1], errs[1]
}

// latencyResult is how long a tenant's jobs (or batch) took from their
// submission to their success.
type latencyResult struct {
	Done, Total int
	P50, Max    time.Duration // of those done
	// Ahead is how many of the flooding tenant's jobs were not started
	// when the measured ones were submitted; Rate its jobs/s before.
	Ahead int
	Rate  float64
	// Requeued and Dequeues are the limiter's requeues of the flooded
	// model and every job task dequeued, over the scenario (Elapsed);
	// Slept the workers' time asleep for the flooded model's permits.
	Requeued, Dequeues, Succeeded int64
	Slept, Elapsed                time.Duration
}

func summarize(d []time.Duration) (done int, p50, worst time.Duration) {
	var ok []time.Duration
	for _, v := range d {
		if v > 0 {
			ok = append(ok, v)
		}
	}
	if len(ok) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ok)
	return len(ok), ok[(len(ok)-1)/2], ok[len(ok)-1]
}

// floodRate is the flooding tenant's successes per second over the last
// span before now.
func floodRate(s *stack, tenantID string, span time.Duration) float64 {
	now := time.Now()
	s.obs.mu.Lock()
	defer s.obs.mu.Unlock()
	n := 0
	for _, f := range s.obs.finishes {
		if f.Tenant == tenantID && f.At.After(now.Add(-span)) {
			n++
		}
	}
	return float64(n) / span.Seconds()
}

// isolation: tenant A queues Backlog small jobs; once the model is at its
// limits (Settle), tenant B of the same tier submits BJobs; each of B's
// jobs is timed from its POST to its success.
func isolation(ctx context.Context, o *options, s *stack) (*latencyResult, error) {
	a, err := s.newTenant(ctx, "flood", "one")
	if err != nil {
		return nil, err
	}
	b, err := s.newTenant(ctx, "small", "one")
	if err != nil {
		return nil, err
	}
	if _, err := s.post(ctx, small.of(a, modelA).times(o.Backlog)); err != nil {
		return nil, err
	}
	return lateArrival(ctx, o, s, a, small.of(b, modelA).times(o.BJobs))
}

// lateArrival lets the flooder's backlog settle, measures its rate and how
// many of its jobs are queued, then posts the late tenant's jobs and times
// each from its POST to its success, waiting at most o.Cap.
func lateArrival(ctx context.Context, o *options, s *stack, flooder *tenant, late []jobSpec) (*latencyResult, error) {
	if err := sleep(ctx, o.Settle); err != nil {
		return nil, err
	}
	r := &latencyResult{Total: len(late), Rate: floodRate(s, flooder.ID, 5*time.Second)}
	var err error
	if r.Ahead, err = s.countQueued(ctx, flooder.ID); err != nil {
		return nil, err
	}
	subs, err := s.post(ctx, late)
	if err != nil {
		return nil, err
	}
	d, _, err := s.waitSucceeded(ctx, subs, o.Cap)
	if err != nil {
		return nil, err
	}
	r.Done, r.P50, r.Max = summarize(d)
	return r, nil
}

// batchIsolation: tenant A's batch of BatchA lines runs; once the model is
// at its limits, tenant B's batch of BatchB lines is timed from its upload
// to its completion.
func batchIsolation(ctx context.Context, o *options, s *stack) (*latencyResult, error) {
	a, err := s.newTenant(ctx, "flood", "one")
	if err != nil {
		return nil, err
	}
	b, err := s.newTenant(ctx, "small", "one")
	if err != nil {
		return nil, err
	}
	ida, err := s.submitBatch(ctx, a, small.of(a, modelA).times(o.BatchA))
	if err != nil {
		return nil, err
	}
	// the batch's lines are queued once it is in progress
	for {
		st, err := s.batch(ctx, a, ida)
		if err != nil {
			return nil, err
		}
		if st.Status != "validating" {
			break
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	if err := sleep(ctx, o.Settle); err != nil {
		return nil, err
	}
	r := &latencyResult{Total: o.BatchB, Rate: floodRate(s, a.ID, 5*time.Second)}
	if r.Ahead, err = s.countQueued(ctx, a.ID); err != nil {
		return nil, err
	}
	start := time.Now()
	idb, err := s.submitBatch(ctx, b, small.of(b, modelA).times(o.BatchB))
	if err != nil {
		return nil, err
	}
	deadline := start.Add(o.Cap)
	for {
		st, err := s.batch(ctx, b, idb)
		if err != nil {
			return nil, err
		}
		r.Done = st.RequestCounts.Completed
		if st.Status == "completed" {
			r.Max = time.Since(start)
			return r, nil
		}
		if time.Now().After(deadline) {
			return r, nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// acrossModels: tenant A floods model A with long jobs (TPM binds at ~1
// job/s, far fewer than the workers); once it is at its limits tenant B
// submits BJobs small jobs for model B, which nothing else uses. B's jobs
// are timed; the limiter's requeues of model A's jobs are counted.
func acrossModels(ctx context.Context, o *options, s *stack) (*latencyResult, error) {
	a, err := s.newTenant(ctx, "flood", "one")
	if err != nil {
		return nil, err
	}
	b, err := s.newTenant(ctx, "other", "one")
	if err != nil {
		return nil, err
	}
	perSec := float64(o.TPM) / 60 / float64(long.Prompt+long.MaxTokens)
	n := int(perSec*(o.Settle+o.Cap).Seconds()) + int(float64(o.TPM)/float64(long.Prompt+long.MaxTokens)) + 2*o.Concurrency
	began := time.Now()
	if _, err := s.post(ctx, long.of(a, modelA).times(n)); err != nil {
		return nil, err
	}
	r, err := lateArrival(ctx, o, s, a, small.of(b, modelB).times(o.BJobs))
	if err != nil {
		return nil, err
	}
	r.Requeued, r.Slept = s.obs.waitsOf(modelA)
	r.Dequeues, r.Elapsed = s.obs.dequeues.Load(), time.Since(began)
	s.obs.mu.Lock()
	r.Succeeded = int64(len(s.obs.finishes))
	s.obs.mu.Unlock()
	return r, nil
}

// window is a span of the measured part of a scenario.
type window struct{ From, To time.Time }

// slidingWindows returns the windows of length w stepped by step over
// from..to; one window from..to when it is shorter than w.
func slidingWindows(from, to time.Time, w, step time.Duration) []window {
	if to.Sub(from) <= w {
		return []window{{from, to}}
	}
	var out []window
	for t := from; !t.Add(w).After(to); t = t.Add(step) {
		out = append(out, window{t, t.Add(w)})
	}
	return out
}

// shareResult is the split of the flooded model's tokens between tenants
// (or priorities) over the measured windows.
type shareResult struct {
	Names []string
	// Weights are the expected proportions; Worst the windows' fractions
	// (one per name) of the window that strays furthest from them, and
	// WorstDev that window's largest relative deviation.
	Weights   []float64
	Mean      []float64
	Worst     []float64
	WorstDev  float64
	Windows   int
	WindowLen time.Duration
	// TPMUsed is the tokens per minute all tenants got over the measured
	// part, as a fraction of the model's TPM.
	TPMUsed float64
	// Inner is, for the scenario of priorities, the largest deviation from
	// an even split between the two tenants of one priority.
	Inner float64
}

// measureShares computes shareResult from s's successes between from and
// to, groups being the tenant ids of each name.
func measureShares(o *options, s *stack, from, to time.Time, names []string, weights []float64, groups [][]string) *shareResult {
	r := &shareResult{Names: names, Weights: weights, Mean: make([]float64, len(names))}
	sumW := 0.0
	for _, w := range weights {
		sumW += w
	}
	in := func(ids []string) func(finish) bool {
		return func(f finish) bool { return slices.Contains(ids, f.Tenant) }
	}
	ws := slidingWindows(from, to, time.Minute, 5*time.Second)
	r.Windows, r.WindowLen = len(ws), ws[0].To.Sub(ws[0].From)
	for _, w := range ws {
		fr := make([]float64, len(names))
		total := 0.0
		for i, g := range groups {
			fr[i] = float64(s.obs.tokens(w.From, w.To, in(g)))
			total += fr[i]
		}
		dev := 0.0
		for i := range fr {
			if total > 0 {
				fr[i] /= total
			}
			r.Mean[i] += fr[i] / float64(len(ws))
			dev = max(dev, math.Abs(fr[i]-weights[i]/sumW)/(weights[i]/sumW))
		}
		if r.Worst == nil || dev > r.WorstDev {
			r.Worst, r.WorstDev = fr, dev
		}
	}
	all := float64(s.obs.tokens(from, to, nil))
	r.TPMUsed = all / to.Sub(from).Minutes() / float64(o.TPM)
	return r
}

// flood is how many jobs of size sp keep the model busy for d, burst
// included, with some to spare.
func flood(o *options, sp jobSpec, d time.Duration) int {
	cost := float64(sp.Prompt + sp.MaxTokens + 10)
	return int(math.Ceil((float64(o.TPM)*d.Minutes()+float64(o.TPM))/cost*1.2)) + o.Concurrency
}

// weightedShare: tenant X (share 1) sends long jobs, tenant Y (share 3)
// medium ones, both more than the model can run, interleaved as they
// arrive; the tokens each gets are compared with 1:3.
func weightedShare(ctx context.Context, o *options, s *stack) (*shareResult, error) {
	x, err := s.newTenant(ctx, "long-prompts", "one")
	if err != nil {
		return nil, err
	}
	y, err := s.newTenant(ctx, "short-prompts", "three")
	if err != nil {
		return nil, err
	}
	d := o.Settle + o.ShareWindow
	if _, err := s.post(ctx, interleave(long.of(x, modelA).times(flood(o, long, d)), medium.of(y, modelA).times(flood(o, medium, d)))); err != nil {
		return nil, err
	}
	from := time.Now().Add(o.Settle)
	if err := sleep(ctx, d); err != nil {
		return nil, err
	}
	return measureShares(o, s, from, from.Add(o.ShareWindow), []string{"share 1, long prompts", "share 3, short prompts"},
		[]float64{1, 3}, [][]string{{x.ID}, {y.ID}}), nil
}

// conserving: n tenants of one tier flood the model with medium jobs; the
// tokens per minute they get together, over the measured part, against
// the model's TPM.
func conserving(n int) func(context.Context, *options, *stack) (*shareResult, error) {
	return func(ctx context.Context, o *options, s *stack) (*shareResult, error) {
		d := o.Settle + o.ConserveWindow
		lists := make([][]jobSpec, n)
		total := flood(o, medium, d)
		for i := range lists {
			t, err := s.newTenant(ctx, fmt.Sprintf("tenant-%d", i), "one")
			if err != nil {
				return nil, err
			}
			lists[i] = medium.of(t, modelA).times(total/n + 1)
		}
		if _, err := s.post(ctx, interleave(lists...)); err != nil {
			return nil, err
		}
		from := time.Now().Add(o.Settle)
		if err := sleep(ctx, d); err != nil {
			return nil, err
		}
		return measureShares(o, s, from, from.Add(o.ConserveWindow), nil, nil, nil), nil
	}
}

// priorityOrder: six tenants of the critical tier, two per priority, send
// medium jobs at critical, default and batch, all at once and more than
// the model can run; the tokens per priority are compared with the queue
// weights 8:4:1, and the two tenants of each priority with each other.
func priorityOrder(ctx context.Context, o *options, s *stack) (*shareResult, error) {
	d := o.Settle + o.ConserveWindow
	per := flood(o, medium, d)/2 + 1
	var lists [][]jobSpec
	groups := make([][]string, len(priorities))
	for i, p := range priorities {
		for k := range 2 {
			t, err := s.newTenant(ctx, fmt.Sprintf("%s-%d", p, k), "premium")
			if err != nil {
				return nil, err
			}
			sp := medium.of(t, modelA)
			sp.Priority = p
			lists = append(lists, sp.times(per))
			groups[i] = append(groups[i], t.ID)
		}
	}
	if _, err := s.post(ctx, interleave(lists...)); err != nil {
		return nil, err
	}
	from := time.Now().Add(o.Settle)
	if err := sleep(ctx, d); err != nil {
		return nil, err
	}
	to := from.Add(o.ConserveWindow)
	r := measureShares(o, s, from, to, priorities, []float64{8, 4, 1}, groups)
	for _, g := range groups {
		a := float64(s.obs.tokens(from, to, func(f finish) bool { return f.Tenant == g[0] }))
		b := float64(s.obs.tokens(from, to, func(f finish) bool { return f.Tenant == g[1] }))
		if a+b > 0 {
			r.Inner = max(r.Inner, math.Abs(a-b)/(a+b))
		}
	}
	return r, nil
}
