package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/store"
)

// TestThousandJobsTwoWorkerProcesses: 1,000 jobs from 10 concurrent
// producers through 2 worker processes against a provider enforcing 3,000
// RPM and 300,000 TPM. Every job succeeds with its own answer, each is
// charged once, and the provider never answers 429 nor admits more than its
// limits allow in any window.
func TestThousandJobsTwoWorkerProcesses(t *testing.T) {
	t.Parallel()
	limits := sim.Limits{RPM: 3000, TPM: 300000}
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: limits, DefaultMaxTokens: 1024, Echo: true, Latency: 20 * time.Millisecond, Jitter: 30 * time.Millisecond, Seed: 7,
		// Answers use most of max_tokens, so refunds are small and the net
		// demand (about 380k tokens) exceeds the 300k bucket.
		CompletionMin: 0.8, CompletionMax: 1,
	}})
	for i := 0; i < 2; i++ {
		p := startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=25")
		p.waitForOutput(t, "worker running")
	}
	tenant, key := a.Tenant("standard")

	const producers, perProducer = 10, 100
	ids := make([]string, producers*perProducer)
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < perProducer; i++ {
				n := p*perProducer + i
				cid := fmt.Sprintf("req-%04d", n)
				// About 415k tokens of demand at admission: more than the
				// 300k bucket holds, so the limiter has to pace the workers.
				body := map[string]any{"custom_id": cid, "body": apptest.ChatBody(
					fmt.Sprintf("Request %d: summarise the history of queueing theory in one line.", n), cid, 400)}
				r := apptest.Do(t, a.URL, "POST", "/v1/jobs", key, body, nil)
				if r.Status != 202 {
					errs <- fmt.Errorf("producer %d job %d: %d %s", p, i, r.Status, r.Body)
					return
				}
				var j struct{ ID string }
				if err := json.Unmarshal(r.Body, &j); err != nil {
					errs <- err
					return
				}
				ids[n] = j.ID
			}
		}(p)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	ctx := context.Background()
	eventually(t, 3*time.Minute, func() bool {
		n, err := countStatus(ctx, a, tenant, store.JobSucceeded)
		return err == nil && n == producers*perProducer
	}, "all %d jobs succeed", producers*perProducer)

	days := map[string]bool{}
	for n, id := range ids {
		j, err := a.Store.JobGetByID(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Choices []struct{ Message struct{ Content string } } `json:"choices"`
		}
		if err := json.Unmarshal(j.ResponseBody, &body); err != nil || len(body.Choices) != 1 {
			t.Fatalf("job %s response: %v %s", id, err, j.ResponseBody)
		}
		want := fmt.Sprintf("req-%04d ", n)
		if j.CustomID != strings.TrimSpace(want) || !strings.HasPrefix(body.Choices[0].Message.Content, want) {
			t.Fatalf("job %s (%s) holds the answer to another request: %q", id, j.CustomID, body.Choices[0].Message.Content[:20])
		}
		e, err := a.Store.UsageGetByJob(ctx, id)
		if err != nil || e.Cost != j.Cost || e.Cost <= 0 {
			t.Fatalf("ledger row of %s = %+v, %v (job cost %d)", id, e, err, j.Cost)
		}
		days[e.Day] = true
	}
	var requests int64
	for day := range days { // a run across midnight charges two days
		rows, err := a.Store.UsageReport(ctx, &store.UsageReportParams{Day: day, TenantID: tenant})
		if err != nil || len(rows) != 1 {
			t.Fatalf("ledger rows of %s = %+v, %v; want one (the tenant's model)", day, rows, err)
		}
		requests += rows[0].Requests
	}
	if requests != producers*perProducer {
		t.Fatalf("the ledger counts %d requests; want exactly one per job (%d)", requests, producers*perProducer)
	}

	st := a.Sim.Stats()
	if st.RateLimited != 0 || st.Spurious429 != 0 {
		t.Fatalf("provider answered 429 %d times", st.RateLimited)
	}
	// Delivery is at least once: under a starved CPU a call can time out
	// after the provider admitted it, and run again. The ledger above holds
	// one row per job whatever the provider saw.
	if st.Admitted < producers*perProducer {
		t.Fatalf("provider admitted %d requests for %d jobs", st.Admitted, producers*perProducer)
	}
	if dup := st.Admitted - producers*perProducer; dup > 0 {
		t.Logf("%d calls ran twice (timed out, then retried)", dup)
	}
	log := a.Sim.Admissions(0)
	for _, w := range []time.Duration{time.Second, 10 * time.Second, time.Minute} {
		got, bound := sim.MaxInWindow(log, w), limits.MaxAdmissible(w)
		if got.Tokens > bound.Tokens || got.Requests > bound.Requests {
			t.Fatalf("in a %v window the provider admitted %+v, beyond its limits' %+v", w, got, bound)
		}
		t.Logf("window %v: admitted at most %d tokens, %d requests (limits allow %d, %d)", w, got.Tokens, got.Requests, bound.Tokens, bound.Requests)
	}
}

func countStatus(ctx context.Context, a *apptest.App, tenant string, st store.JobStatus) (int, error) {
	n, after := 0, ""
	for {
		jobs, more, err := a.Store.JobList(ctx, &store.JobListParams{TenantID: tenant, Status: st, Limit: 1000, After: after})
		if err != nil {
			return 0, err
		}
		n += len(jobs)
		if !more {
			return n, nil
		}
		after = jobs[len(jobs)-1].ID
	}
}
