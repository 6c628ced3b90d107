package offload_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisDB is shared with internal/redisclock, whose scripts write nothing;
// each test app has its own key prefix and queue namespace.
const redisDB = 14

// policy prices the model at $2 and $8 per million tokens: a call's cost
// in micro-dollars is then a whole number at both prices, so the batch
// price is exactly half.
const policy = `
providers:
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, timeout: 10s}
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 2, output_per_mtok: 8}
    limits: {rpm: 3000, tpm: 300000}
    max_output_tokens: 1024
tiers:
  - {name: bulk, daily_budget_usd: 500, api_rps: 1000, batch_offload: auto}
  - {name: plain, daily_budget_usd: 500, api_rps: 1000}
`

// clock is a settable clock shared by the simulator and the offloader.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type harness struct {
	*apptest.App
	t     *testing.T
	clock *clock
}

func start(t *testing.T, batch sim.BatchConfig, workers int) *harness {
	t.Helper()
	c := &clock{t: time.Now()}
	cfg := sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Echo: true, Now: c.Now, Batch: batch}
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: policy, Sim: &cfg, Workers: workers,
		Offload: offload.Options{Now: c.Now, PollMin: time.Second, PollMax: 5 * time.Second, RetryAfter: 5 * time.Second}})
	return &harness{App: a, t: t, clock: c}
}

// submit uploads a batch of n chat lines for a tenant of tier and returns
// its id.
func (h *harness) submit(tier string, n int) (tenantID, key, batchID string) {
	h.t.Helper()
	return h.submitTo(llm.EndpointChat, tier, n)
}

// submitTo uploads a batch of n lines to endpoint (chat completions or
// responses) for a tenant of tier and returns its id.
func (h *harness) submitTo(endpoint, tier string, n int) (tenantID, key, batchID string) {
	h.t.Helper()
	tenantID, key = h.Tenant(tier)
	var in bytes.Buffer
	for i := range n {
		var body any = apptest.ChatBody(fmt.Sprintf("line %d of a batch", i), "", 20)
		if endpoint == llm.EndpointResponses {
			body = map[string]any{"model": "gpt-4o-mini", "input": fmt.Sprintf("line %d of a batch", i), "max_output_tokens": 20}
		}
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("c%05d", i), "method": "POST", "url": endpoint, "body": body})
		in.Write(line)
		in.WriteByte('\n')
	}
	f, err := h.Store.FileInsert(h.t.Context(), &store.FileInsertParams{TenantID: tenantID, Purpose: store.FilePurposeBatch,
		Filename: "in.jsonl", Content: &in})
	if err != nil {
		h.t.Fatal(err)
	}
	r := h.Do("POST", "/v1/batches", key, map[string]any{"input_file_id": f.ID, "endpoint": endpoint, "completion_window": "24h"})
	var b struct {
		ID string `json:"id"`
	}
	r.JSON(h.t, &b)
	if r.Status != 200 || b.ID == "" {
		h.t.Fatalf("create batch: %d %s", r.Status, r.Body)
	}
	return tenantID, key, b.ID
}

// run sweeps the offloader and the batch sweeper, a simulated second at a
// time, until the batch ends (or fails the test after limit rounds).
func (h *harness) run(batchID string, limit int, each func(round int)) *store.Batch {
	h.t.Helper()
	ctx := h.t.Context()
	for round := range limit {
		if each != nil {
			each(round)
		}
		if err := h.Offload.Sweep(ctx); err != nil {
			h.t.Logf("offload sweep: %v", err)
		}
		if err := h.Batches.Sweep(ctx); err != nil {
			h.t.Fatal(err)
		}
		b, err := h.Store.BatchGetByID(ctx, batchID)
		if err != nil {
			h.t.Fatal(err)
		}
		switch b.Status {
		case store.BatchCompleted, store.BatchCancelled, store.BatchExpired, store.BatchFailed:
			return b
		}
		h.clock.Add(time.Second)
		time.Sleep(5 * time.Millisecond) // the background validation and the workers
	}
	h.t.Fatalf("batch %s did not end in %d rounds", batchID, limit)
	return nil
}

// outputLines reads a batch's output file: custom_id -> its status code.
func (h *harness) outputLines(key string, b *store.Batch) map[string]int {
	h.t.Helper()
	out := map[string]int{}
	if b.OutputFileID == "" {
		return out
	}
	r := h.Do("GET", "/v1/files/"+b.OutputFileID+"/content", key, nil)
	if r.Status != 200 {
		h.t.Fatalf("output: %d %s", r.Status, r.Body)
	}
	sc := bufio.NewScanner(strings.NewReader(string(r.Body)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
			} `json:"response"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			h.t.Fatal(err)
		}
		if _, dup := out[l.CustomID]; dup {
			h.t.Fatalf("custom_id %s twice in the output", l.CustomID)
		}
		out[l.CustomID] = l.Response.StatusCode
	}
	return out
}

// charges sums the batch's ledger: every job's cost, and how many rows
// say batched; with all, every job must have been charged, its ledger row
// agreeing with the job.
func (h *harness) charges(batchID string, all bool) (jobs []*store.Job, total money.Micros, batched int) {
	h.t.Helper()
	ctx := h.t.Context()
	err := h.Store.JobStreamByBatch(ctx, batchID, nil, func(j *store.Job) error {
		jobs = append(jobs, j)
		e, err := h.Store.UsageGetByJob(ctx, j.ID)
		if errors.Is(err, store.ErrNotFound) && !all {
			return nil
		}
		if err != nil {
			return fmt.Errorf("job %s (%s): %w", j.ID, j.Status, err)
		}
		total += e.Cost
		if e.Batched {
			batched++
		}
		if e.Cost != j.Cost {
			return fmt.Errorf("job %s: ledger %d, job %d", j.ID, e.Cost, j.Cost)
		}
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return jobs, total, batched
}

// A batch of a tier with batch_offload: auto runs on the provider's Batch
// API: one part, every line answered once, in the output under its
// custom_id, each charged once at exactly half the normal price, none
// through the provider's synchronous endpoint; the budget holds nothing
// after.
func TestOffloadedBatchRunsAtHalfPrice(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{}, 0)
	const n = 300
	tenantID, key, batchID := h.submit("bulk", n)
	// While the part is at the provider, the budget holds its worst case
	// at the batch price.
	held := false
	b := h.run(batchID, 120, func(int) {
		parts, _ := h.Store.BatchPartListByBatch(t.Context(), batchID)
		if len(parts) != 1 || parts[0].State != store.PartSubmitted || held {
			return
		}
		d, err := h.Budgets.Status(t.Context(), h.Account(tenantID))
		if err != nil || d.Reserved != parts[0].Reserved || d.Reserved == 0 {
			t.Fatalf("budget while the part is at the provider: reserved %v (%v), want the part's %s", d, err, parts[0].Reserved)
		}
		held = true
	})
	if b.Status != store.BatchCompleted || !held {
		t.Fatalf("batch %s (hold seen: %v)", b.Status, held)
	}
	out := h.outputLines(key, b)
	if len(out) != n {
		t.Fatalf("output has %d lines, want %d", len(out), n)
	}
	for id, status := range out {
		if status != 200 {
			t.Fatalf("line %s: status %d", id, status)
		}
	}
	jobs, total, batched := h.charges(batchID, true)
	var normal money.Micros
	for _, j := range jobs {
		if j.Status != store.JobSucceeded || j.UsageEstimated {
			t.Fatalf("job %s: %s, usage estimated %v", j.ID, j.Status, j.UsageEstimated)
		}
		normal += money.Price{InputPerMTok: 2_000_000, OutputPerMTok: 8_000_000}.Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens})
	}
	if batched != n || total*2 != normal {
		t.Fatalf("charged %s over %d batched rows; the normal price would be %s (want exactly half)", total, batched, normal)
	}
	st := h.Sim.BatchStats()
	if st.FilesUploaded != 1 || st.BatchesCreated != 1 || st.LinesProcessed != n || st.LinesRepeated != 0 {
		t.Fatalf("simulator: %+v", st)
	}
	if s := h.Sim.Stats(); s.Requests != 0 {
		t.Fatalf("%d calls went to the synchronous endpoint", s.Requests)
	}
	d, err := h.Budgets.Status(t.Context(), h.Account(tenantID))
	if err != nil {
		t.Fatal(err)
	}
	if d.Reserved != 0 || d.Spent != total {
		t.Fatalf("budget: spent %s reserved %s, want spent %s and nothing held", d.Spent, d.Reserved, total)
	}
}

// A batch of /v1/responses lines is offloaded like chat's: its lines go
// to the provider's Batch API under url /v1/responses, each answered once
// with a response object, charged half the normal price from the
// response's input and output tokens.
func TestOffloadedResponsesBatch(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{}, 0)
	const n = 100
	_, key, batchID := h.submitTo(llm.EndpointResponses, "bulk", n)
	b := h.run(batchID, 120, nil)
	if b.Status != store.BatchCompleted {
		t.Fatalf("batch %s", b.Status)
	}
	if out := h.outputLines(key, b); len(out) != n {
		t.Fatalf("output has %d lines, want %d", len(out), n)
	}
	jobs, total, batched := h.charges(batchID, true)
	var normal money.Micros
	for _, j := range jobs {
		var resp struct {
			Object string `json:"object"`
		}
		if j.Status != store.JobSucceeded || j.UsageEstimated || j.PromptTokens == 0 || j.CompletionTokens == 0 ||
			json.Unmarshal(j.ResponseBody, &resp) != nil || resp.Object != "response" {
			t.Fatalf("job %s: %s, usage %d/%d (estimated %v), body %.200s", j.ID, j.Status, j.PromptTokens, j.CompletionTokens, j.UsageEstimated, j.ResponseBody)
		}
		normal += money.Price{InputPerMTok: 2_000_000, OutputPerMTok: 8_000_000}.Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens})
	}
	if batched != n || total*2 != normal {
		t.Fatalf("charged %s over %d batched rows; the normal price would be %s (want exactly half)", total, batched, normal)
	}
	if st := h.Sim.BatchStats(); st.BatchesCreated != 1 || st.LinesProcessed != n || st.LinesRepeated != 0 {
		t.Fatalf("simulator: %+v", st)
	}
}

// A tier without batch_offload runs its batch through llmq's own path, at
// the normal price.
func TestPlainTierDoesNotOffload(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{}, 2)
	_, key, batchID := h.submit("plain", 20)
	b := h.run(batchID, 200, nil)
	if got := h.outputLines(key, b); b.Status != store.BatchCompleted || len(got) != 20 {
		t.Fatalf("batch %s with %d output lines", b.Status, len(got))
	}
	if _, _, batched := h.charges(batchID, true); batched != 0 || h.Sim.BatchStats().BatchesCreated != 0 {
		t.Fatalf("%d lines ran batched", batched)
	}
}

// A provider batch that expires with 30% of its lines undone: those lines
// run through llmq's own path at the normal price, the output is complete,
// and each line is charged once, at the price of the path that ran it.
func TestExpiredLinesRunThroughLlmq(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{ExpireFraction: 0.3}, 2)
	const n = 200
	_, key, batchID := h.submit("bulk", n)
	b := h.run(batchID, 300, nil)
	out := h.outputLines(key, b)
	if b.Status != store.BatchCompleted || len(out) != n {
		t.Fatalf("batch %s, %d output lines; want completed with %d", b.Status, len(out), n)
	}
	jobs, _, batched := h.charges(batchID, true)
	price := money.Price{InputPerMTok: 2_000_000, OutputPerMTok: 8_000_000}
	for _, j := range jobs {
		e, _ := h.Store.UsageGetByJob(t.Context(), j.ID)
		want := price.Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens})
		if e.Batched {
			want = price.Batch().Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens})
		}
		if j.Status != store.JobSucceeded || e.Cost != want {
			t.Fatalf("job %s: %s, charged %s batched=%v, want %s", j.ID, j.Status, e.Cost, e.Batched, want)
		}
	}
	undone := n - batched
	if undone < n/5 || undone > n*2/5 {
		t.Fatalf("%d of %d lines ran through llmq, want about 30%%", undone, n)
	}
	if s := h.Sim.Stats(); s.Requests != int64(undone) {
		t.Fatalf("%d synchronous calls for %d undone lines", s.Requests, undone)
	}
	runs := h.Sim.CustomIDRuns()
	for _, j := range jobs {
		if e, _ := h.Store.UsageGetByJob(t.Context(), j.ID); e.Batched && runs[j.ID] != 1 {
			t.Fatalf("job %s answered %d times in provider batches", j.ID, runs[j.ID])
		}
	}
}

// A dispatcher that stops (a new offloader, as after a restart) while its
// part is at the provider, or right after uploading it but before storing
// the file's id, resumes: nothing uploaded or created twice, everything
// collected.
func TestResumeNeverUploadsTwice(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{LinesPerSecond: 20}, 0)
	const n = 100
	_, key, batchID := h.submit("bulk", n)
	ctx := t.Context()
	// Until the part is planned.
	var part *store.BatchPart
	for range 200 {
		parts, err := h.Store.BatchPartListByBatch(ctx, batchID)
		if err != nil {
			t.Fatal(err)
		}
		if len(parts) == 1 {
			part = parts[0]
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if part == nil {
		t.Fatal("no part planned")
	}
	// One process uploads the file, and "dies" before storing its id: the
	// part is left uploading, as a crash would leave it.
	first := offload.New(offload.Deps{Store: h.Store, Policy: h.Policy, Budgets: h.Budgets, Queue: h.Queue, Providers: h.Providers,
		Redis: h.Redis, Keys: h.Keys},
		offload.Options{Now: h.clock.Now})
	// Past the part's first check, stamped by the store's clock (real time,
	// which a loaded machine moved on past the harness's start).
	h.clock.Add(max(2*time.Second, part.NextCheckAt.Sub(h.clock.Now())+time.Second))
	if err := first.Step(ctx, part.ID); err != nil {
		t.Fatal(err)
	}
	p, _ := h.Store.BatchPartGet(ctx, part.ID)
	if p.State != store.PartSubmitted || h.Sim.BatchStats().FilesUploaded != 1 {
		t.Fatalf("after one step: %s, %+v", p.State, h.Sim.BatchStats())
	}
	p.State, p.ProviderBatchID, p.ProviderFileID = store.PartUploading, "", ""
	if ok, err := h.Store.BatchPartSave(ctx, p, store.PartSubmitted); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// A new process picks it up: it finds the file and the batch at the
	// provider instead of making them again.
	b := h.run(batchID, 200, nil)
	if b.Status != store.BatchCompleted || len(h.outputLines(key, b)) != n {
		t.Fatalf("batch %s", b.Status)
	}
	if st := h.Sim.BatchStats(); st.FilesUploaded != 1 || st.BatchesCreated != 1 || st.LinesRepeated != 0 {
		t.Fatalf("simulator after the resume: %+v", st)
	}
	if _, _, batched := h.charges(batchID, true); batched != n {
		t.Fatalf("%d lines charged batched, want %d", batched, n)
	}
}

// Cancelling an offloaded batch cancels its provider batch; the lines the
// provider finished are kept and charged, the rest cancelled.
func TestCancelOffloadedBatch(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{LinesPerSecond: 20}, 0)
	const n = 200
	_, key, batchID := h.submit("bulk", n)
	cancelled := false
	b := h.run(batchID, 300, func(round int) {
		if cancelled {
			return
		}
		parts, _ := h.Store.BatchPartListByBatch(h.t.Context(), batchID)
		if len(parts) == 1 && parts[0].State == store.PartSubmitted && h.Sim.BatchStats().LinesProcessed > 0 {
			if r := h.Do("POST", "/v1/batches/"+batchID+"/cancel", key, nil); r.Status != 200 {
				t.Fatalf("cancel: %d %s", r.Status, r.Body)
			}
			cancelled = true
		}
	})
	if b.Status != store.BatchCancelled {
		t.Fatalf("batch %s", b.Status)
	}
	jobs, _, batched := h.charges(batchID, false)
	done := 0
	for _, j := range jobs {
		switch j.Status {
		case store.JobSucceeded:
			done++
		case store.JobCancelled:
		default:
			t.Fatalf("job %s left %s", j.ID, j.Status)
		}
	}
	if done == 0 || done == n || batched != done || len(h.outputLines(key, b)) != done {
		t.Fatalf("%d succeeded, %d charged batched, of %d", done, batched, n)
	}
	if st := h.Sim.BatchStats(); st.BatchesCancelled != 1 {
		t.Fatalf("simulator: %+v", st)
	}
}

// The provider's batch queue limit, unknown to the policy: the provider
// refuses the part (token_limit_exceeded), llmq learns the limit, splits
// the part and sends the halves one after the other; every line runs
// batched, once.
func TestQueueLimitIsLearned(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{}, 0)
	const n = 200
	_, key, batchID := h.submit("bulk", n)
	// Once planned, the provider's queue holds less than the part.
	for range 300 {
		if parts, _ := h.Store.BatchPartListByBatch(t.Context(), batchID); len(parts) == 1 {
			if err := h.Sim.SetBatchConfig(sim.BatchConfig{QueueLimit: parts[0].Tokens * 3 / 10}); err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b := h.run(batchID, 400, nil)
	if b.Status != store.BatchCompleted || len(h.outputLines(key, b)) != n {
		t.Fatalf("batch %s", b.Status)
	}
	parts, _ := h.Store.BatchPartListByBatch(t.Context(), batchID)
	st := h.Sim.BatchStats()
	if st.BatchesFailed < 1 || len(parts) < 2 || st.LinesRepeated != 0 || st.LinesProcessed != n {
		t.Fatalf("%d parts; simulator %+v; want a refusal, then the part split and every line once", len(parts), st)
	}
	// What was learned is in Redis, for every dispatcher, for a while.
	learnedKey := h.Keys.LearnedBatchQueue(parts[0].Deployment)
	if learned, err := h.Redis.Get(t.Context(), learnedKey).Int64(); err != nil || learned <= 0 || learned >= parts[0].Tokens*2 {
		t.Fatalf("learned batch queue limit = %d, %v", learned, err)
	}
	if ttl := h.Redis.PTTL(t.Context(), learnedKey).Val(); ttl <= 0 || ttl > offload.LearnedQueueTTL {
		t.Fatalf("learned limit's TTL %v", ttl)
	}
	if _, _, batched := h.charges(batchID, true); batched != n {
		t.Fatalf("%d lines charged batched, want %d", batched, n)
	}
}

// A deployment's batch_queue_tokens in the policy: the batch is planned in
// parts that fit it, sent one at a time, never refused.
func TestQueueLimitFromThePolicy(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Now()}
	cfg := sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Echo: true, Now: c.Now,
		Batch: sim.BatchConfig{QueueLimit: 2000}}
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &cfg,
		Policy:  strings.Replace(policy, "limits: {rpm: 3000, tpm: 300000}", "limits: {rpm: 3000, tpm: 300000, batch_queue_tokens: 1500}", 1),
		Offload: offload.Options{Now: c.Now, PollMin: time.Second, PollMax: 5 * time.Second, RetryAfter: 2 * time.Second}})
	h := &harness{App: a, t: t, clock: c}
	const n = 300
	_, key, batchID := h.submit("bulk", n)
	b := h.run(batchID, 600, nil)
	if b.Status != store.BatchCompleted || len(h.outputLines(key, b)) != n {
		t.Fatalf("batch %s", b.Status)
	}
	parts, _ := h.Store.BatchPartListByBatch(t.Context(), batchID)
	for _, p := range parts {
		if p.Tokens > 1500 {
			t.Fatalf("part %s holds %d tokens, past the policy's 1500", p.ID, p.Tokens)
		}
	}
	if st := h.Sim.BatchStats(); len(parts) < 2 || st.BatchesFailed != 0 || int(st.BatchesCreated) != len(parts) {
		t.Fatalf("%d parts; simulator %+v", len(parts), st)
	}
}

// A provider batch that fails whole: its lines run through llmq's own path
// at the normal price, none lost.
func TestFailedProviderBatchFallsBack(t *testing.T) {
	t.Parallel()
	h := start(t, sim.BatchConfig{FailRate: 1}, 2)
	const n = 60
	_, key, batchID := h.submit("bulk", n)
	b := h.run(batchID, 300, nil)
	if b.Status != store.BatchCompleted || len(h.outputLines(key, b)) != n {
		t.Fatalf("batch %s", b.Status)
	}
	if _, _, batched := h.charges(batchID, true); batched != 0 {
		t.Fatalf("%d lines charged batched after the provider's batch failed", batched)
	}
	if st, s := h.Sim.BatchStats(), h.Sim.Stats(); st.BatchesFailed != 1 || s.Requests != n {
		t.Fatalf("simulator: %+v, %d synchronous calls", st, s.Requests)
	}
}

// A tier with batch_offload: always refuses, line by line, the lines of a
// model whose provider offers no Batch API; the others run batched.
func TestAlwaysRefusesLinesWithoutABatchAPI(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Now()}
	cfg := sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Echo: true, Now: c.Now}
	p := strings.Replace(policy, "models:", `  - {name: local, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, batch_api: false}
models:
  - {name: small, provider: local, upstream: gpt-4o-mini, price: {input_per_mtok: 1, output_per_mtok: 1}, limits: {rpm: 3000, tpm: 300000}}`, 1)
	p += "  - {name: strict, daily_budget_usd: 500, api_rps: 1000, batch_offload: always}\n"
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &cfg, Policy: p, Offload: offload.Options{Now: c.Now, PollMin: time.Second}})
	h := &harness{App: a, t: t, clock: c}
	tenantID, key := h.Tenant("strict")
	var in bytes.Buffer
	for i, model := range []string{"gpt-4o-mini", "small", "gpt-4o-mini"} {
		body := apptest.ChatBody("hi", "", 10)
		body["model"] = model
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprint(i), "method": "POST", "url": "/v1/chat/completions", "body": body})
		in.Write(append(line, '\n'))
	}
	f, err := h.Store.FileInsert(t.Context(), &store.FileInsertParams{TenantID: tenantID, Purpose: store.FilePurposeBatch, Filename: "in.jsonl", Content: &in})
	if err != nil {
		t.Fatal(err)
	}
	r := h.Do("POST", "/v1/batches", key, map[string]any{"input_file_id": f.ID, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
	var created struct{ ID string }
	r.JSON(t, &created)
	b := h.run(created.ID, 200, nil)
	if b.Status != store.BatchCompleted || len(h.outputLines(key, b)) != 2 {
		t.Fatalf("batch %s", b.Status)
	}
	var refused *store.Job
	_ = h.Store.JobStreamByBatch(t.Context(), created.ID, []store.JobStatus{store.JobFailed}, func(j *store.Job) error { refused = j; return nil })
	if refused == nil || refused.LineNo != 2 || refused.Error == nil || refused.Error.Code != client.CodeBatchOffloadUnavailable {
		t.Fatalf("refused line = %+v", refused)
	}
}
