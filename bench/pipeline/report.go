package main

import (
	"fmt"
	"io"
	"runtime"
	"text/tabwriter"
	"time"
)

// target is the goal: llmq end to end at least half as fast as
// bare asynq.
const target = 0.5

type row struct {
	name string
	m    *measurement
}

// report prints the run's tables.
func report(w io.Writer, o *options, bare, e2e, api *measurement) {
	fmt.Fprintf(w, "pipeline: %d jobs (after %d warm-up), %d producers, concurrency %d in %d server(s), GOMAXPROCS %d\n\n",
		o.Jobs, o.Warmup, o.Producers, o.Concurrency, o.Servers, runtime.GOMAXPROCS(0))
	pipelines := []row{{"bare asynq (enqueue + no-op handler)", bare}, {"llmq end to end (POST to succeeded)", e2e}}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tjobs/s\telapsed\thandler time/job\thandlers in flight\tRedis round trips/job\tallocs/job (process)\t")
	for _, r := range pipelines {
		m := r.m
		fmt.Fprintf(tw, "%s\t%.0f\t%v\t%v\t%.1f\t%.1f\t%.0f\t\n", r.name, m.rate(), m.elapsed.Round(time.Millisecond),
			short(m.busy/time.Duration(m.jobs)), m.busy.Seconds()/m.elapsed.Seconds(),
			m.perJob(float64(m.redisRT)), m.perJob(float64(m.mallocs)))
	}
	_ = tw.Flush()
	ratio := e2e.rate() / bare.rate()
	verdict := "met"
	if ratio < target {
		verdict = "missed"
	}
	fmt.Fprintf(w, "\nratio llmq/bare: %.2f (target >= %.2f: %s)\n\n", ratio, target, verdict)

	// Whole-server times include anyone else's work on those servers.
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CPU time per job\tthis process\tRedis server\tPostgres server\t")
	for _, r := range append(pipelines, row{"POSTs alone (no workers)", api}) {
		c := r.m.cpu
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", r.name, cpuPerJob(c.self, r.m.jobs), cpuPerJob(c.redis, r.m.jobs), cpuPerJob(c.postgres, r.m.jobs))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "POST /v1/jobs\tp50\tp90\tp99\tmax\tPOSTs/s\t")
	for _, r := range []row{{"with workers running", e2e}, {"API alone (no workers)", api}} {
		s := r.m.post.sorted()
		fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%v\t%.0f\t\n", r.name, short(s.percentile(0.50)), short(s.percentile(0.90)),
			short(s.percentile(0.99)), short(s.percentile(1)), float64(len(s))/r.m.postSpan.Seconds())
	}
	_ = tw.Flush()
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
