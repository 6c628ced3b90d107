package integration

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/store"
)

// offloadSDKPolicy is the test apps' policy with a tier "bulk" whose
// batches run on the provider's Batch API.
var offloadSDKPolicy = strings.Replace(apptest.PolicyYAML, "  - name: internal\n",
	"  - name: bulk\n    daily_budget_usd: 500\n    priority: default\n    on_exhausted: defer\n    api_rps: 1000\n    batch_offload: auto\n  - name: internal\n", 1)

// offloadSDKResult is what test/node/offload.mjs prints last.
type offloadSDKResult struct {
	File struct {
		ID      string `json:"id"`
		Purpose string `json:"purpose"`
	} `json:"file"`
	Created struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"created"`
	Batch struct {
		ID            string  `json:"id"`
		Status        string  `json:"status"`
		OutputFileID  *string `json:"output_file_id"`
		ErrorFileID   *string `json:"error_file_id"`
		RequestCounts struct {
			Total     int `json:"total"`
			Completed int `json:"completed"`
			Failed    int `json:"failed"`
		} `json:"request_counts"`
		Errors json.RawMessage `json:"errors"`
	} `json:"batch"`
	Output []struct {
		ID       string `json:"id"`
		CustomID string `json:"custom_id"`
		Response *struct {
			StatusCode int `json:"status_code"`
			Body       struct {
				Object  string `json:"object"`
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			} `json:"body"`
		} `json:"response"`
		Error json.RawMessage `json:"error"`
	} `json:"output"`
	Errors []json.RawMessage `json:"errors"`
}

// TestOpenAINodeSDKBatchOffloaded runs test/node/offload.mjs: the official
// OpenAI Node SDK's batch flow (files.create with a read stream,
// batches.create, batches.retrieve until it ends, files.content), unchanged,
// for a tenant whose tier has batch_offload: auto. The batch completes with
// every line answered once under its custom_id, and the lines really ran on
// the provider's Batch API: a provider batch was created, no call went to
// the provider's synchronous endpoint (although a worker runs), and every
// line's ledger row says batched.
func TestOpenAINodeSDKBatchOffloaded(t *testing.T) {
	t.Parallel()
	const n = 50
	// The simulator serves batches quickly (its default 5,000 lines a
	// second, 50ms validating); a worker runs so that a line sent down
	// llmq's own path would show as a synchronous call.
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: offloadSDKPolicy, Workers: 1,
		Sim:     &sim.Config{Limits: sim.Limits{RPM: 30000, TPM: 3000000}, DefaultMaxTokens: 1024, Echo: true},
		Offload: offload.Options{PollMin: 200 * time.Millisecond, PollMax: time.Second, SweepInterval: 100 * time.Millisecond}})
	// apptest runs the scheduler only: the offloader and the batch sweeper
	// (finalizing batches) run here, as a dispatcher runs them.
	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Offload.Run(runCtx) })
	wg.Go(func() { a.Batches.Run(runCtx) })
	t.Cleanup(func() { stop(); wg.Wait() })
	_, key := a.Tenant("bulk")

	start := time.Now()
	out := runNodeScript(t, 4*time.Minute, "offload.mjs", a.URL+"/v1", key, "LLMQ_LINES="+strconv.Itoa(n))
	t.Logf("node offload.mjs ran %v", time.Since(start).Round(time.Millisecond))
	var res offloadSDKResult
	found := false
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "result: "); ok {
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				t.Fatalf("the script's result is not JSON: %v\n%s", err, rest)
			}
			found = true
		} else if line != "" {
			t.Log(line)
		}
	}
	if !found {
		t.Fatalf("the script printed no result:\n%s", out)
	}

	// What the user sees.
	b := res.Batch
	if b.ID != res.Created.ID || b.Status != "completed" {
		t.Fatalf("batch %s ended %s (errors %s), want completed", b.ID, b.Status, b.Errors)
	}
	if rc := b.RequestCounts; rc.Total != n || rc.Completed != n || rc.Failed != 0 {
		t.Fatalf("request_counts %+v, want total = completed = %d", rc, n)
	}
	if b.OutputFileID == nil || *b.OutputFileID == "" {
		t.Fatal("no output_file_id")
	}
	if len(res.Errors) != 0 {
		t.Fatalf("%d lines in the error file: %s", len(res.Errors), res.Errors[0])
	}
	seen := map[string]bool{}
	for _, l := range res.Output {
		if seen[l.CustomID] {
			t.Fatalf("custom_id %s twice in the output", l.CustomID)
		}
		seen[l.CustomID] = true
		if l.Response == nil || l.Response.StatusCode != 200 || (len(l.Error) > 0 && string(l.Error) != "null") {
			t.Fatalf("output line %s: response %+v, error %s", l.CustomID, l.Response, l.Error)
		}
		body := l.Response.Body
		// The simulator starts every answer with the request's user field,
		// which the script set to the custom_id: the answer is this line's.
		if body.Object != "chat.completion" || len(body.Choices) == 0 || !strings.HasPrefix(body.Choices[0].Message.Content, l.CustomID) {
			t.Fatalf("output line %s holds another line's answer: %+v", l.CustomID, body)
		}
	}
	for i := range n {
		if id := "req-" + strconv.Itoa(i); !seen[id] {
			t.Fatalf("custom_id %s missing from the output (%d lines)", id, len(res.Output))
		}
	}

	// Where the lines ran.
	st := a.Sim.BatchStats()
	if st.BatchesCreated < 1 || st.FilesUploaded != st.BatchesCreated || st.LinesProcessed != n || st.LinesRepeated != 0 {
		t.Fatalf("simulator's Batch API: %+v; want a provider batch that ran the %d lines once", st, n)
	}
	if s := a.Sim.Stats(); s.Requests != 0 {
		t.Fatalf("%d calls went to the provider's synchronous endpoint", s.Requests)
	}
	bctx := context.Background()
	parts, err := a.Store.BatchPartListByBatch(bctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) == 0 || int64(len(parts)) != st.BatchesCreated {
		t.Fatalf("%d parts, %d provider batches", len(parts), st.BatchesCreated)
	}
	for _, p := range parts {
		if p.State != store.PartDone {
			t.Fatalf("part %s left %s", p.ID, p.State)
		}
	}
	runs := a.Sim.CustomIDRuns()
	jobs, batched := 0, 0
	err = a.Store.JobStreamByBatch(bctx, b.ID, nil, func(j *store.Job) error {
		jobs++
		if j.Status != store.JobSucceeded {
			t.Errorf("job %s: %s", j.ID, j.Status)
		}
		if runs[j.ID] != 1 {
			t.Errorf("job %s ran %d times at the provider", j.ID, runs[j.ID])
		}
		e, err := a.Store.UsageGetByJob(bctx, j.ID)
		if err != nil {
			t.Errorf("job %s: ledger: %v", j.ID, err)
			return nil
		}
		if e.Batched {
			batched++
		}
		if e.Cost != j.Cost || e.Cost <= 0 {
			t.Errorf("job %s: ledger %s, job %s", j.ID, e.Cost, j.Cost)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if jobs != n || batched != n {
		t.Fatalf("%d jobs, %d ledger rows batched; want %d of each", jobs, batched, n)
	}
}
