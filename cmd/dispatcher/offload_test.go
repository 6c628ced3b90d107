package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// offloadRedisDB is cmd/dispatcher's Redis database (docs/ARCHITECTURE.md);
// the test app has its own key prefix and queue namespace in it.
const offloadRedisDB = 6

// offloadPolicy is the test apps' policy with a tier "bulk" whose batches
// run on the provider's Batch API.
var offloadPolicy = strings.Replace(apptest.PolicyYAML, "  - name: internal\n",
	"  - name: bulk\n    daily_budget_usd: 500\n    priority: default\n    on_exhausted: defer\n    api_rps: 1000\n    batch_offload: auto\n  - name: internal\n", 1)

// dispatcherProcess is `dispatcher serve` running as a process of its own:
// this test binary run again as the dispatcher program (RunMainIfChild in
// TestMain), so that it can be SIGKILLed.
type dispatcherProcess struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
	url  string // the API's root, from its first line
}

var listeningLine = regexp.MustCompile(`llmq dispatcher listening on (http://\S+) `)

// startDispatcherProcess runs `dispatcher serve` with environ until it
// prints where it listens. The test's end stops it (SIGTERM, then SIGKILL)
// and fails the test if the race detector reported anything in it.
func startDispatcherProcess(t *testing.T, name string, environ []string) *dispatcherProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(append([]string{}, environ...), "PATH="+os.Getenv("PATH")),
		"LLMQ_LOG_LEVEL=info", mainMarker+"=1", mainMarker+"_ARGS=serve")
	d := &dispatcherProcess{cmd: cmd, out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.out, d.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-d.done
		}
		if strings.Contains(d.out.String(), "WARNING: DATA RACE") {
			t.Errorf("the race detector reported in %s", name)
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, d.out.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := listeningLine.FindStringSubmatch(d.out.String()); m != nil {
			d.url = m[1]
			return d
		}
		select {
		case <-d.done:
			t.Fatalf("%s exited before listening:\n%s", name, d.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen within 60s:\n%s", name, d.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the process and waits until it is gone.
func (d *dispatcherProcess) kill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the dispatcher did not die of SIGKILL within 10s")
	}
}

// A dispatcher SIGKILLed while its batch's part is at the provider (the
// provider batch created and running) loses nothing and repeats nothing: a
// new dispatcher on the same services picks the part up where the store
// says it is, polls the provider batch the first one created, collects it,
// and completes the batch. No file is uploaded twice, no provider batch
// created twice, no line run twice; every line is in the output once and
// charged once, at the batch price, the ledger agreeing with the budget.
func TestOffloadSurvivesDispatcherSIGKILL(t *testing.T) {
	t.Parallel()
	// The provider runs 250 lines a second: the 2,000 lines take 8 s at
	// its Batch API, long enough to kill the dispatcher while they run,
	// short of the restarted dispatcher's second poll (5 s, then 10 s
	// after submission, its defaults).
	offloadKillScenario(t, 250, store.PartSubmitted)
}

// A dispatcher SIGKILLed while it collects a provider batch's output (the
// part collecting, some of its jobs stored as answered, their budget
// charged): the new dispatcher collects it again whole, and still every
// line is charged once, the budget's spend equal to the ledger's.
func TestOffloadSurvivesDispatcherSIGKILLWhileCollecting(t *testing.T) {
	t.Parallel()
	// The provider runs the lines in a second: the first dispatcher's
	// first poll (5 s after submission) finds the batch ended and collects.
	offloadKillScenario(t, 5000, store.PartCollecting)
}

// offloadKillScenario submits a batch of 2,000 lines for an offloading
// tier through a dispatcher process, SIGKILLs it as soon as a part of the
// batch is in state killAt, starts another dispatcher on the same services,
// and checks the batch completes with every line run, output and charged
// once. The simulated provider answers linesPerSecond lines a second.
func offloadKillScenario(t *testing.T, linesPerSecond float64, killAt store.BatchPartState) {
	const n = 2000
	began := time.Now()
	// A worker runs, so that a line sent down llmq's own path would show
	// as a synchronous call.
	a := apptest.Start(t, apptest.Options{RedisDB: offloadRedisDB, Policy: offloadPolicy, Workers: 1,
		Sim: &sim.Config{Limits: sim.Limits{RPM: 30000, TPM: 3000000}, DefaultMaxTokens: 1024, Echo: true,
			Batch: sim.BatchConfig{LinesPerSecond: linesPerSecond}}})
	tenantID, key := a.Tenant("bulk")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	first := startDispatcherProcess(t, "the first dispatcher", a.Environ)
	c, err := client.New(first.url, key)
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	for i := range n {
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("line-%04d", i), "method": "POST", "url": "/v1/chat/completions",
			"body": apptest.ChatBody(fmt.Sprintf("line %d of a batch", i), fmt.Sprintf("line-%04d", i), 20)})
		in.Write(line)
		in.WriteByte('\n')
	}
	f, err := c.Files.Upload(ctx, "in.jsonl", bytes.NewReader(in.Bytes()), "batch")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}

	// Until a part is in state killAt (and, collecting, has stored some of
	// its answers: the first 500).
	deadline := time.Now().Add(30 * time.Second)
	for ready := false; !ready; {
		parts, err := a.Store.BatchPartListByBatch(ctx, b.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			ready = ready || p.State == killAt
		}
		pause := 10 * time.Millisecond
		if ready && killAt == store.PartCollecting {
			c, err := a.Store.JobCountsByBatch(ctx, b.ID)
			if err != nil {
				t.Fatal(err)
			}
			ready, pause = c.Succeeded > 0, 2*time.Millisecond
		}
		if time.Now().After(deadline) {
			t.Fatalf("no part %s within 30s: %s", killAt, partStates(parts))
		}
		if !ready {
			time.Sleep(pause)
		}
	}
	first.kill(t)
	stAtKill := a.Sim.BatchStats()
	counts, err := a.Store.JobCountsByBatch(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := a.Store.BatchPartListByBatch(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILLed the first dispatcher %v in, parts %s; jobs %+v; provider %+v", time.Since(began).Round(time.Millisecond),
		partStates(parts), *counts, stAtKill)
	switch killAt {
	case store.PartSubmitted:
		if stAtKill.LinesProcessed >= n {
			t.Fatalf("the provider had run all %d lines before the kill: make it slower", n)
		}
	case store.PartCollecting:
		if parts[0].State != store.PartCollecting || counts.Succeeded == n {
			t.Skipf("the first dispatcher finished collecting before the kill landed (part %s); nothing to check", parts[0].State)
		}
	}

	second := startDispatcherProcess(t, "the second dispatcher", a.Environ)
	c2, err := client.New(second.url, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 45*time.Second)
	defer wcancel()
	final, err := c2.Batches.Wait(wctx, b.ID, &client.BatchWaitOptions{WaitOptions: client.WaitOptions{Interval: 200 * time.Millisecond, MaxInterval: 500 * time.Millisecond}})
	if err != nil {
		parts, _ := a.Store.BatchPartListByBatch(ctx, b.ID)
		t.Fatalf("batch after the restart: %+v, %v; parts %s; provider %+v", final, err, partStates(parts), a.Sim.BatchStats())
	}
	t.Logf("batch %s %v after the start", final.Status, time.Since(began).Round(time.Millisecond))
	if final.Status != "completed" || final.RequestCounts.Total != n || final.RequestCounts.Completed != n || final.RequestCounts.Failed != 0 {
		t.Fatalf("batch %s, counts %+v; want completed with %d", final.Status, final.RequestCounts, n)
	}

	// Nothing made or run twice at the provider.
	if parts, err = a.Store.BatchPartListByBatch(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if p.State != store.PartDone {
			t.Fatalf("parts after the batch completed: %s", partStates(parts))
		}
	}
	st := a.Sim.BatchStats()
	if st.FilesUploaded != int64(len(parts)) || st.BatchesCreated != int64(len(parts)) || st.LinesRepeated != 0 || st.LinesProcessed != n {
		t.Fatalf("provider %+v for %d parts of %d lines; want one file and one batch a part, each line run once", st, len(parts), n)
	}
	if s := a.Sim.Stats(); s.Requests != 0 {
		t.Fatalf("%d lines went to the provider's synchronous endpoint", s.Requests)
	}

	// The output: every custom_id once, answered by its own line.
	if final.OutputFileID == nil {
		t.Fatal("no output file")
	}
	rc, err := c2.Files.Content(ctx, *final.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(rc)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
				Body       struct {
					Choices []struct {
						Message struct {
							Content string `json:"content"`
						} `json:"message"`
					} `json:"choices"`
				} `json:"body"`
			} `json:"response"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		if seen[l.CustomID] {
			t.Fatalf("custom_id %s twice in the output", l.CustomID)
		}
		seen[l.CustomID] = true
		if l.Response.StatusCode != 200 || len(l.Response.Body.Choices) == 0 ||
			!strings.HasPrefix(l.Response.Body.Choices[0].Message.Content, l.CustomID) {
			t.Fatalf("output line %s: %s", l.CustomID, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("%d custom_ids in the output, want %d", len(seen), n)
	}

	// Every job charged once, batched; the ledger is what the budget spent.
	runs := a.Sim.CustomIDRuns()
	var total money.Micros
	jobs := 0
	err = a.Store.JobStreamByBatch(ctx, b.ID, nil, func(j *store.Job) error {
		jobs++
		if j.Status != store.JobSucceeded {
			return fmt.Errorf("job %s: %s", j.ID, j.Status)
		}
		if runs[j.ID] != 1 {
			return fmt.Errorf("job %s ran %d times at the provider", j.ID, runs[j.ID])
		}
		e, err := a.Store.UsageGetByJob(ctx, j.ID)
		if err != nil {
			return fmt.Errorf("job %s: ledger: %w", j.ID, err)
		}
		if !e.Batched || e.Cost != j.Cost || e.Cost <= 0 {
			return fmt.Errorf("job %s: ledger row batched=%v cost %s, job cost %s", j.ID, e.Batched, e.Cost, j.Cost)
		}
		total += e.Cost
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if jobs != n {
		t.Fatalf("%d jobs, want %d", jobs, n)
	}
	d, err := a.Budgets.Status(ctx, a.Account(tenantID))
	if err != nil {
		t.Fatal(err)
	}
	if d.Spent != total || d.Reserved != 0 {
		t.Fatalf("budget spent %s, reserved %s; the ledger says %s, and nothing should be held", d.Spent, d.Reserved, total)
	}
	t.Logf("done %v after the start; provider %+v", time.Since(began).Round(time.Millisecond), st)
}

// partStates describes parts for a failure message.
func partStates(parts []*store.BatchPart) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprintf("%s:%s(%d lines, provider batch %q %s, error %q)", p.ID, p.State, p.Lines, p.ProviderBatchID, p.ProviderStatus, p.Error)
	}
	return "[" + strings.Join(s, ", ") + "]"
}
