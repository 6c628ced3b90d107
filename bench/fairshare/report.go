package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// row is one line of the table: a target, the fair stack's figure, the
// baseline's, and whether the fair stack met the target.
type row struct {
	Target, Fair, Baseline string
	Met                    bool
	// Diagnostic rows have no target of the issue's: they explain another.
	Diagnostic bool
}

func report(w io.Writer, rows []row) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | fair share | baseline (single queue) | met |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, r := range rows {
		met := "no"
		switch {
		case r.Diagnostic:
			met = "(diagnostic)"
		case r.Met:
			met = "yes"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", r.Target, r.Fair, r.Baseline, met)
	}
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// latency describes how long the measured jobs took: every one done, or
// how many were done within the cap and what the backlog ahead of them
// would take at the flood's rate.
func latency(o *options, r *latencyResult) string {
	if r.Done == r.Total && r.Max > 0 {
		if r.P50 > 0 {
			return fmt.Sprintf("max %s, p50 %s", secs(r.Max), secs(r.P50))
		}
		return secs(r.Max)
	}
	s := fmt.Sprintf("not done after %s (%d of %d)", secs(o.Cap), r.Done, r.Total)
	if r.Rate > 0 {
		s += fmt.Sprintf("; %d of A's jobs queued ahead at %.1f jobs/s ≈ %s", r.Ahead, r.Rate, secs(time.Duration(float64(r.Ahead)/r.Rate*float64(time.Second))))
	}
	return s
}

func within(r *latencyResult, limit time.Duration) bool {
	return r.Done == r.Total && r.Max > 0 && r.Max <= limit
}

func isolationRows(o *options, f, b *latencyResult) []row {
	return []row{{
		Target: fmt.Sprintf("isolation: A has %d jobs queued; each of B's %d jobs (same tier) succeeds within 15 s of its POST", o.Backlog, o.BJobs),
		Fair:   latency(o, f), Baseline: latency(o, b), Met: within(f, 15*time.Second),
	}}
}

func batchRows(o *options, f, b *latencyResult) []row {
	return []row{{
		Target: fmt.Sprintf("isolation, batches: A's %d-line batch running; B's %d-line batch completes within 30 s of its upload", o.BatchA, o.BatchB),
		Fair:   latency(o, f), Baseline: latency(o, b), Met: within(f, 30*time.Second),
	}}
}

// split shows a share result: the mean fractions over the windows, and the
// window furthest from the weights.
func split(r *shareResult) string {
	pct := func(fr []float64) string {
		parts := make([]string, len(fr))
		for i, v := range fr {
			parts[i] = fmt.Sprintf("%.1f %%", 100*v)
		}
		return strings.Join(parts, " / ")
	}
	return fmt.Sprintf("%s (worst of %d windows of %.0f s: %s, %.1f %% off)", pct(r.Mean), r.Windows, r.WindowLen.Seconds(), pct(r.Worst), 100*r.WorstDev)
}

func shareRows(f, b *shareResult) []row {
	return []row{{
		Target: "weighted share: tokens of share 1 (long prompts) / share 3 (short prompts), in every minute within 10 % of 25 / 75 %",
		Fair:   split(f), Baseline: split(b), Met: f.WorstDev <= 0.10,
	}, {
		Target: "weighted share: TPM used by the two together (≥ 95 %)",
		Fair:   fmt.Sprintf("%.1f %%", 100*f.TPMUsed), Baseline: fmt.Sprintf("%.1f %%", 100*b.TPMUsed), Met: f.TPMUsed >= 0.95,
	}}
}

func conservingRow(n int, f, b *shareResult) row {
	who := "one tenant"
	if n > 1 {
		who = fmt.Sprintf("%d tenants", n)
	}
	return row{
		Target: fmt.Sprintf("work-conserving: TPM used, %s flooding (≥ 95 %%)", who),
		Fair:   fmt.Sprintf("%.1f %%", 100*f.TPMUsed), Baseline: fmt.Sprintf("%.1f %%", 100*b.TPMUsed), Met: f.TPMUsed >= 0.95,
	}
}

func modelRows(o *options, f, b *latencyResult) []row {
	wasted := func(r *latencyResult) string {
		return fmt.Sprintf("%d (%d dequeues for %d successes)", r.Requeued, r.Dequeues, r.Succeeded)
	}
	asleep := func(r *latencyResult) string {
		return fmt.Sprintf("%.1f of %d", r.Slept.Seconds()/r.Elapsed.Seconds(), o.Concurrency)
	}
	return []row{{
		Target: fmt.Sprintf("across models: model A at its limits (TPM); each of B's %d jobs for model B succeeds within 15 s of its POST", o.BJobs),
		Fair:   latency(o, f), Baseline: latency(o, b), Met: within(f, 15*time.Second),
	}, {
		Target: "across models: wasted dequeues of model A's jobs (dequeued, refused by the limiter for longer than a worker sleeps, put back): 0",
		Fair:   wasted(f), Baseline: wasted(b), Met: f.Requeued == 0,
	}, {
		Target: "across models: workers asleep on model A's limiter, on average (waits that ended; the workers model A's jobs do not hold run model B's)",
		Fair:   asleep(f), Baseline: asleep(b), Diagnostic: true,
	}}
}

func priorityRows(f, b *shareResult) []row {
	ordered := func(r *shareResult) bool { return r.Mean[0] > r.Mean[1] && r.Mean[1] > r.Mean[2] }
	return []row{{
		Target: "priorities: tokens of critical / default / batch, all flooding: in that order, every minute within 10 % of 8:4:1 (61.5 / 30.8 / 7.7 %)",
		Fair:   split(f), Baseline: split(b), Met: ordered(f) && f.WorstDev <= 0.10,
	}, {
		Target: "priorities: two tenants of one priority split its tokens evenly (largest deviation within 10 %)",
		Fair:   fmt.Sprintf("%.1f %% off", 100*f.Inner), Baseline: fmt.Sprintf("%.1f %% off", 100*b.Inner), Met: f.Inner <= 0.10,
	}}
}
