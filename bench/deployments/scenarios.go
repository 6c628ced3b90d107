package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// runScenario runs one scenario on a fresh stack and reports it.
func runScenario(ctx context.Context, o *options, name, bin string, logger *slog.Logger) (*report, error) {
	orders := [3]int{0, 0, 0}
	if name == "order" {
		orders = [3]int{1, 2, 2}
	}
	s, err := startStack(ctx, o, orders, bin, logger)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	r := &report{}
	start := time.Now()
	var next atomic.Int64
	switch name {
	case "sum":
		err = s.sum(ctx, r, start, &next)
	case "order":
		err = s.order(ctx, r, &next)
	case "outage":
		err = s.outage(ctx, r, start, &next)
	case "fallback":
		err = s.fallback(ctx, r, start, &next)
	}
	if err != nil {
		return nil, err
	}
	whole := s.smp.between(start, time.Now(), s.deps)
	r.line("whole run: %d of %d calls answered 429 (%.2f%%)", whole.totalLimited, whole.totalRequests, 100*whole.share429())
	if name != "fallback" {
		r.target(whole.share429() < 0.005, "< 0.5%% of calls answered 429 over the whole run: %.2f%%", 100*whole.share429())
	}
	s.smp.finish()
	procsStop(s)
	c, err := s.countJobs(ctx)
	if err != nil {
		return nil, err
	}
	var served []string
	for k, n := range c.byServed {
		served = append(served, fmt.Sprintf("%s: %d", k, n))
	}
	r.line("jobs: %d stored, %d succeeded, %d failed, %d unfinished when the run stopped; by model and deployment: %s",
		c.total, c.succeeded, c.failed, c.unfinished, strings.Join(slices.Sorted(slices.Values(served)), ", "))
	r.target(c.failed == 0, "no job failed: %d", c.failed)
	r.target(len(c.costMismatch) == 0 && c.ledgerRows > 0, "every ledger row (%d) charged its usage at its deployment's price to the micro-dollar: %d differ %v",
		c.ledgerRows, len(c.costMismatch), first(c.costMismatch, 3))
	if name == "fallback" {
		r.target(c.unfinished == 0, "every job finished once the deployments came back: %d unfinished", c.unfinished)
		fb := c.byServed["gpt-4o-mini spare/gpt-4o-mini"]
		r.target(fb > 0, "jobs of gpt-4o finished on its fallback gpt-4o-mini while every deployment was down: %d", fb)
	}
	return r, nil
}

// producing runs the producer until the returned stop is called (once or
// more).
func (s *stack) producing(ctx context.Context, models []string, depth int64, rate float64, next *atomic.Int64) (stop func() error) {
	pctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- s.produce(pctx, models, depth, rate, next) }()
	return sync.OnceValue(func() error {
		cancel()
		return <-errc
	})
}

// sleepUntil waits until t or ctx's end.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// sum: the three deployments together, a backlog of one model.
func (s *stack) sum(ctx context.Context, r *report, start time.Time, next *atomic.Int64) error {
	stop := s.producing(ctx, []string{"gpt-4o"}, 300, 0, next)
	from := start.Add(s.o.Warmup)
	to := from.Add(s.o.Measure)
	if err := sleepUntil(ctx, to); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	u := s.smp.between(from, to, s.deps)
	r.lines = append(r.lines, u.lines(s.deps)...)
	r.target(u.total() >= 0.95, ">= 95%% of the sum of the deployments' limits used: %.1f%%", 100*u.total())
	return nil
}

// order: org-a first. At 70% of what org-a takes alone the others get next
// to nothing; with a backlog, org-a stays at its limit.
func (s *stack) order(ctx context.Context, r *report, next *atomic.Int64) error {
	// org-a's calls of about 100 tokens: 600 RPM and 60,000 TPM bind at
	// once, 10 a second.
	const rate = 7.0
	began := time.Now()
	stop := s.producing(ctx, []string{"gpt-4o"}, 0, rate, next)
	from, to := began.Add(10*time.Second), began.Add(10*time.Second+s.o.Measure/2)
	if err := sleepUntil(ctx, to); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	u := s.smp.between(from, to, s.deps)
	r.line("at %.0f jobs a second (70%% of org-a's limits):", rate)
	r.lines = append(r.lines, u.lines(s.deps)...)
	others := u.admitted[1] + u.admitted[2]
	share := float64(others) / max(u.totalAdmitted, 1)
	r.target(share <= 0.01, "at a load org-a can take, the others get <= 1%% of the calls: %.2f%% (%d)", 100*share, others)

	began = time.Now()
	stop = s.producing(ctx, []string{"gpt-4o"}, 300, 0, next)
	from, to = began.Add(s.o.Warmup), began.Add(s.o.Warmup+s.o.Measure)
	if err := sleepUntil(ctx, to); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	u = s.smp.between(from, to, s.deps)
	r.line("with a backlog:")
	r.lines = append(r.lines, u.lines(s.deps)...)
	r.target(u.used[0] >= 0.95, "with a backlog, org-a (order 1) at >= 95%% of its limits: %.1f%%", 100*u.used[0])
	r.target(u.total() >= 0.95, "with a backlog, >= 95%% of the sum of the limits used: %.1f%%", 100*u.total())
	return nil
}

// outage: org-a refuses connections for Outage mid-run.
func (s *stack) outage(ctx context.Context, r *report, start time.Time, next *atomic.Int64) error {
	stop := s.producing(ctx, []string{"gpt-4o"}, 300, 0, next)
	defer func() { _ = stop() }()
	a := s.deps[0]
	down := start.Add(s.o.Warmup + 30*time.Second)
	if err := sleepUntil(ctx, down); err != nil {
		return err
	}
	down = time.Now()
	a.px.setDown(true)
	up := down.Add(s.o.Outage)
	if err := sleepUntil(ctx, up); err != nil {
		return err
	}
	a.px.setDown(false)
	up = time.Now()
	end := up.Add(45 * time.Second)
	if err := sleepUntil(ctx, end); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}

	before := s.smp.between(start.Add(s.o.Warmup), down, s.deps)
	r.line("before the outage:")
	r.lines = append(r.lines, before.lines(s.deps)...)
	during := s.smp.between(down.Add(2*time.Second), up, s.deps)
	r.line("while org-a is down (from 2 s after it went down):")
	r.lines = append(r.lines, during.lines(s.deps)...)
	// Calls that reached org-a after it failed: those within its first
	// second are the ones under way or granted before the pause; after it,
	// only probes, one at a time.
	attempts := a.px.attemptsSince(down)
	var late []time.Time
	for _, t := range attempts {
		if t.After(down.Add(time.Second)) {
			late = append(late, t)
		}
	}
	minGap := time.Duration(0)
	for i := 1; i < len(late); i++ {
		if g := late[i].Sub(late[i-1]); minGap == 0 || g < minGap {
			minGap = g
		}
	}
	r.line("org-a down for %v: %d connections in all, %d in its first second, %d later (probes), least gap between probes %v",
		up.Sub(down).Round(time.Second), len(attempts), len(attempts)-len(late), len(late), minGap.Round(time.Millisecond))
	r.target(len(late) <= int(s.o.Outage/time.Second)+1 && (len(late) < 2 || minGap >= 500*time.Millisecond),
		"no call to org-a more than 1 s after it failed, bar one probe at a time (about one a second): %d probes, least gap %v",
		len(late), minGap.Round(time.Millisecond))
	r.target(during.used[1] >= 0.95 && during.used[2] >= 0.90,
		"while org-a is down, org-b and azure-east at their limits (>= 95%%, >= 90%% for Azure's fixed 10 s windows over %v): %.1f%%, %.1f%%",
		during.window.Round(time.Second), 100*during.used[1], 100*during.used[2])
	// Back at its limit: the first 5 s after recovery in which org-a
	// admits 95% of what its limits allow in 5 s.
	back := time.Duration(-1)
	perCall := float64(before.tokens[0]) / float64(max(before.admitted[0], 1))
	capacity := min(float64(a.rpm), float64(a.tpm)/perCall) / 60 * 5
	for t := up; t.Before(end.Add(-5 * time.Second)); t = t.Add(250 * time.Millisecond) {
		if float64(s.smp.between(t, t.Add(5*time.Second), s.deps).admitted[0]) >= 0.95*capacity {
			back = t.Add(5 * time.Second).Sub(up)
			break
		}
	}
	r.target(back >= 0 && back <= 10*time.Second, "org-a back at its limit within 10 s of recovery (a 5 s window at >= 95%%): after %v", back.Round(250*time.Millisecond))
	return nil
}

// fallback: every deployment down for Outage; gpt-4o has a fallback,
// gpt-4o-solo (on the same deployments) has none.
func (s *stack) fallback(ctx context.Context, r *report, start time.Time, next *atomic.Int64) error {
	stop := s.producing(ctx, []string{"gpt-4o", "gpt-4o-solo"}, 150, 0, next)
	defer func() { _ = stop() }()
	down := start.Add(s.o.Warmup)
	if err := sleepUntil(ctx, down); err != nil {
		return err
	}
	for _, d := range s.deps {
		d.px.setDown(true)
	}
	spareBefore := s.spare.Stats().Admitted
	if err := sleepUntil(ctx, time.Now().Add(s.o.Outage)); err != nil {
		return err
	}
	for _, d := range s.deps {
		d.px.setDown(false)
	}
	spareCalls := s.spare.Stats().Admitted - spareBefore
	if err := sleepUntil(ctx, time.Now().Add(20*time.Second)); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	// Every job stored finishes: those of gpt-4o-solo waited out the
	// outage.
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		c, err := s.countJobs(ctx)
		if err != nil {
			return err
		}
		if c.unfinished == 0 {
			break
		}
		if err := sleepUntil(ctx, time.Now().Add(time.Second)); err != nil {
			return err
		}
	}
	r.line("every deployment down for %v, then back: the fallback answered %d calls meanwhile (%.1f a second)",
		s.o.Outage, spareCalls, float64(spareCalls)/s.o.Outage.Seconds())
	return nil
}

// procsStop stops the workers (their jobs under way go back to the queue).
func procsStop(s *stack) {
	for _, p := range s.procs {
		p.Stop()
	}
	s.procs = nil
}

func first(xs []string, n int) []string { return xs[:min(n, len(xs))] }
