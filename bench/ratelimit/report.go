package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// The targets for llmq: TPM used and 429 share in the steady state
// with the policy at the provider's limits, and after the first minute with
// the policy at twice them.
const (
	targetUsed, targetLimited     = 0.95, 0.005
	targetUsed2x, targetLimited2x = 0.90, 0.02
)

// timeline prints a scenario's intervals: what the provider kept and
// refused, and its TPM bucket replayed from the admission log.
func timeline(w io.Writer, o *options, r *result) {
	var edges []time.Duration
	for t := time.Duration(0); t < r.duration; t += o.Interval {
		edges = append(edges, t)
	}
	edges = append(edges, r.duration)
	var bins []bucketBin
	if r.dropped == 0 && len(r.samples) > 0 {
		bins = replayTPM(r.log, o.TPM, r.start, edges)
	}
	ahead := aheadOf(o, r, edges)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "  interval\tTPM used\tcalls\t429s\t429 share\tjobs done\tprovider bucket: mean free\tfull for\tlost (full)\t")
	if ahead != nil {
		fmt.Fprint(tw, "llmq bucket - provider's\t")
	}
	fmt.Fprintln(tw)
	for i := 0; i+1 < len(edges); i++ {
		win := r.between(edges[i], edges[i+1])
		free, full, lost := "-", "-", "-"
		if bins != nil {
			b := bins[i]
			free = fmt.Sprintf("%.0f", b.levelSeconds/(edges[i+1]-edges[i]).Seconds())
			full = b.full.Round(10 * time.Millisecond).String()
			lost = fmt.Sprintf("%.0f", b.lost)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t", span(win.from, win.to), pct(win.usedShare(o.TPM)),
			win.calls, win.limited, pct2(win.limitedShare()), win.completions, free, full, lost)
		if ahead != nil {
			fmt.Fprintf(tw, "%s\t", ahead[i])
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	whole := r.between(0, r.duration)
	fmt.Fprintf(w, "  %d jobs completed, %d failed; %d jobs received a 429, at most %d each", whole.completions, r.failed, r.with429, r.most429)
	if r.dropped > 0 {
		fmt.Fprintf(w, "; the admission log dropped %d entries (no bucket replay)", r.dropped)
	}
	fmt.Fprintln(w)
	for _, n := range r.notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	fmt.Fprintln(w)
}

// aheadOf returns, per interval of edges, how many tokens llmq's own bucket
// held beyond the provider's on average ("+225"): while positive, llmq
// admits calls the provider refuses. nil when not known (baselines, or a
// log that dropped entries).
func aheadOf(o *options, r *result, edges []time.Duration) []string {
	if r.dropped != 0 || len(r.llmqLevels) == 0 {
		return nil
	}
	times := make([]time.Duration, len(r.llmqLevels))
	for i, l := range r.llmqLevels {
		times[i] = l.at
	}
	prov := tpmLevels(r.log, o.TPM, r.start, times)
	sum, n := make([]float64, len(edges)-1), make([]int, len(edges)-1)
	for i, l := range r.llmqLevels {
		b, found := slices.BinarySearch(edges, l.at)
		if !found {
			b--
		}
		if b >= 0 && b < len(sum) {
			sum[b] += l.level - prov[i]
			n[b]++
		}
	}
	out := make([]string, len(sum))
	for b := range sum {
		out[b] = "-"
		if n[b] > 0 {
			out[b] = fmt.Sprintf("%+.0f", sum[b]/float64(n[b]))
		}
	}
	return out
}

// report prints the scenarios side by side and the verdicts on the targets.
func report(w io.Writer, o *options, results []*result) {
	fmt.Fprintf(w, "TPM used: tokens the provider's TPM bucket kept (prompt + completion of admitted calls: charged prompt + max_tokens at admission, unused part refunded at completion), as a share of %d per minute; steady state = after %v.\n\n", o.TPM, o.Warmup)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\twindow\tTPM used\t429 share\tcalls/s\tjobs/s\tjobs completed\tunused, provider bucket full\tllmq bucket - provider's\t")
	for _, r := range results {
		first, steady := r.between(0, o.Warmup), r.between(o.Warmup, r.duration)
		edges := []time.Duration{0, o.Warmup, r.duration}
		var bins []bucketBin
		if r.dropped == 0 {
			bins = replayTPM(r.log, o.TPM, r.start, edges)
		}
		ahead := aheadOf(o, r, edges)
		if ahead == nil {
			ahead = []string{"-", "-"}
		}
		for i, win := range []window{first, steady} {
			name := scenarioTitle(r.scenario)
			if i > 0 {
				name = ""
			}
			lost := "-"
			if bins != nil {
				lost = pct(bins[i].lost / (float64(o.TPM) * (win.to - win.from).Minutes()))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.2f\t%d\t%s\t%s\t\n", name, span(win.from, win.to), pct(win.usedShare(o.TPM)),
				pct2(win.limitedShare()), float64(win.calls)/win.seconds(), float64(win.completions)/win.seconds(), win.completions, lost, ahead[i])
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, r := range results {
		steady := r.between(o.Warmup, r.duration)
		switch r.scenario {
		case scLLMQ:
			fmt.Fprintf(w, "%s, steady state: TPM used %s (target >= %s: %s), 429 share %s (target < %s: %s)\n",
				scenarioTitle(r.scenario), pct(steady.usedShare(o.TPM)), pct(targetUsed), verdict(steady.usedShare(o.TPM) >= targetUsed),
				pct2(steady.limitedShare()), pct2(targetLimited), verdict(steady.limitedShare() < targetLimited))
		case scLLMQ2x:
			fmt.Fprintf(w, "%s, after the first %v: TPM used %s (target >= %s: %s), 429 share %s (target < %s: %s)\n",
				scenarioTitle(r.scenario), o.Warmup, pct(steady.usedShare(o.TPM)), pct(targetUsed2x), verdict(steady.usedShare(o.TPM) >= targetUsed2x),
				pct2(steady.limitedShare()), pct2(targetLimited2x), verdict(steady.limitedShare() < targetLimited2x))
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func span(from, to time.Duration) string {
	return fmt.Sprintf("%.0f-%.0fs", from.Seconds(), to.Seconds())
}

func pct(f float64) string  { return fmt.Sprintf("%.1f%%", 100*f) }
func pct2(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) }
