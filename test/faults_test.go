package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// fastPolicy is apptest's policy with a short provider timeout, so hung
// calls end quickly.
var fastPolicy = strings.Replace(apptest.PolicyYAML, "timeout: 10s", "timeout: 2s", 1)

// submitAll posts n jobs from producers goroutines and returns their ids.
func submitAll(t *testing.T, a *apptest.App, key string, n, producers, maxTokens int) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	per := (n + producers - 1) / producers
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := p * per; i < min(n, (p+1)*per); i++ {
				cid := fmt.Sprintf("req-%05d", i)
				r := apptest.Do(t, a.URL, "POST", "/v1/jobs", key,
					map[string]any{"custom_id": cid, "body": apptest.ChatBody("Job "+cid, cid, maxTokens)}, nil)
				if r.Status != 202 {
					errs <- fmt.Errorf("job %d: %d %s", i, r.Status, r.Body)
					return
				}
				var j struct{ ID string }
				if err := json.Unmarshal(r.Body, &j); err != nil {
					errs <- err
					return
				}
				ids[i] = j.ID
			}
		}(p)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ids
}

// allEnd waits until every job is terminal and returns them.
func allEnd(t *testing.T, a *apptest.App, ids []string, timeout time.Duration) []*store.Job {
	t.Helper()
	ctx := context.Background()
	jobs := make([]*store.Job, len(ids))
	eventually(t, timeout, func() bool {
		for i, id := range ids {
			if jobs[i] != nil && jobs[i].Status.Terminal() {
				continue
			}
			j, err := a.Store.JobGetByID(ctx, id)
			if err != nil || !j.Status.Terminal() {
				return false
			}
			jobs[i] = j
		}
		return true
	}, "all %d jobs end", len(ids))
	return jobs
}

// chargedOnce checks that every succeeded job has exactly its own ledger
// row at its own cost and that no other job was charged.
func chargedOnce(t *testing.T, a *apptest.App, tenant string, jobs []*store.Job) money.Micros {
	t.Helper()
	ctx := context.Background()
	var want money.Micros
	succeeded := 0
	for _, j := range jobs {
		e, err := a.Store.UsageGetByJob(ctx, j.ID)
		switch {
		case j.Status == store.JobSucceeded:
			succeeded++
			want += j.Cost
			if err != nil || e.Cost != j.Cost {
				t.Fatalf("succeeded job %s: ledger %+v, %v; want its cost %d", j.ID, e, err, j.Cost)
			}
		case err == nil:
			// A call whose result arrived after the job was cancelled or
			// failed is still charged: the provider billed it.
			want += e.Cost
		}
	}
	rows, err := a.Store.UsageReport(ctx, &store.UsageReportParams{Day: time.Now().UTC().Format(time.DateOnly), TenantID: tenant})
	if err != nil {
		t.Fatal(err)
	}
	var got money.Micros
	var n int64
	for _, r := range rows {
		got += r.Cost
		n += r.Requests
	}
	if got != want || n < int64(succeeded) {
		t.Fatalf("ledger holds %d rows costing %d; want %d succeeded jobs costing %d, each charged once", n, got, succeeded, want)
	}
	return got
}

// TestFaultsEveryJobEnds: with 20% spurious 429s, 5% 500s and 2% hung
// calls, 1,000 jobs through two worker processes all end — succeeded, or
// failed saying which ceiling they passed — and each succeeded job is
// charged once.
func TestFaultsEveryJobEnds(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fastPolicy, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 30000, TPM: 3000000}, DefaultMaxTokens: 1024, Echo: true, Seed: 11,
		Latency: 5 * time.Millisecond, Jitter: 10 * time.Millisecond,
		Faults: sim.Faults{Rate429: 0.20, Rate500: 0.05, RateHang: 0.02, RetryAfter429: 100 * time.Millisecond},
	}})
	for i := 0; i < 2; i++ {
		startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=40").waitForOutput(t, "worker running")
	}
	tenant, key := a.Tenant("standard")
	ids := submitAll(t, a, key, 1000, 10, 20)
	jobs := allEnd(t, a, ids, 4*time.Minute)
	failed := 0
	for _, j := range jobs {
		switch j.Status {
		case store.JobSucceeded:
		case store.JobFailed:
			failed++
			if j.Error == nil || (!strings.Contains(j.Error.Message, "giving up")) {
				t.Fatalf("job %s failed without saying which ceiling it passed: %+v", j.ID, j.Error)
			}
		default:
			t.Fatalf("job %s ended %s", j.ID, j.Status)
		}
	}
	chargedOnce(t, a, tenant, jobs)
	st := a.Sim.Stats()
	t.Logf("1000 jobs: %d failed at a ceiling; provider saw %d requests (%d spurious 429, %d 500, %d hung)",
		failed, st.Requests, st.Spurious429, st.Errors500, st.Hung)
}

// TestSIGKILLWorkerMidRun: one of two worker processes is killed with
// SIGKILL while calls are in flight. Its jobs come back (asynq's lease
// recovery) and every job succeeds, charged once.
func TestSIGKILLWorkerMidRun(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 30000, TPM: 3000000}, DefaultMaxTokens: 1024, Echo: true,
		Latency: 400 * time.Millisecond, Jitter: 400 * time.Millisecond,
	}})
	victim := startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=20")
	victim.waitForOutput(t, "worker running")
	startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=20").waitForOutput(t, "worker running")
	tenant, key := a.Tenant("standard")
	ids := submitAll(t, a, key, 300, 5, 20)
	// Kill once both workers have calls in flight.
	eventually(t, 30*time.Second, func() bool { return a.Sim.Stats().InFlight >= 30 }, "calls are in flight")
	victim.signal(syscall.SIGKILL)
	<-victim.done
	killed := time.Now()
	jobs := allEnd(t, a, ids, 3*time.Minute)
	for _, j := range jobs {
		if j.Status != store.JobSucceeded {
			t.Fatalf("job %s ended %s: %+v", j.ID, j.Status, j.Error)
		}
	}
	chargedOnce(t, a, tenant, jobs)
	t.Logf("all 300 jobs succeeded %v after the SIGKILL; the provider saw %d calls for 300 jobs",
		time.Since(killed).Round(time.Second), a.Sim.Stats().Admitted)
}

// TestFLUSHALLMidRun: Redis loses everything while jobs run; the
// dispatcher's reconciler re-enqueues them from the store and every job
// still ends, charged once.
func TestFLUSHALLMidRun(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/0", Sim: &sim.Config{
		Limits: sim.Limits{RPM: 30000, TPM: 3000000}, DefaultMaxTokens: 1024, Echo: true,
		Latency: 100 * time.Millisecond, Jitter: 100 * time.Millisecond,
	}})
	startProcess(t, a, "dispatcher", "LLMQ_LISTEN_ADDR=127.0.0.1:0").waitForOutput(t, "listening")
	startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=10").waitForOutput(t, "worker running")
	tenant, key := a.Tenant("standard")
	ids := submitAll(t, a, key, 300, 5, 20)
	eventually(t, 30*time.Second, func() bool { return a.Sim.Stats().Admitted >= 50 }, "50 calls made")
	if err := a.Redis.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	jobs := allEnd(t, a, ids, 3*time.Minute)
	for _, j := range jobs {
		if j.Status != store.JobSucceeded {
			t.Fatalf("job %s ended %s: %+v", j.ID, j.Status, j.Error)
		}
	}
	chargedOnce(t, a, tenant, jobs)
	t.Logf("all 300 jobs succeeded %v after FLUSHALL", time.Since(flushed).Round(time.Second))
}

// TestNoRequestBeforeTheAnnouncedReset: the policy promises twice the
// account's real limits and the provider also answers 3% spurious 429s that
// announce a 1 s wait. After each 429, no worker sends anything on that
// model until the announced reset, but the single probe. Requests already on
// their way when the 429 was sent (arriving within slack of it) are not
// held against the workers.
func TestNoRequestBeforeTheAnnouncedReset(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 1500, TPM: 150000}, DefaultMaxTokens: 1024, Echo: true, Seed: 5,
		Latency: 20 * time.Millisecond, Jitter: 20 * time.Millisecond,
		Faults: sim.Faults{Rate429: 0.03, RetryAfter429: time.Second},
	}})
	for i := 0; i < 2; i++ {
		startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=25").waitForOutput(t, "worker running")
	}
	_, key := a.Tenant("standard")
	ids := submitAll(t, a, key, 400, 10, 200)
	allEnd(t, a, ids, 3*time.Minute)

	const slack = 100 * time.Millisecond
	log := a.Sim.Admissions(0)
	penalties, worst := 0, 0
	for i, e := range log {
		if e.Outcome != sim.RateLimited && e.Outcome != sim.Spurious429 || e.RetryAfter < 2*slack {
			continue
		}
		penalties++
		from, until := e.Time.Add(slack), e.Time.Add(e.RetryAfter)
		inside := 0
		for _, later := range log[i+1:] {
			if !later.Time.Before(from) && later.Time.Before(until) {
				inside++
			}
		}
		worst = max(worst, inside)
	}
	if penalties == 0 {
		t.Fatal("the provider never answered a 429 announcing a wait: nothing was tested")
	}
	if worst > 1 {
		t.Fatalf("after a 429, %d requests arrived before the announced reset; at most the one probe may", worst)
	}
	t.Logf("%d requests, %d 429s announcing a wait; at most %d request arrived inside one of those waits", len(log), penalties, worst)
}

// TestSIGTERMGracePeriod: a worker told to stop lets its in-flight calls
// finish within LLMQ_SHUTDOWN_TIMEOUT; calls still running after it go
// back to the queue without counting as failures, and another worker
// finishes them.
func TestSIGTERMGracePeriod(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 30000, TPM: 3000000}, DefaultMaxTokens: 1024, Echo: true,
		Latency: 1500 * time.Millisecond,
	}})
	tenant, key := a.Tenant("standard")
	ctx := context.Background()

	// A generous grace period: the calls in flight finish, nothing is requeued.
	graceful := startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=10", "LLMQ_SHUTDOWN_TIMEOUT=10s")
	graceful.waitForOutput(t, "worker running")
	first := submitAll(t, a, key, 10, 2, 20)
	eventually(t, 20*time.Second, func() bool { return a.Sim.Stats().InFlight == 10 }, "10 calls in flight")
	graceful.signal(syscall.SIGTERM)
	<-graceful.done
	for _, j := range allEnd(t, a, first, 5*time.Second) {
		if j.Status != store.JobSucceeded || j.Attempts != 1 {
			t.Fatalf("job %s in flight at SIGTERM: %s after %d attempts; want finished in the grace period", j.ID, j.Status, j.Attempts)
		}
	}

	// A short grace period: the calls are abandoned and their jobs go back
	// to the queue, not counted as failures; another worker runs them.
	short := startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=10", "LLMQ_SHUTDOWN_TIMEOUT=200ms")
	short.waitForOutput(t, "worker running")
	second := submitAll(t, a, key, 10, 2, 20)
	eventually(t, 20*time.Second, func() bool { return a.Sim.Stats().InFlight == 10 }, "10 calls in flight")
	stopped := time.Now()
	short.signal(syscall.SIGTERM)
	<-short.done
	if d := time.Since(stopped); d > 5*time.Second {
		t.Fatalf("worker took %v to stop with a 200ms grace period", d)
	}
	for _, id := range second {
		j, err := a.Store.JobGetByID(ctx, id)
		if err != nil || j.Status.Terminal() {
			t.Fatalf("job %s: %v %v; want it back in the queue", id, j.Status, err)
		}
	}
	startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=10").waitForOutput(t, "worker running")
	jobs := allEnd(t, a, second, time.Minute)
	for _, j := range jobs {
		if j.Status != store.JobSucceeded || j.Error != nil {
			t.Fatalf("job %s requeued at shutdown ended %s: %+v", j.ID, j.Status, j.Error)
		}
	}
	chargedOnce(t, a, tenant, append(allEnd(t, a, first, time.Second), jobs...))
}
