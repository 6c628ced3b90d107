package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
)

// timeline prints a scenario's intervals: what the provider kept and
// refused, and where the admission log holds every change of the
// provider's TPM bucket, that bucket replayed and set beside llmq's.
func timeline(w io.Writer, o *options, r *result) {
	sc := r.scenario
	var edges []time.Duration
	for t := time.Duration(0); t < r.duration; t += o.Interval {
		edges = append(edges, t)
	}
	edges = append(edges, r.duration)
	replay := sc.replayable() && r.dropped == 0 && len(r.samples) > 0
	var bins []bucketBin
	var ahead []string
	if replay {
		bins = replayTPM(r.log, o.TPM, r.start, edges)
		ahead = aheadOf(o, r, edges)
	}
	external := sc.external(o.TPM) > 0
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []string{"  interval", "TPM used"}
	if external {
		cols = append(cols, "by llmq", "by the external app")
	}
	cols = append(cols, "calls", "429s", "429 share", "jobs done")
	if bins != nil {
		cols = append(cols, "provider bucket: mean free", "full for", "lost (full)")
	}
	if ahead != nil {
		cols = append(cols, "llmq bucket - provider's")
	}
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	for i := 0; i+1 < len(edges); i++ {
		win := r.between(edges[i], edges[i+1])
		row := []string{"  " + span(win.from, win.to), pct(win.accountShare(o.TPM))}
		if external {
			row = append(row, pct(win.usedShare(o.TPM)), pct(win.externalShare(o.TPM)))
		}
		row = append(row, fmt.Sprint(win.calls), fmt.Sprint(win.limited), pct2(win.limitedShare()), fmt.Sprint(win.completions))
		if bins != nil {
			b := bins[i]
			row = append(row, fmt.Sprintf("%.0f", b.levelSeconds/(edges[i+1]-edges[i]).Seconds()),
				b.full.Round(10*time.Millisecond).String(), fmt.Sprintf("%.0f", b.lost))
		}
		if ahead != nil {
			row = append(row, ahead[i])
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	_ = tw.Flush()
	whole := r.between(0, r.duration)
	what := "jobs"
	if sc.caller != callerLLMQ {
		what = "requests"
	}
	fmt.Fprintf(w, "  %d %s completed", whole.completions, what)
	if sc.responses > 0 {
		fmt.Fprintf(w, " (%d of them to %s)", r.responsesDone, llm.EndpointResponses)
	}
	fmt.Fprintf(w, ", %d failed; %d %s received a 429, at most %d each\n", r.failed, r.with429, what, r.most429)
	switch {
	case !sc.replayable():
		fmt.Fprintln(w, "  no bucket replay: the external application's calls are not in the simulator's admission log")
	case r.dropped > 0:
		fmt.Fprintf(w, "  no bucket replay: the admission log dropped %d entries\n", r.dropped)
	case len(r.samples) > 0:
		steadyEdges := []time.Duration{0, o.Warmup, r.duration}
		sb := replayTPM(r.log, o.TPM, r.start, steadyEdges)
		steady := r.between(o.Warmup, r.duration)
		fmt.Fprintf(w, "  steady state %s: the provider's bucket was full for %v, losing %s of its TPM",
			span(steady.from, steady.to), sb[1].full.Round(10*time.Millisecond), pct(sb[1].lost/(float64(o.TPM)*(r.duration-o.Warmup).Minutes())))
		if a := aheadOf(o, r, steadyEdges); a != nil {
			fmt.Fprintf(w, "; llmq's bucket held %s tokens beside the provider's on average", a[1])
		}
		fmt.Fprintln(w)
	}
	if r.learned != nil {
		fmt.Fprintf(w, "  llmq learned: %s\n", r.learned.describe())
	}
	for _, n := range r.notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	fmt.Fprintln(w)
}

// aheadOf returns, per interval of edges, how many tokens llmq's own bucket
// held beyond the provider's on average ("+225"): while positive, llmq
// admits calls the provider refuses. nil when not known (baselines, a log
// that dropped entries, a provider bucket the log cannot replay).
func aheadOf(o *options, r *result, edges []time.Duration) []string {
	if r.dropped != 0 || len(r.llmqLevels) == 0 || !r.scenario.replayable() {
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

// describe says what the scope learned: per bucket its limit (the policy's
// or the provider's, whichever is lower), the factor of it that unpredicted
// 429s left, the drain others cause, its burst and pace, and the refunds
// seen; the prompt calibration.
func (l *learned) describe() string {
	var parts []string
	bucket := func(name string, policy int64, b *limiter.BucketLearning) {
		if b == nil {
			return
		}
		s := fmt.Sprintf("%s limit %d", name, b.Limit)
		if b.Limit != policy {
			s += fmt.Sprintf(" (policy %d)", policy)
		}
		s += fmt.Sprintf(", limit factor %.2f, drain %.2f", b.Factor, b.Drain)
		if b.Burst >= 0 {
			s += fmt.Sprintf(", burst %v, pace %.2f", b.BurstWindow.Round(time.Millisecond), b.PaceFactor)
		}
		if name == "tpm" {
			if b.Refund < 0 {
				s += ", refund not known yet"
			} else {
				s += fmt.Sprintf(", refund %.2f", b.Refund)
			}
		}
		parts = append(parts, s)
	}
	bucket("tpm", l.policy.TPM, l.tpm)
	bucket("rpm", l.policy.RPM, l.rpm)
	parts = append(parts, fmt.Sprintf("prompt calibration %.2f (%d calls)", l.calibration.Factor, l.calibration.Samples))
	if l.distrusted {
		parts = append(parts, "the provider's counts distrusted after repeated unpredicted 429s")
	}
	return strings.Join(parts, "; ")
}

// report prints the scenarios side by side, each against its target, and
// what llmq learned in each.
func report(w io.Writer, o *options, results []*result) {
	first := firstWindow(o)
	fmt.Fprintf(w, "TPM used: the tokens the provider's TPM bucket kept, net of what it gave back (prompt + max_tokens as it counts them when it keeps max_tokens charged, prompt + completion when it refunds), with the external application's where the account is shared, as a share of %d per minute. 429 share: of the calls llmq (or the baseline) sent. Steady state = %s.\n\n",
		o.TPM, span(o.Warmup, o.Duration))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tprovider\tpolicy\twindow\tTPM used\tby llmq\tby the external app\t429 share\t429s\tcalls/s\tjobs/s\ttarget\tresult\t")
	var met, targets int
	var missed []string
	for _, r := range results {
		sc := r.scenario
		// the first minute, the steady state, the whole run
		whole := r.between(0, r.duration)
		windows := []window{r.between(o.Warmup, r.duration), whole}
		if first > 0 {
			windows = append([]window{r.between(0, first)}, windows...)
		}
		for i, win := range windows {
			steady := i == len(windows)-2
			name, provider, policy := sc.label(), sc.provider, sc.policyName()
			if i > 0 {
				name, provider, policy = "", "", ""
			}
			by, ext := pct(win.usedShare(o.TPM)), "-"
			if sc.caller != callerLLMQ {
				by = "-"
			}
			if sc.external(o.TPM) > 0 {
				ext = pct(win.externalShare(o.TPM))
			}
			tgt, res := "", ""
			if steady && !sc.target.isZero() {
				tgt = sc.target.String()
				ok := sc.target.met(o.TPM, win, whole)
				res = verdict(ok)
				targets++
				if ok {
					met++
				} else {
					missed = append(missed, sc.label())
				}
			}
			used := pct(win.accountShare(o.TPM))
			if i == len(windows)-1 {
				by, ext, used = "", "", "" // the whole run's share of the TPM means little: its start
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%.2f\t%.2f\t%s\t%s\t\n", name, provider, policy, span(win.from, win.to),
				used, by, ext, pct2(win.limitedShare()), win.limited, float64(win.calls)/win.seconds(),
				float64(win.completions)/win.seconds(), tgt, res)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, r := range results {
		if r.learned != nil {
			fmt.Fprintf(w, "%s: llmq learned: %s\n", r.scenario.label(), r.learned.describe())
		}
	}
	if targets > 0 {
		fmt.Fprintf(w, "\nllmq's targets (TPM used in the steady state, 429s over the whole run): %d of %d met", met, targets)
		if len(missed) > 0 {
			fmt.Fprintf(w, "; MISSED: %s", strings.Join(missed, ", "))
		}
		fmt.Fprintln(w)
	}
}

// String is the target as the table shows it.
func (t target) String() string {
	what := "TPM"
	if t.account {
		what = "account TPM"
	}
	return fmt.Sprintf("%s >= %s, 429 < %s of the run", what, pct0(t.used), pct(t.limited))
}

// met reports whether the steady state steady and the whole run whole reach
// the target.
func (t target) met(tpm int64, steady, whole window) bool {
	used := steady.usedShare(tpm)
	if t.account {
		used = steady.accountShare(tpm)
	}
	return used >= t.used && whole.limitedShare() < t.limited
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

func pct0(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }
func pct(f float64) string  { return fmt.Sprintf("%.1f%%", 100*f) }
func pct2(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) }
