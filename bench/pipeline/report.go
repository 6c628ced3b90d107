package main

import (
	"fmt"
	"io"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/bench/internal/cost"
)

// Targets: llmq end to end at least 0.8 times the hand-wired stack's rate
// in every round; at light load POST /v1/jobs within these latencies.
const (
	minRatio   = 0.8
	lightP50   = 3 * time.Millisecond
	lightP99   = 10 * time.Millisecond
	targetNote = "llmq/hand-wired >= 0.80 in every round"
)

// report prints the run's tables.
func report(w io.Writer, o *options, rounds []round, light [2]*measurement) {
	fmt.Fprintf(w, "pipeline: %d jobs a round (after %d warm-up), %d rounds, %d producers and as many pollers, concurrency %d in %d server(s), GOMAXPROCS %d\n\n",
		o.Jobs, o.Warmup, len(rounds), o.Producers, o.Concurrency, o.Servers, runtime.GOMAXPROCS(0))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tllmq jobs/s\thand-wired jobs/s\tllmq/hand-wired\tbare asynq jobs/s\tllmq/bare\t")
	met := true
	for i, r := range rounds {
		ratio := r.llmq.rate() / r.hw.rate()
		met = met && ratio >= minRatio
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.2f\t%.0f\t%.2f\t\n", i+1, r.llmq.rate(), r.hw.rate(), ratio, r.bare.rate(), r.llmq.rate()/r.bare.rate())
	}
	_ = tw.Flush()
	verdict := "met"
	if !met {
		verdict = "missed"
	}
	fmt.Fprintf(w, "\ntarget %s: %s\n\n", targetNote, verdict)

	// Per job, over every round. Whole-server times include anyone else's
	// work on those servers.
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "per job (all rounds)\tGETs\tRedis round trips\tallocs (process)\tCPU this process\tCPU Redis\tCPU Postgres\t")
	for _, name := range []string{"llmq", "hand-wired", "bare asynq"} {
		var sum measurement
		sum.cpu = cost.CPU{}
		for _, r := range rounds {
			m := map[string]*measurement{"llmq": r.llmq, "hand-wired": r.hw, "bare asynq": r.bare}[name]
			sum.jobs += m.jobs
			sum.gets += m.gets
			sum.redisRT += m.redisRT
			sum.mallocs += m.mallocs
			sum.cpu = sum.cpu.Add(m.cpu)
		}
		c := sum.cpu
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.0f\t%s\t%s\t%s\t\n", name, sum.perJob(float64(sum.gets)), sum.perJob(float64(sum.redisRT)),
			sum.perJob(float64(sum.mallocs)), cpuPerJob(c.Self, sum.jobs), cpuPerJob(c.Redis, sum.jobs), cpuPerJob(c.Postgres, sum.jobs))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "POST /v1/jobs\tp50\tp90\tp99\tmax\tPOSTs/s\t")
	for i, r := range rounds {
		for _, x := range []row{{"llmq", r.llmq}, {"hand-wired", r.hw}} {
			printLatency(tw, fmt.Sprintf("%s, round %d (flat out)", x.name, i+1), x.m)
		}
	}
	if light[0] != nil {
		printLatency(tw, fmt.Sprintf("llmq, light load (%.0f/s)", o.LightRate), light[0])
		printLatency(tw, fmt.Sprintf("hand-wired, light load (%.0f/s)", o.LightRate), light[1])
	}
	_ = tw.Flush()
	if light[0] != nil {
		s := light[0].post.sorted()
		p50, p99 := s.percentile(0.50), s.percentile(0.99)
		verdict := "met"
		if p50 > lightP50 || p99 > lightP99 {
			verdict = "missed"
		}
		fmt.Fprintf(w, "\nllmq at light load: p50 %v (target <= %v), p99 %v (target <= %v): %s\n", short(p50), lightP50, short(p99), lightP99, verdict)
	}
}

type row struct {
	name string
	m    *measurement
}

func printLatency(tw io.Writer, name string, m *measurement) {
	s := m.post.sorted()
	fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%v\t%.0f\t\n", name, short(s.percentile(0.50)), short(s.percentile(0.90)),
		short(s.percentile(0.99)), short(s.percentile(1)), float64(len(s))/m.postSpan.Seconds())
}

// short rounds d to three or so significant digits for the tables.
func short(d time.Duration) time.Duration {
	switch {
	case d < time.Microsecond:
		return d
	case d < time.Millisecond:
		return d.Round(time.Microsecond)
	case d < 10*time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d < time.Second:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

func cpuPerJob(d time.Duration, jobs int) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.3fms", float64(d)/float64(jobs)/float64(time.Millisecond))
}
