// Command offload measures a batch run on the provider's Batch API
// (batch_offload: auto) against the same batch run through llmq's own path,
// in one run, each on a fresh llmq in this process (API, scheduler, batch
// sweeper, offloader, a worker) over a simulated provider of its own whose
// synchronous path has a model's usual limits and whose Batch API answers a
// few hundred lines a second:
//
//  1. normal: tenant A, of a tier that does not offload, uploads the batch
//     (POST /v1/files, POST /v1/batches) and llmq's workers run it at the
//     model's limits (with -sync-normal, tenant C sends for its first part
//     too: a contrast, reported and not checked);
//  2. offloaded: tenant B, of a tier with batch_offload: auto, uploads the
//     same batch; the offloader runs it on the provider's Batch API while
//     tenant C sends synchronous chat completions (POST
//     /v1/chat/completions) at the model's full rate until it completes;
//  3. offloaded, quiet (-quiet): the same as 2 without C, for what a line
//     costs this process, Redis and Postgres.
//
// Each run is checked, and the program fails when a check does: every line
// in the output file once under its custom_id, none lost, none run twice
// (the provider's count of every custom_id), each ledger row the line's
// usage at the price of the path that ran it, the budget's spend the
// ledger's; the offloaded spend exactly half the normal one, to the
// micro-dollar; C answered with no 429 (from llmq or the provider) at
// 95 % of its rate or more. The numbers and the command are in
// docs/BENCHMARKS.md.
//
//	go -C bench run ./offload -lines 10000
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/checks"
	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
)

func main() { benchenv.Main("offload", run) }

// options are the command's flags.
type options struct {
	Lines       int
	RPM, TPM    int64
	SyncRPM     int
	BatchLPS    float64
	Completion  float64
	Latency     time.Duration
	Jitter      time.Duration
	Poll        time.Duration
	Quiet       bool
	SyncNormal  time.Duration
	Concurrency int
	Timeout     time.Duration
	benchenv.Backends
}

func parseOptions(args []string, out io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("offload", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.IntVar(&o.Lines, "lines", 10000, "lines of the batch")
	fs.Int64Var(&o.RPM, "rpm", 3000, "the model's requests per minute (the simulator's synchronous path and the policy)")
	fs.Int64Var(&o.TPM, "tpm", 300000, "the model's tokens per minute (the simulator's synchronous path and the policy)")
	fs.IntVar(&o.SyncRPM, "sync-rpm", 0, "tenant C's synchronous calls a minute during the offloaded batch (0: the model's -rpm)")
	fs.Float64Var(&o.BatchLPS, "batch-lps", 500, "lines a second the simulator's Batch API answers")
	fs.Float64Var(&o.Completion, "completion", 0.5, "every completion's share of its max_tokens, in (0, 1]")
	fs.DurationVar(&o.Latency, "latency", 100*time.Millisecond, "the simulator's latency of a synchronous call")
	fs.DurationVar(&o.Jitter, "jitter", 200*time.Millisecond, "a uniform [0, jitter) added to -latency")
	fs.DurationVar(&o.Poll, "poll", time.Second, "the offloader's shortest wait between two looks at a provider batch (it sweeps every half of it)")
	fs.BoolVar(&o.Quiet, "quiet", true, "also run the offloaded batch with no synchronous traffic, for its cost a line")
	fs.DurationVar(&o.SyncNormal, "sync-normal", 0, "tenant C also sends for this long from the start of the normal run (0: not at all); reported, not checked")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "worker concurrency")
	o.Backends.Flags(fs, "each run")
	fs.DurationVar(&o.Timeout, "timeout", 15*time.Minute, "longest wait for one run's batch to end")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.SyncRPM == 0 {
		o.SyncRPM = int(o.RPM)
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.Lines < 1:
		return nil, fmt.Errorf("-lines must be at least 1, got %d", o.Lines)
	case o.RPM < 1 || o.TPM < 1:
		return nil, errors.New("-rpm and -tpm must be at least 1")
	case o.SyncRPM < 1:
		return nil, fmt.Errorf("-sync-rpm must be at least 1, got %d", o.SyncRPM)
	case !(o.BatchLPS > 0):
		return nil, fmt.Errorf("-batch-lps must be positive, got %v", o.BatchLPS)
	case !(o.Completion > 0 && o.Completion <= 1):
		return nil, fmt.Errorf("-completion must be within (0, 1], got %v", o.Completion)
	case o.Latency < 0 || o.Jitter < 0:
		return nil, errors.New("-latency and -jitter must not be negative")
	case o.SyncNormal < 0:
		return nil, fmt.Errorf("-sync-normal must not be negative, got %v", o.SyncNormal)
	case o.Poll <= 0:
		return nil, fmt.Errorf("-poll must be positive, got %v", o.Poll)
	case o.Concurrency < 1:
		return nil, fmt.Errorf("-concurrency must be at least 1, got %d", o.Concurrency)
	case o.Timeout <= 0:
		return nil, fmt.Errorf("-timeout must be positive, got %v", o.Timeout)
	}
	if err := o.Backends.Check(); err != nil {
		return nil, err
	}
	return o, nil
}

// runKind is one of the runs.
type runKind struct {
	name, tier string
	offloaded  bool
	sync       bool // tenant C sends meanwhile
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseOptions(args, out)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	kinds := []runKind{{"normal", "plain", false, o.SyncNormal > 0}, {"offloaded", "bulk", true, true}}
	if o.Quiet {
		kinds = append(kinds, runKind{"offloaded, quiet", "bulk", true, false})
	}
	fmt.Fprintf(out, "offload: %d lines; the model at %d RPM and %d TPM; the Batch API answers %g lines/s; completions %g of max_tokens; "+
		"latency %v + [0, %v); offloader polls from %v; tenant C at %d RPM; concurrency %d; GOMAXPROCS %d\n",
		o.Lines, o.RPM, o.TPM, o.BatchLPS, o.Completion, o.Latency, o.Jitter, o.Poll, o.SyncRPM, o.Concurrency, runtime.GOMAXPROCS(0))
	input, customIDs := inputFile(o.Lines)
	var results []*result
	for _, k := range kinds {
		r, err := measureRun(ctx, o, k, input, logger)
		if err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
		steps := make([]string, len(r.timeline))
		for i, e := range r.timeline {
			steps[i] = fmt.Sprintf("%s %.1fs", e.name, e.at.Seconds())
		}
		fmt.Fprintf(out, "%-17s batch %s in %v: %s\n", k.name, r.status, r.elapsed.Round(time.Millisecond), strings.Join(steps, ", "))
		results = append(results, r)
	}
	return report(out, o, customIDs, results)
}

// inputFile is the batch: n chat lines of several lengths and max_tokens,
// and their custom_ids.
func inputFile(n int) ([]byte, []string) {
	var b bytes.Buffer
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("line-%05d", i)
		body := map[string]any{
			"model": "gpt-4o-mini",
			"messages": []map[string]string{{"role": "user",
				"content": fmt.Sprintf("Summarise item %d of the catalogue in one sentence.%s", i, strings.Repeat(" Keep it short.", i%4))}},
			"max_tokens": 8 + i%33,
		}
		line, _ := json.Marshal(map[string]any{"custom_id": ids[i], "method": "POST", "url": "/v1/chat/completions", "body": body})
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes(), ids
}

// result is one run's measurement.
type result struct {
	kind    runKind
	status  string
	elapsed time.Duration // POST /v1/files to the batch seen completed
	// timeline is when each step was first seen, polling every 100 ms.
	timeline []event
	counts   client.BatchRequestCounts
	// out is the output file's lines by custom_id; outDup counts a
	// custom_id seen again, errLines the error file's lines.
	out      map[string]outLine
	outDup   int
	errLines int

	jobs        int
	ledgerRows  int
	batchedRows int
	spend       money.Micros // the ledger's sum over the batch's jobs
	// normalOfOwn is the batch's usage at the normal price, line by line.
	normalOfOwn money.Micros
	// badCharges are ledger rows that are not their line's usage at the
	// price of the path that ran it, or not their job's cost.
	badCharges  int
	firstBad    string
	budget      money.Micros // the budget's spend
	budgetHeld  money.Micros // the budget's reservations left
	sim         sim.Stats
	batchSim    sim.BatchStats
	runsOnce    int // the batch's jobs the provider's batches answered once
	runsAgain   int // more than once
	syncAnswers int64
	u           usage
	sync        *syncResult
	syncErr     error
}

// outLine is a line of the output file.
type outLine struct {
	status             int
	prompt, completion int64
}

func measureRun(ctx context.Context, o *options, k runKind, input []byte, logger *slog.Logger) (*result, error) {
	s, err := openStack(ctx, o, logger)
	if err != nil {
		return nil, err
	}
	defer s.close()
	tenantID, _, c, err := s.tenant(ctx, "bench-"+k.tier, k.tier)
	if err != nil {
		return nil, err
	}
	var syncKey string
	if k.sync {
		if _, syncKey, _, err = s.tenant(ctx, "bench-c", "interactive"); err != nil {
			return nil, err
		}
	}
	r := &result{kind: k}
	before := s.meter.read(ctx)
	start := time.Now()
	var (
		load     *syncLoad
		stopOnce sync.Once
	)
	stopLoad := func() {
		stopOnce.Do(func() {
			if load != nil {
				r.sync, r.syncErr = load.stop()
			}
		})
	}
	defer stopLoad()
	if k.sync {
		load = startSync(ctx, s.hc, s.url, syncKey, o.SyncRPM)
		if !k.offloaded {
			// On the normal path C sends for -sync-normal only: it takes the
			// model's whole rate, and the batch waits until it stops.
			t := time.AfterFunc(o.SyncNormal, stopLoad)
			defer t.Stop()
		}
	}
	f, err := c.Files.Upload(ctx, "input.jsonl", bytes.NewReader(input), "batch")
	if err != nil {
		return nil, fmt.Errorf("upload: %w", err)
	}
	b, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions"})
	if err != nil {
		return nil, fmt.Errorf("create the batch: %w", err)
	}
	if b, err = r.wait(ctx, o, s, c, b.ID, start); err != nil {
		return nil, err
	}
	r.elapsed = time.Since(start)
	stopLoad()
	r.u = s.meter.since(ctx, before)
	r.status, r.counts = b.Status, b.RequestCounts
	r.sim, r.batchSim = s.sim.Stats(), s.sim.BatchStats()
	if r.sync != nil {
		r.syncAnswers = int64(r.sync.answered)
	}
	if err := r.readOutput(ctx, c, b); err != nil {
		return nil, err
	}
	if err := r.readLedger(ctx, s, b.ID, s.sim.CustomIDRuns()); err != nil {
		return nil, err
	}
	if err := r.readBudget(ctx, s, tenantID); err != nil {
		return nil, err
	}
	return r, nil
}

// wait polls the batch every 100 ms until it ends, as a client would, and
// notes when each step was first seen: the batch in_progress (validated),
// on the offloaded path each state of its part and the provider's first
// and last line answered, on the normal path its first and last line done.
func (r *result) wait(ctx context.Context, o *options, s *stack, c *client.Client, id string, start time.Time) (*client.Batch, error) {
	seen := map[string]bool{}
	see := func(name string) {
		if !seen[name] {
			seen[name] = true
			r.timeline = append(r.timeline, event{name, time.Since(start)})
		}
	}
	deadline := time.Now().Add(o.Timeout)
	for {
		b, err := c.Batches.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("batch %s: %w", id, err)
		}
		if b.Status != "validating" {
			see("in_progress")
		}
		if r.kind.offloaded {
			parts, err := s.app.Store.BatchPartListByBatch(ctx, id)
			if err != nil {
				return nil, err
			}
			for _, p := range parts {
				see("part " + string(p.State))
			}
			switch st := s.sim.BatchStats(); {
			case st.LinesProcessed >= int64(o.Lines):
				see("provider's first line")
				see("provider's last line")
			case st.LinesProcessed > 0:
				see("provider's first line")
			}
		} else {
			if r.kind.sync && !seen["C"] && time.Since(start) >= o.SyncNormal {
				seen["C"] = true
				r.timeline = append(r.timeline, event{fmt.Sprintf("tenant C stops with %d lines done", b.RequestCounts.Completed), time.Since(start)})
			}
			switch n := b.RequestCounts.Completed; {
			case n >= int64(o.Lines):
				see("first line done")
				see("last line done")
			case n > 0:
				see("first line done")
			}
		}
		if b.Finished() {
			see(b.Status)
			return b, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("batch %s still %s after %v (%d of %d lines done)", id, b.Status, o.Timeout, b.RequestCounts.Completed, o.Lines)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// event is a step of a run first seen, since the upload began.
type event struct {
	name string
	at   time.Duration
}

// readOutput reads the batch's output file, and counts its error file's
// lines.
func (r *result) readOutput(ctx context.Context, c *client.Client, b *client.Batch) error {
	r.out = map[string]outLine{}
	read := func(id string, line func([]byte) error) error {
		body, err := c.Files.Content(ctx, id)
		if err != nil {
			return err
		}
		defer body.Close()
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if len(sc.Bytes()) > 0 {
				if err := line(sc.Bytes()); err != nil {
					return err
				}
			}
		}
		return sc.Err()
	}
	if b.OutputFileID != nil {
		err := read(*b.OutputFileID, func(data []byte) error {
			var l struct {
				CustomID string `json:"custom_id"`
				Response struct {
					StatusCode int `json:"status_code"`
					Body       struct {
						Usage struct {
							PromptTokens     int64 `json:"prompt_tokens"`
							CompletionTokens int64 `json:"completion_tokens"`
						} `json:"usage"`
					} `json:"body"`
				} `json:"response"`
			}
			if err := json.Unmarshal(data, &l); err != nil {
				return fmt.Errorf("output line %.200s: %w", data, err)
			}
			if _, dup := r.out[l.CustomID]; dup {
				r.outDup++
				return nil
			}
			u := l.Response.Body.Usage
			r.out[l.CustomID] = outLine{status: l.Response.StatusCode, prompt: u.PromptTokens, completion: u.CompletionTokens}
			return nil
		})
		if err != nil {
			return fmt.Errorf("output file: %w", err)
		}
	}
	if b.ErrorFileID != nil {
		if err := read(*b.ErrorFileID, func([]byte) error { r.errLines++; return nil }); err != nil {
			return fmt.Errorf("error file: %w", err)
		}
	}
	return nil
}

// readLedger reads every job of the batch and its ledger row: the spend,
// each row against its line's usage at the price of its path, and how many
// times the provider's batches answered it (runs, by llmq's job id, the
// custom_id llmq gives the provider).
func (r *result) readLedger(ctx context.Context, s *stack, batchID string, runs map[string]int64) error {
	m, ok := s.app.Policy.Current().Model("gpt-4o-mini")
	if !ok {
		return errors.New("no model gpt-4o-mini in the policy")
	}
	price := m.Routes()[0].Price
	normal, batched := price, price.Batch()
	var jobs []*store.Job
	if err := s.app.Store.JobStreamByBatch(ctx, batchID, nil, func(j *store.Job) error { jobs = append(jobs, j); return nil }); err != nil {
		return err
	}
	r.jobs = len(jobs)
	bad := func(format string, a ...any) {
		if r.badCharges == 0 {
			r.firstBad = fmt.Sprintf(format, a...)
		}
		r.badCharges++
	}
	for _, j := range jobs {
		switch n := runs[j.ID]; {
		case n == 1:
			r.runsOnce++
		case n > 1:
			r.runsAgain++
		}
		e, err := s.app.Store.UsageGetByJob(ctx, j.ID)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		r.ledgerRows++
		r.spend += e.Cost
		price := normal
		if e.Batched {
			r.batchedRows++
			price = batched
		}
		r.normalOfOwn += normal.Cost(money.Tokens{Prompt: e.PromptTokens, Cached: e.CachedTokens, Completion: e.CompletionTokens})
		want := price.Cost(money.Tokens{Prompt: e.PromptTokens, Cached: e.CachedTokens, Completion: e.CompletionTokens})
		switch {
		case e.Cost != want:
			bad("job %s (%s): charged %d µ$, its usage (%d + %d tokens) at its path's price is %d", j.ID, j.CustomID, e.Cost, e.PromptTokens,
				e.CompletionTokens, want)
		case e.Cost != j.Cost:
			bad("job %s (%s): ledger %d µ$, job %d", j.ID, j.CustomID, e.Cost, j.Cost)
		case j.UsageEstimated:
			bad("job %s (%s): usage estimated", j.ID, j.CustomID)
		}
		if l, ok := r.out[j.CustomID]; ok && (l.prompt != e.PromptTokens || l.completion != e.CompletionTokens) {
			bad("job %s (%s): output says %d + %d tokens, the ledger %d + %d", j.ID, j.CustomID, l.prompt, l.completion, e.PromptTokens, e.CompletionTokens)
		}
	}
	return nil
}

// readBudget reads the tenant's budget day, once no reservation is left
// (a worker settles its job's budget just after storing it).
func (r *result) readBudget(ctx context.Context, s *stack, tenantID string) error {
	t, err := s.app.Store.TenantGetByID(ctx, tenantID)
	if err != nil {
		return err
	}
	acct, _, err := admission.Account(s.app.Policy.Current(), t)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		d, err := s.app.Budgets.Status(ctx, acct)
		if err != nil {
			return err
		}
		r.budget, r.budgetHeld = d.Spent, d.Reserved
		if d.Reserved == 0 || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// report prints the runs' figures and checks, and fails when a check does.
func report(w io.Writer, o *options, ids []string, results []*result) error {
	n := len(ids)
	normal := results[0]
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\ttime\tlines/s\tspend\tbatched rows\toutput lines\tlost\trun twice\tCPU process a line\tRedis round trips a line\tCPU Redis a line\tCPU Postgres a line\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.1fs\t%.0f\t$%s (%d µ$)\t%d\t%d\t%d\t%d\t%s\t%.2f\t%s\t%s\t\n", r.kind.name, r.elapsed.Seconds(), float64(n)/r.elapsed.Seconds(),
			r.spend, int64(r.spend), r.batchedRows, len(r.out), r.lost(ids), r.twice(n), perLine(r.u.cpu.Self, n), float64(r.u.redisRT)/float64(n),
			perLine(r.u.cpu.Redis, n), perLine(r.u.cpu.Postgres, n))
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "(CPU: this process holds the API, the workers, the offloader, the simulator and the clients; the offloaded run's figures include tenant C's calls;",
		"Redis and Postgres are whole-server times, upper bounds on a shared machine)")

	var verdicts checks.List
	add := verdicts.Add
	for _, r := range results {
		p := r.kind.name + ": "
		add(p+"batch completed, every line counted completed", r.status == "completed" && r.counts.Completed == int64(n) && r.counts.Failed == 0,
			"%s, %d completed, %d failed of %d", r.status, r.counts.Completed, r.counts.Failed, r.counts.Total)
		add(p+"every line in the output once under its custom_id, 0 lost", r.lost(ids) == 0 && r.outDup == 0 && len(r.out) == n && r.errLines == 0,
			"%d of %d, %d lost, %d seen twice, %d not in the input, %d in the error file", len(r.out), n, r.lost(ids), r.outDup, r.unknown(ids), r.errLines)
		add(p+"every job charged once, at its usage at its path's price", r.jobs == n && r.ledgerRows == n && r.badCharges == 0,
			"%d jobs, %d ledger rows, %d wrong%s", r.jobs, r.ledgerRows, r.badCharges, firstOf(r.firstBad))
		add(p+"the budget's spend is the ledger's, nothing held", r.budget == r.spend && r.budgetHeld == 0,
			"spent %d µ$, ledger %d µ$, held %d µ$", int64(r.budget), int64(r.spend), int64(r.budgetHeld))
		calls := r.sim.Admitted - r.syncAnswers
		if !r.kind.offloaded {
			add(p+"0 run twice: one provider call a line, none batched", calls == int64(n) && r.batchedRows == 0 && r.batchSim.LinesProcessed == 0,
				"%d calls admitted for %d lines (%d provider 429s), %d batched rows", calls, n, r.sim.RateLimited, r.batchedRows)
			continue
		}
		add(p+"0 run twice: the provider's batches answered every line once", r.runsOnce == n && r.runsAgain == 0 &&
			r.batchSim.LinesProcessed == int64(n) && r.batchSim.LinesRepeated == 0,
			"%d once, %d more than once, %d processed, %d repeated", r.runsOnce, r.runsAgain, r.batchSim.LinesProcessed, r.batchSim.LinesRepeated)
		add(p+"every line on the Batch API, none on the synchronous endpoint", r.batchedRows == n && calls == 0,
			"%d batched rows, %d synchronous calls beside tenant C's", r.batchedRows, calls)
		same, diff := sameUsage(normal, r, ids)
		if same {
			add(p+"spend x 2 = the normal run's spend, to the micro-dollar", r.spend*2 == normal.spend,
				"%d µ$ x 2 = %d µ$; normal %d µ$ (every line's usage the same in both runs)", int64(r.spend), int64(r.spend*2), int64(normal.spend))
		} else {
			add(p+"spend x 2 = its own usage at the normal price, to the micro-dollar", r.spend*2 == r.normalOfOwn,
				"%d µ$ x 2 = %d µ$; its usage at the normal price %d µ$ (%d lines' usage differ from the normal run's: %s)",
				int64(r.spend), int64(r.spend*2), int64(r.normalOfOwn), diff.n, diff.first)
		}
	}
	for _, r := range results {
		if r.sync == nil {
			continue
		}
		c := r.sync
		fmt.Fprintf(w, "\ntenant C during the %s run: %d calls sent at %d RPM over %.1fs, %d answered, %d refused (429), %d failed, %d not sent; "+
			"%.0f answers a minute (%.1f%% of its rate, %.1f%% of the model's %d RPM); p50 %v, p99 %v; the provider answered %d 429s in the run\n",
			r.kind.name, c.sent, c.rpm, c.last.Sub(c.first).Seconds(), c.answered, c.refused, c.failed, c.skipped, c.rate(),
			100*c.rate()/float64(c.rpm), 100*c.rate()/float64(o.RPM), o.RPM, c.lat.percentile(0.5).Round(time.Millisecond),
			c.lat.percentile(0.99).Round(time.Millisecond), r.sim.RateLimited)
		if r.syncErr != nil {
			fmt.Fprintf(w, "  first failure: %v\n", r.syncErr)
		}
		if !r.kind.offloaded {
			continue // a contrast, not a target
		}
		p := r.kind.name + ": "
		add(p+"tenant C saw no 429, the provider answered none", c.refused == 0 && c.failed == 0 && r.sim.RateLimited == 0,
			"%d refused by llmq, %d failed, %d 429s at the provider", c.refused, c.failed, r.sim.RateLimited)
		add(p+"tenant C at >= 95% of its rate", c.rate() >= 0.95*float64(c.rpm) && c.skipped == 0,
			"%.0f a minute of %d (%.1f%%)", c.rate(), c.rpm, 100*c.rate()/float64(c.rpm))
	}

	return verdicts.Report(w)
}

// lost counts the input's lines missing from the output or not answered 200.
func (r *result) lost(ids []string) int {
	n := 0
	for _, id := range ids {
		if l, ok := r.out[id]; !ok || l.status != 200 {
			n++
		}
	}
	return n
}

// unknown counts the output's custom_ids that are not the input's.
func (r *result) unknown(ids []string) int {
	in := make(map[string]bool, len(ids))
	for _, id := range ids {
		in[id] = true
	}
	n := 0
	for id := range r.out {
		if !in[id] {
			n++
		}
	}
	return n
}

// twice counts the lines run more than once: provider calls admitted
// beyond one a line on the normal path, lines a provider batch answered
// again when offloaded.
func (r *result) twice(n int) int64 {
	if r.kind.offloaded {
		return int64(r.runsAgain)
	}
	return max(r.sim.Admitted-r.syncAnswers-int64(n), 0)
}

type usageDiff struct {
	n     int
	first string
}

// sameUsage reports whether every line has the same usage in both runs'
// output files.
func sameUsage(a, b *result, ids []string) (bool, usageDiff) {
	var d usageDiff
	for _, id := range ids {
		x, y := a.out[id], b.out[id]
		if x.prompt != y.prompt || x.completion != y.completion {
			if d.n == 0 {
				d.first = fmt.Sprintf("%s: %d + %d tokens against %d + %d", id, x.prompt, x.completion, y.prompt, y.completion)
			}
			d.n++
		}
	}
	return d.n == 0, d
}

func perLine(d time.Duration, n int) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.3fms", float64(d)/float64(n)/float64(time.Millisecond))
}

func firstOf(s string) string {
	if s == "" {
		return ""
	}
	return "; first: " + s
}
