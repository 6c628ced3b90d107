package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/pacer"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

const redisDB = 4

func start(t *testing.T, simCfg *sim.Config) *apptest.App {
	t.Helper()
	return apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: simCfg})
}

// submit creates a job over the API and returns its id.
func submit(t *testing.T, a *apptest.App, key string, body map[string]any) string {
	t.Helper()
	r := a.Do("POST", "/v1/jobs", key, body)
	if r.Status != 202 {
		t.Fatalf("submit: %d %s", r.Status, r.Body)
	}
	return r.Map(t)["id"].(string)
}

func job(t *testing.T, a *apptest.App, id string) *store.Job {
	t.Helper()
	j, err := a.Store.JobGetByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestChatAndEmbeddingJobsSucceedAndAreChargedExactly(t *testing.T) {
	t.Parallel()
	a := start(t, nil)
	tenant, key := a.Tenant("standard")
	h := a.JobHandler(worker.Options{})
	ctx := context.Background()

	chat := submit(t, a, key, map[string]any{"body": apptest.ChatBody("Write a haiku about queues.", "chat-1", 40)})
	emb := submit(t, a, key, map[string]any{"endpoint": "/v1/embeddings",
		"body": map[string]any{"model": "text-embedding-3-small", "input": []string{"alpha", "beta gamma"}}})
	for _, id := range []string{chat, emb} {
		if err := h.Run(ctx, id); err != nil {
			t.Fatalf("run %s: %v", id, err)
		}
	}
	p := a.Policy.Current()
	var total money.Micros
	for _, id := range []string{chat, emb} {
		j := job(t, a, id)
		if j.Status != store.JobSucceeded || j.Attempts != 1 || j.ResponseStatus != 200 || j.FinishedAt == nil {
			t.Fatalf("job %s: status %s attempts %d response %d", id, j.Status, j.Attempts, j.ResponseStatus)
		}
		m, _ := p.Model(j.Model)
		want := m.Deployments[0].Price.Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens})
		if j.Cost != want || j.Cost <= 0 {
			t.Fatalf("job %s cost %d, want %d (= usage × price)", id, j.Cost, want)
		}
		e, err := a.Store.UsageGetByJob(ctx, id)
		if err != nil || e.Cost != want || e.PromptTokens != j.PromptTokens || e.CompletionTokens != j.CompletionTokens {
			t.Fatalf("ledger of %s = %+v, %v", id, e, err)
		}
		total += want
	}
	// The chat answer is the simulator's answer to this request.
	var body struct {
		Choices []struct{ Message struct{ Content string } } `json:"choices"`
	}
	if err := json.Unmarshal(job(t, a, chat).ResponseBody, &body); err != nil || !strings.HasPrefix(body.Choices[0].Message.Content, "chat-1 ") {
		t.Fatalf("chat response = %s (%v)", job(t, a, chat).ResponseBody, err)
	}
	var embBody struct {
		Data []struct{ Embedding []float64 } `json:"data"`
	}
	if err := json.Unmarshal(job(t, a, emb).ResponseBody, &embBody); err != nil || len(embBody.Data) != 2 || len(embBody.Data[0].Embedding) != 64 {
		t.Fatalf("embedding response: %v, %d items", err, len(embBody.Data))
	}
	// The budget settled at the real cost, nothing left reserved.
	acctTenant, err := a.Store.TenantGetByID(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	u := a.Do("GET", "/v1/usage", key, nil).Map(t)
	if got := money.Micros(u["spent_usd"].(float64)*1e6 + 0.5); got != total || u["reserved_usd"].(float64) != 0 {
		t.Fatalf("usage of %s = %v, want spent %d µ$", acctTenant.ID, u, total)
	}
}

func TestRedeliveryAfterSuccessNeverCallsTheProviderAgain(t *testing.T) {
	t.Parallel()
	a := start(t, nil)
	tenant, key := a.Tenant("standard")
	h := a.JobHandler(worker.Options{})
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("once", "", 10)})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := h.Run(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.Sim.Stats().Requests; n != 1 {
		t.Fatalf("provider called %d times for one job delivered three times", n)
	}
	j := job(t, a, id)
	if j.Status != store.JobSucceeded || j.Attempts != 1 || j.Cost <= 0 {
		t.Fatalf("job = %s attempts %d cost %d", j.Status, j.Attempts, j.Cost)
	}
	// One ledger row, at the job's cost, and the day's spend is that cost.
	e, err := a.Store.UsageGetByJob(ctx, id)
	if err != nil || e.Cost != j.Cost {
		t.Fatalf("ledger row of the job = %+v, %v; want its cost %d", e, err, j.Cost)
	}
	rows, err := a.Store.UsageReport(ctx, &store.UsageReportParams{Day: e.Day, TenantID: tenant})
	if err != nil {
		t.Fatal(err)
	}
	var requests int64
	var cost money.Micros
	for _, r := range rows {
		requests, cost = requests+r.Requests, cost+r.Cost
	}
	if requests != 1 || cost != j.Cost {
		t.Fatalf("the tenant's ledger holds %d rows costing %d; want one row costing %d", requests, cost, j.Cost)
	}
	u := a.Do("GET", "/v1/usage", key, nil).Map(t)
	if spent := money.Micros(u["spent_usd"].(float64)*1e6 + 0.5); spent != j.Cost || u["reserved_usd"].(float64) != 0 {
		t.Fatalf("usage after three deliveries = %v; want spent %d µ$ (the job's cost) and nothing reserved", u, j.Cost)
	}
}

func TestPermanentProviderErrorFailsAtOnceWithItsMessage(t *testing.T) {
	t.Parallel()
	// The simulator knows no model, so it answers 404 model_not_found.
	a := start(t, &sim.Config{OnlyKnownModels: true})
	_, key := a.Tenant("standard")
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	if err := a.JobHandler(worker.Options{}).Run(context.Background(), id); err != nil {
		t.Fatalf("a permanent error should ack the task, got %v", err)
	}
	j := job(t, a, id)
	if j.Status != store.JobFailed || j.Error == nil || j.Error.Code != client.CodeModelNotFound || !strings.Contains(j.Error.Message, "does not exist") || j.ResponseStatus != 404 {
		t.Fatalf("job = %s %+v (response %d)", j.Status, j.Error, j.ResponseStatus)
	}
	if _, err := a.Store.UsageGetByJob(context.Background(), id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failed job was charged: %v", err)
	}
	if u := a.Do("GET", "/v1/usage", key, nil).Map(t); u["reserved_usd"].(float64) != 0 || u["spent_usd"].(float64) != 0 {
		t.Fatalf("budget after failure = %v", u)
	}
}

func TestRateLimitedCallIsNotAFailureAndPausesTheScope(t *testing.T) {
	t.Parallel()
	a := start(t, &sim.Config{Faults: sim.Faults{Rate429: 1, RetryAfter429: 3 * time.Second}})
	_, key := a.Tenant("standard")
	h := a.JobHandler(worker.Options{MaxRateLimited: 2})
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 1000)})
	ctx := context.Background()

	began := time.Now()
	err := h.Run(ctx, id)
	if err == nil || queue.IsFailure(err) {
		t.Fatalf("a 429 must requeue without counting a failure, got %v", err)
	}
	if d := queue.RetryDelay(0, err, nil); d < 3*time.Second || d > 4*time.Second {
		t.Fatalf("retry delay %v, want the provider's 3s", d)
	}
	j := job(t, a, id)
	if j.Status != store.JobWaiting || j.RateLimited != 1 || j.NextRunAt == nil {
		t.Fatalf("job = %s rate_limited %d next %v", j.Status, j.RateLimited, j.NextRunAt)
	}
	// The scope is penalized: nobody, in any process, calls until the reset.
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	res, err := a.Limiter.Reserve(ctx, scopeOf(m), costOne)
	if err != nil || res.Allowed || !res.Penalized || res.RetryAfter < 2*time.Second {
		t.Fatalf("reserve after 429 = %+v, %v", res, err)
	}
	// The refused call's tokens stay charged: the 429 showed the buckets
	// were ahead of the provider's.
	// About 1,000 tokens, which take 200 ms to refill at 300,000 TPM: the
	// bucket may hold what refilled since the call (a loaded machine takes
	// longer between the call and this check), and not the call's tokens.
	cost := j.EstPromptTokens + j.EstMaxTokens
	refilled := int64(time.Since(began).Seconds() * 300000 / 60)
	for _, b := range res.Buckets {
		if b.Name == "tpm" && b.Remaining > 300000-cost+refilled+cost/10 {
			t.Fatalf("tpm remaining %d %v after a 429: the refused call's %d tokens were given back", b.Remaining, time.Since(began), cost)
		}
	}
	// A second 429 hits the ceiling: the job fails, saying why.
	clearPenalty(t, a)
	if err := h.Run(ctx, id); err != nil {
		t.Fatalf("run at the ceiling: %v", err)
	}
	j = job(t, a, id)
	if j.Status != store.JobFailed || j.Error.Code != client.CodeRateLimitExceeded || !strings.Contains(j.Error.Message, "2 times") {
		t.Fatalf("job at the ceiling = %s %+v", j.Status, j.Error)
	}
}

// startRefusing starts a test app whose only provider answers every call
// with a 429 carrying header (and nothing else), and returns it.
func startRefusing(t *testing.T, header http.Header) *apptest.App {
	t.Helper()
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for k, v := range header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"message":"Rate limit reached.","type":"requests","code":"rate_limit_exceeded"}}`))
	}))
	t.Cleanup(provider.Close)
	return apptest.Start(t, apptest.Options{RedisDB: redisDB,
		Policy: strings.Replace(apptest.PolicyYAML, "{{SIM}}", provider.URL+"/v1", 1)})
}

// rateLimitedOnce runs a new job into the provider's 429 and returns the
// wait the job was put back for and the pause left on the model's scope.
func rateLimitedOnce(t *testing.T, a *apptest.App, h *worker.Handler, id string) (delay, pause time.Duration) {
	t.Helper()
	ctx := context.Background()
	// The pause starts inside Run, after this and before Run returns.
	began := time.Now()
	runErr := h.Run(ctx, id)
	if runErr == nil || queue.IsFailure(runErr) {
		t.Fatalf("a 429 must requeue without counting a failure, got %v", runErr)
	}
	delay = queue.RetryDelay(0, runErr, nil)
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	st, err := a.Limiter.State(ctx, scopeOf(m))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Penalized {
		// A jittered pause can be as short as 50ms: on a starved CPU it
		// may be over before the state is read (or even before Run
		// returns), but not before delay has passed since Run began.
		if time.Since(began) < delay {
			t.Fatalf("scope not paused after a 429: %+v", st)
		}
		return delay, 0
	}
	return delay, st.RetryAfter
}

func TestRateLimitResetHeadersSetThePenalty(t *testing.T) {
	t.Parallel()
	// No retry-after: the longer of the two resets is the wait.
	a := startRefusing(t, http.Header{"X-Ratelimit-Reset-Requests": {"7s"}, "X-Ratelimit-Reset-Tokens": {"2.5s"}})
	_, key := a.Tenant("standard")
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	delay, pause := rateLimitedOnce(t, a, a.JobHandler(worker.Options{}), id)
	if delay != 7*time.Second || pause > 7*time.Second || pause < 6*time.Second {
		t.Fatalf("requeued for %v, scope paused for %v; want both the announced 7s reset", delay, pause)
	}
	if j := job(t, a, id); j.Status != store.JobWaiting || j.RateLimited != 1 || j.NextRunAt == nil {
		t.Fatalf("job = %s rate_limited %d next %v", j.Status, j.RateLimited, j.NextRunAt)
	}
}

func TestRateLimitWaitIsCapped(t *testing.T) {
	t.Parallel()
	a := startRefusing(t, http.Header{"Retry-After": {"600"}, "X-Ratelimit-Reset-Requests": {"10m0s"}})
	_, key := a.Tenant("standard")
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	delay, pause := rateLimitedOnce(t, a, a.JobHandler(worker.Options{}), id)
	if delay != 120*time.Second || pause > 120*time.Second || pause < 119*time.Second {
		t.Fatalf("requeued for %v, scope paused for %v; want MaxRateLimitWait's 120s, not the announced 10m", delay, pause)
	}
}

func TestRateLimitWithoutHeadersBacksOffWithFullJitter(t *testing.T) {
	t.Parallel()
	a := startRefusing(t, nil)
	_, key := a.Tenant("standard")
	h := a.JobHandler(worker.Options{})
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	// The n-th 429 of a job (from 0) waits uniformly up to 500ms·2ⁿ
	// (capped at 8s), and at least 50ms.
	var waits []time.Duration
	for n := 0; n < 6; n++ {
		delay, pause := rateLimitedOnce(t, a, h, id)
		ceil := min(500*time.Millisecond<<n, 8*time.Second)
		if delay < 50*time.Millisecond || delay > ceil || pause > delay {
			t.Fatalf("429 number %d: requeued for %v, scope paused for %v; want one wait within [50ms, %v]", n+1, delay, pause, ceil)
		}
		if j := job(t, a, id); j.Status != store.JobWaiting || j.RateLimited != n+1 {
			t.Fatalf("after 429 number %d: %s, rate_limited %d", n+1, j.Status, j.RateLimited)
		}
		waits = append(waits, delay)
		clearPenalty(t, a)
	}
	if waits[0] == waits[1] && waits[1] == waits[2] {
		t.Fatalf("waits %v: not jittered", waits)
	}
}

func TestProviderFaultIsRetriedAsAFailure(t *testing.T) {
	t.Parallel()
	a := start(t, &sim.Config{Faults: sim.Faults{Rate500: 1}})
	_, key := a.Tenant("standard")
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	err := a.JobHandler(worker.Options{}).Run(context.Background(), id)
	if err == nil || !queue.IsFailure(err) {
		t.Fatalf("a 500 must be a counted failure, got %v", err)
	}
	if j := job(t, a, id); j.Status != store.JobWaiting || j.Attempts != 1 {
		t.Fatalf("job = %s attempts %d", j.Status, j.Attempts)
	}
	if u := a.Do("GET", "/v1/usage", key, nil).Map(t); u["reserved_usd"].(float64) != 0 {
		t.Fatalf("reservation kept after a fault: %v", u)
	}
}

// The ceiling on provider faults is the job's own count, not only asynq's
// count of the task's failed deliveries, which starts again when the
// reconciler revives an archived task: a job whose attempts (429s aside)
// already reached it fails at its next fault, on a fresh task.
func TestFaultCeilingCountsTheJobsAttempts(t *testing.T) {
	t.Parallel()
	a := start(t, &sim.Config{Faults: sim.Faults{Rate500: 1}})
	_, key := a.Tenant("standard")
	ctx := context.Background()
	count := func(id string, n int) {
		t.Helper()
		for range n {
			if _, _, err := a.Store.JobSetStatus(ctx, &store.JobSetStatusParams{ID: id,
				From: []store.JobStatus{store.JobQueued, store.JobWaiting}, To: store.JobWaiting, CountAttempt: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	spent := submit(t, a, key, map[string]any{"body": apptest.ChatBody("spent", "", 5)})
	count(spent, queue.DefaultMaxRetry)
	room := submit(t, a, key, map[string]any{"body": apptest.ChatBody("room", "", 5)})
	count(room, queue.DefaultMaxRetry+2)
	for range 3 {
		if _, err := a.Store.JobIncrRateLimited(ctx, room); err != nil { // three of its attempts were 429s
			t.Fatal(err)
		}
	}
	h := a.JobHandler(worker.Options{})
	if err := h.Run(ctx, spent); err != nil {
		t.Fatalf("the fault past the ceiling: %v, want the job failed and the task acked", err)
	}
	if j := job(t, a, spent); j.Status != store.JobFailed || j.Error == nil ||
		!strings.Contains(j.Error.Message, fmt.Sprintf("failed %d times; giving up", queue.DefaultMaxRetry+1)) {
		t.Fatalf("job = %s, error %+v", j.Status, j.Error)
	}
	if err := h.Run(ctx, room); err == nil || !queue.IsFailure(err) {
		t.Fatalf("a fault under the ceiling must be retried as a failure, got %v", err)
	}
	if j := job(t, a, room); j.Status != store.JobWaiting {
		t.Fatalf("job under the ceiling = %s", j.Status)
	}
}

func TestCancelledJobIsNeverCalled(t *testing.T) {
	t.Parallel()
	a := start(t, nil)
	_, key := a.Tenant("standard")
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	if r := a.Do("DELETE", "/v1/jobs/"+id, key, nil); r.Status != 200 {
		t.Fatalf("cancel: %d", r.Status)
	}
	if err := a.JobHandler(worker.Options{}).Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if n := a.Sim.Stats().Requests; n != 0 {
		t.Fatalf("provider called %d times for a cancelled job", n)
	}
	if err := a.JobHandler(worker.Options{}).Run(context.Background(), "job_01doesnotexist000000000000"); err != nil {
		t.Fatalf("a task for a missing job must be acked, got %v", err)
	}
}

func TestLongLimiterWaitRequeuesTheJob(t *testing.T) {
	t.Parallel()
	a := start(t, nil)
	_, key := a.Tenant("standard")
	ctx := context.Background()
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	// 35 requests at once, more than the request bucket's burst (half a
	// second of 3,000 RPM, 25): its pace is 10 in debt, 200 ms of refill.
	if res, err := a.Limiter.Reserve(ctx, scopeOf(m), limiterCost(35, 0)); err != nil || !res.Allowed {
		t.Fatalf("reserve: %v %+v", err, res)
	}
	err := a.JobHandler(worker.Options{MaxInlineWait: time.Millisecond}).Run(ctx, id)
	if err == nil || queue.IsFailure(err) || queue.RetryDelay(0, err, nil) <= 0 {
		t.Fatalf("a long wait must requeue without failure, got %v", err)
	}
	if j := job(t, a, id); j.Status != store.JobWaiting || j.Attempts != 0 {
		t.Fatalf("job = %s attempts %d", j.Status, j.Attempts)
	}
	if u := a.Do("GET", "/v1/usage", key, nil).Map(t); u["reserved_usd"].(float64) != 0 {
		t.Fatalf("budget reservation kept while waiting: %v", u)
	}
	// With a generous inline wait the same job sleeps and runs.
	if err := a.JobHandler(worker.Options{MaxInlineWait: 5 * time.Second}).Run(ctx, id); err != nil {
		t.Fatal(err)
	}
	if j := job(t, a, id); j.Status != store.JobSucceeded {
		t.Fatalf("job = %s", j.Status)
	}
}

func TestFullJitterStaysInBounds(t *testing.T) {
	t.Parallel()
	for n := 0; n < 40; n++ {
		for i := 0; i < 50; i++ {
			d := queue.FullJitter(n, time.Second, time.Minute)
			if d < 100*time.Millisecond || d > time.Minute || (n < 5 && d > time.Second<<uint(n)) {
				t.Fatalf("FullJitter(%d) = %v out of bounds", n, d)
			}
		}
	}
}

func TestBreakerStopsCallingAFailingProvider(t *testing.T) {
	t.Parallel()
	a := start(t, &sim.Config{Faults: sim.Faults{Rate500: 1}})
	_, key := a.Tenant("standard")
	h := a.JobHandler(worker.Options{Breakers: worker.BreakerOptions{Failures: 3, Cooldown: time.Minute}})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
		if err := h.Run(ctx, id); err == nil || !queue.IsFailure(err) {
			t.Fatalf("fault %d: %v", i, err)
		}
	}
	if st := h.BreakerState("sim/gpt-4o-mini"); st != worker.BreakerOpen {
		t.Fatalf("breaker = %s after 3 straight 500s", st)
	}
	calls := a.Sim.Stats().Requests
	id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})
	err := h.Run(ctx, id)
	if err == nil || queue.IsFailure(err) || queue.RetryDelay(0, err, nil) < 50*time.Second {
		t.Fatalf("with the circuit open the job must wait without failing, got %v", err)
	}
	if a.Sim.Stats().Requests != calls {
		t.Fatal("the provider was called with its circuit open")
	}
	if j := job(t, a, id); j.Status != store.JobWaiting || j.Attempts != 0 {
		t.Fatalf("job = %s attempts %d", j.Status, j.Attempts)
	}
}

func TestLearnedLimitsShrinkAndGrowBack(t *testing.T) {
	t.Parallel()
	// The policy says 3,000 RPM and 300,000 TPM; the account really has half.
	a := start(t, &sim.Config{Limits: sim.Limits{RPM: 1500, TPM: 150000}, DefaultMaxTokens: 1024})
	_, key := a.Tenant("standard")
	h := a.JobHandler(worker.Options{})
	ctx := context.Background()
	learned := pacer.NewLearned(a.Redis, a.Keys, nil, nil)
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	limits := func() map[string]int64 {
		out := map[string]int64{}
		for _, b := range learned.Scope(ctx, m.Routes()[0]).Buckets {
			out[b.Name] = b.Limit
		}
		return out
	}
	if got := limits(); got["rpm"] != 3000 || got["tpm"] != 300000 {
		t.Fatalf("before any answer: %v, want the policy's", got)
	}
	if err := h.Run(ctx, submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})); err != nil {
		t.Fatal(err)
	}
	waitLearned := func(rpm, tpm int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got := limits()
			if got["rpm"] == rpm && got["tpm"] == tpm {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("limits = %v, want rpm %d tpm %d", got, rpm, tpm)
			}
			time.Sleep(50 * time.Millisecond) // the learned limits are cached for a second
		}
	}
	waitLearned(1500, 150000)
	// The provider raises the account above the policy: back to the policy.
	a.Sim.SetLimits(6000, 600000)
	if err := h.Run(ctx, submit(t, a, key, map[string]any{"body": apptest.ChatBody("x", "", 5)})); err != nil {
		t.Fatal(err)
	}
	waitLearned(3000, 300000)
}
