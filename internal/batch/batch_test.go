package batch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/batch/batchtest"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// TestLinesWithInvalidOnes runs a 1,000-line batch in which 12% of the
// lines are invalid, of every kind: exact counts, the batch's errors listing
// the first 100 refusals and counting the rest, the output in input order
// with each answer matching its request, and every refused line in the
// error file with its line number and reason. bench/batchscale runs the
// same at 10,000 lines, 3% of them invalid.
func TestLinesWithInvalidOnes(t *testing.T) {
	t.Parallel()
	a := start(t, 4, nil)
	_, key := a.Tenant("standard")
	const n = 1_000
	// 12 in every 100 lines refused, never the first; valid: custom ids of
	// the valid lines, in order; refusedLines in order.
	in, valid, refusedLines, codes := batchtest.MixedInput(n, 12)
	refused := map[int]client.Code{} // line -> code
	for i, line := range refusedLines {
		refused[line] = codes[i]
	}
	fileID := upload(t, a, key, in)
	b := createBatch(t, a, key, fileID, map[string]any{"metadata": map[string]string{"run": "1k"}})
	if b.Status != "validating" || b.Object != "batch" || b.Metadata["run"] != "1k" || b.ExpiresAt == nil ||
		*b.ExpiresAt != b.CreatedAt+24*3600 {
		t.Fatalf("created batch = %+v", b)
	}

	// A bound for a loaded machine under -race (1,000 jobs through the
	// whole pipeline beside the rest of the suite), not a speed target: the
	// batch benchmarks measure speed.
	b = waitStatus(t, a, key, b.ID, "completed", 2*time.Minute)
	want := client.BatchRequestCounts{Total: n, Completed: int64(len(valid)), Failed: int64(len(refused))}
	if b.RequestCounts != want || len(refused) != 120 {
		t.Fatalf("counts = %+v, want %+v", b.RequestCounts, want)
	}
	if b.OutputFileID == nil || b.ErrorFileID == nil || b.InProgressAt == nil || b.FinalizingAt == nil || b.CompletedAt == nil {
		t.Fatalf("completed batch = %+v", b)
	}
	// The batch lists the first 100 refusals, in order, and counts the rest.
	if b.Errors == nil || len(b.Errors.Data) != 101 || b.Errors.Data[100].Code != client.CodeMoreErrors {
		t.Fatalf("errors = %+v", b.Errors)
	}
	for i, e := range b.Errors.Data[:100] {
		if e.Line == nil || *e.Line != refusedLines[i] || e.Code != refused[refusedLines[i]] {
			t.Fatalf("errors[%d] = %+v, want line %d code %s", i, e, refusedLines[i], refused[refusedLines[i]])
		}
	}

	out := results(t, a, key, *b.OutputFileID)
	if len(out) != len(valid) {
		t.Fatalf("output has %d lines, want %d", len(out), len(valid))
	}
	for i, r := range out {
		if r.CustomID != valid[i] || r.Error != nil || r.Response == nil || r.Response.StatusCode != 200 ||
			!strings.HasPrefix(r.ID, "batch_req_") || r.Response.RequestID == "" {
			t.Fatalf("output line %d = %+v, want custom_id %s", i+1, r, valid[i])
		}
		if got := batchtest.AnswerOf(r.Response.Body); !strings.HasPrefix(got, valid[i]) {
			t.Fatalf("output line %d (%s) answers %q: not its own request", i+1, r.CustomID, got)
		}
	}
	errs := results(t, a, key, *b.ErrorFileID)
	if len(errs) != len(refused) {
		t.Fatalf("error file has %d lines, want %d", len(errs), len(refused))
	}
	prev := 0
	for _, r := range errs {
		if r.Error == nil || r.Response != nil || r.Error.Line <= prev {
			t.Fatalf("error line %+v is out of order or malformed", r)
		}
		prev = r.Error.Line
		if code, ok := refused[r.Error.Line]; !ok || code != r.Error.Code ||
			!strings.HasPrefix(r.Error.Message, fmt.Sprintf("Line %d: ", r.Error.Line)) {
			t.Fatalf("error line for input line %d = %+v, want code %s", r.Error.Line, r.Error, code)
		}
	}
	// Batch jobs ran in the batch queue.
	jobs, _, err := a.Store.JobList(context.Background(), &store.JobListParams{TenantID: tenantOf(t, a, b.ID), BatchID: b.ID, Limit: 5})
	if err != nil || len(jobs) == 0 || jobs[0].Queue != queue.Batch {
		t.Fatalf("batch jobs = %v, %v", jobs, err)
	}
}

func tenantOf(t *testing.T, a *apptest.App, batchID string) string {
	t.Helper()
	b, err := a.Store.BatchGetByID(context.Background(), batchID)
	if err != nil {
		t.Fatal(err)
	}
	return b.TenantID
}

// validated creates a batch of lines and validates it in the test's own
// goroutine, so no worker or background pass races what the test does next.
func validated(t *testing.T, a *apptest.App, key string, lines []string, extra map[string]any) client.Batch {
	t.Helper()
	fileID := upload(t, a, key, []byte(strings.Join(lines, "\n")+"\n"))
	b := createBatch(t, a, key, fileID, extra)
	// The API started a validation in the background; this one waits for
	// the batch's lock when the other holds it.
	// 12,000 lines take under a second alone, and can take half a minute
	// under the race detector beside the rest of the suite on two cores.
	deadline := time.Now().Add(3 * time.Minute)
	for getBatch(t, a, key, b.ID).Status == "validating" {
		if err := a.Batches.Validate(context.Background(), b.ID); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("batch still validating after 3 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return getBatch(t, a, key, b.ID)
}

// runJobs runs the batch's first n queued jobs through the worker's handler,
// here, as a worker would.
func runJobs(t *testing.T, a *apptest.App, batchID string, n int) []*store.Job {
	t.Helper()
	h := a.JobHandler(worker.Options{})
	var ran []*store.Job
	err := a.Store.JobStreamByBatch(context.Background(), batchID, []store.JobStatus{store.JobQueued}, func(j *store.Job) error {
		if len(ran) == n {
			return nil
		}
		ran = append(ran, j)
		return h.Run(context.Background(), j.ID)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ran
}

func lines(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = batchtest.ChatLine(fmt.Sprintf("req-%d", i))
	}
	return out
}

// TestCancelMidRun cancels a batch with some jobs done, one in flight and
// the rest pending: the pending ones never run, the one in flight finishes
// and its result is kept, and counts and files agree.
func TestCancelMidRun(t *testing.T) {
	t.Parallel()
	a := start(t, 0, nil)
	_, key := a.Tenant("standard")
	b := validated(t, a, key, lines(50), nil)
	if b.Status != "in_progress" || b.RequestCounts.Total != 50 {
		t.Fatalf("validated batch = %+v", b)
	}
	runJobs(t, a, b.ID, 10)
	// One job is in flight: a worker has started it.
	var inflight *store.Job
	_ = a.Store.JobStreamByBatch(context.Background(), b.ID, []store.JobStatus{store.JobQueued}, func(j *store.Job) error {
		if inflight == nil {
			inflight = j
		}
		return nil
	})
	if _, started, err := a.Store.JobStart(context.Background(), inflight.ID, ""); err != nil || !started {
		t.Fatalf("JobStart: %v %v", started, err)
	}
	before := a.Sim.Stats().Requests

	r := a.Do("POST", "/v1/batches/"+b.ID+"/cancel", key, nil)
	var c client.Batch
	r.JSON(t, &c)
	if r.Status != 200 || c.Status != "cancelling" || c.CancellingAt == nil {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	if want := (client.BatchRequestCounts{Total: 50, Completed: 10, Failed: 39}); c.RequestCounts != want {
		t.Fatalf("counts after cancel = %+v, want %+v (pending jobs cancelled at once)", c.RequestCounts, want)
	}
	// A second cancel is harmless.
	if r := a.Do("POST", "/v1/batches/"+b.ID+"/cancel", key, nil); r.Status != 200 {
		t.Fatalf("second cancel: %d %s", r.Status, r.Body)
	}
	// While the job runs, the batch stays cancelling.
	if err := a.Batches.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := getBatch(t, a, key, b.ID).Status; st != "cancelling" {
		t.Fatalf("status with a job in flight = %s", st)
	}
	// The in-flight call finishes (its worker was mid-call); the tasks of
	// the cancelled jobs, when a worker gets them, do nothing.
	h := a.JobHandler(worker.Options{})
	if err := h.Run(context.Background(), inflight.ID); err != nil {
		t.Fatal(err)
	}
	runJobs(t, a, b.ID, 50) // finds no queued job
	if got := a.Sim.Stats().Requests - before; got != 1 {
		t.Fatalf("the provider got %d calls after the cancel, want 1 (the one in flight)", got)
	}

	b = waitStatus(t, a, key, b.ID, "cancelled", 10*time.Second)
	if want := (client.BatchRequestCounts{Total: 50, Completed: 11, Failed: 39}); b.RequestCounts != want || b.CancelledAt == nil {
		t.Fatalf("cancelled batch = %+v", b)
	}
	out := results(t, a, key, *b.OutputFileID)
	errs := results(t, a, key, *b.ErrorFileID)
	if len(out) != 11 || len(errs) != 39 {
		t.Fatalf("files have %d and %d lines, want 11 and 39", len(out), len(errs))
	}
	for _, r := range errs {
		if r.Error == nil || r.Error.Code != client.CodeBatchCancelled || r.Response != nil {
			t.Fatalf("error line = %+v", r)
		}
	}
	// A finished batch cannot be cancelled.
	if r := a.Do("POST", "/v1/batches/"+b.ID+"/cancel", key, nil); r.Status != 200 {
		t.Fatalf("cancel of a cancelled batch: %d %s", r.Status, r.Body)
	}
}

// TestExpiry expires a batch at the end of its window (an injected clock):
// pending jobs are cancelled, finished results are kept.
func TestExpiry(t *testing.T) {
	t.Parallel()
	a := start(t, 0, nil)
	_, key := a.Tenant("standard")
	b := validated(t, a, key, lines(30), nil)
	runJobs(t, a, b.ID, 7)

	// Before the window ends, a sweep changes nothing.
	late := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{
		Now: func() time.Time { return time.Unix(*b.ExpiresAt, 0).Add(-time.Second) }})
	t.Cleanup(func() { _ = late.Close() })
	if err := late.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := getBatch(t, a, key, b.ID).Status; st != "in_progress" {
		t.Fatalf("status before expiry = %s", st)
	}
	expired := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{
		Now: func() time.Time { return time.Unix(*b.ExpiresAt, 0).Add(time.Second) }})
	t.Cleanup(func() { _ = expired.Close() })
	if err := expired.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	b = getBatch(t, a, key, b.ID)
	if want := (client.BatchRequestCounts{Total: 30, Completed: 7, Failed: 23}); b.Status != "expired" || b.ExpiredAt == nil || b.RequestCounts != want {
		t.Fatalf("expired batch = %+v", b)
	}
	out := results(t, a, key, *b.OutputFileID)
	errs := results(t, a, key, *b.ErrorFileID)
	if len(out) != 7 || len(errs) != 23 {
		t.Fatalf("files have %d and %d lines, want 7 and 23", len(out), len(errs))
	}
	for i, r := range out {
		if r.CustomID != fmt.Sprintf("req-%d", i) {
			t.Fatalf("output line %d = %s", i, r.CustomID)
		}
	}
	for i, r := range errs {
		if r.Error == nil || r.Error.Code != client.CodeBatchExpired || r.CustomID != fmt.Sprintf("req-%d", 7+i) || r.Error.Line != 8+i {
			t.Fatalf("error line %d = %+v", i, r)
		}
	}
	// Queued tasks of expired jobs do nothing when they run.
	before := a.Sim.Stats().Requests
	runJobs(t, a, b.ID, 30)
	if a.Sim.Stats().Requests != before {
		t.Fatal("an expired job called the provider")
	}
}

// TestValidationResumesAfterACrash takes up a batch left validating by a
// dispatcher that died after storing part of it, never enqueued: the
// sweeper validates it again, skipping the stored lines, and every job ends
// up queued exactly once.
func TestValidationResumesAfterACrash(t *testing.T) {
	t.Parallel()
	a := start(t, 0, nil)
	tenant, key := a.Tenant("standard")
	fileID := upload(t, a, key, []byte(strings.Join(lines(35), "\n")+"\n"))
	ctx := context.Background()
	// The dead pass stored lines 1-10, then stopped.
	bt := partlyValidated(t, a, tenant, fileID, 10)
	svc := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{GroupLines: 7})
	t.Cleanup(func() { _ = svc.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for getBatch(t, a, key, bt.ID).Status == "validating" {
		if err := svc.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("still validating")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := getBatch(t, a, key, bt.ID)
	c, err := a.Store.JobCountsByBatch(ctx, bt.ID)
	if err != nil || b.Status != "in_progress" || b.RequestCounts.Total != 35 || c.Total != 35 || c.Queued != 35 {
		t.Fatalf("resumed batch = %+v, jobs %+v (%v)", b, c, err)
	}
	lines := map[int]bool{}
	_ = a.Store.JobStreamByBatch(ctx, bt.ID, nil, func(j *store.Job) error { lines[j.LineNo] = true; return nil })
	if n := a.TaskCount(); n != 35 {
		t.Fatalf("%d tasks queued, want 35 (the dead pass's 10 too)", n)
	}
	if len(lines) != 35 {
		t.Fatalf("%d distinct lines stored", len(lines))
	}
	// Validating again changes nothing.
	if err := svc.Validate(ctx, bt.ID); err != nil {
		t.Fatal(err)
	}
	if c2, _ := a.Store.JobCountsByBatch(ctx, bt.ID); *c2 != *c {
		t.Fatalf("a second validation changed the jobs: %+v", c2)
	}
}

// TestNoValidLineFailsTheBatch fails a batch none of whose lines can run,
// with the reasons in its errors and its error file; an empty file, and a
// request that costs more than the whole daily budget, are refused too.
func TestNoValidLineFailsTheBatch(t *testing.T) {
	t.Parallel()
	a := start(t, 0, nil)
	_, key := a.Tenant("tiny") // a daily budget of $0.0001
	b := validated(t, a, key, []string{
		"not json",
		"",
		strings.Replace(batchtest.ChatLine("a"), `"max_tokens":20`, `"max_tokens":1000`, 1), // up to $0.0006
		strings.Replace(batchtest.ChatLine("b"), "gpt-4o-mini", "gpt-9", 1),
	}, nil)
	if b.Status != "failed" || b.FailedAt == nil || b.InProgressAt != nil || b.OutputFileID != nil || b.ErrorFileID == nil {
		t.Fatalf("batch = %+v", b)
	}
	if want := (client.BatchRequestCounts{Total: 3, Failed: 3}); b.RequestCounts != want {
		t.Fatalf("counts = %+v, want %+v (the blank line is no request)", b.RequestCounts, want)
	}
	if b.Errors == nil || len(b.Errors.Data) != 3 {
		t.Fatalf("errors = %+v", b.Errors)
	}
	wantLines := []int{1, 3, 4}
	wantCodes := []client.Code{client.CodeInvalidJSONLine, client.CodeBudgetTooSmall, client.CodeModelNotFound}
	for i, e := range b.Errors.Data {
		if e.Line == nil || *e.Line != wantLines[i] || e.Code != wantCodes[i] {
			t.Fatalf("errors[%d] = %+v, want line %d code %s", i, e, wantLines[i], wantCodes[i])
		}
	}
	errs := results(t, a, key, *b.ErrorFileID)
	if len(errs) != 3 || errs[1].CustomID != "a" || errs[1].Error.Code != client.CodeBudgetTooSmall || errs[0].CustomID != "" {
		t.Fatalf("error file = %+v", errs)
	}
	if n := a.Sim.Stats().Requests; n != 0 {
		t.Fatalf("the provider got %d calls", n)
	}
}

// TestCancelWhileValidating cancels a batch while its lines are being
// checked and stored, some already stored, others not yet read: nothing of
// it was ever enqueued, and the cancelled batch's counts agree with its
// files (total = completed + failed, each file holding its count of lines).
func TestCancelWhileValidating(t *testing.T) {
	t.Parallel()
	a := start(t, 0, nil)
	tenant, key := a.Tenant("standard")
	fileID := upload(t, a, key, []byte(strings.Join(lines(3000), "\n")+"\n"))
	ctx := context.Background()
	// The batch as the API stores it; this test's own service validates it
	// in small groups, so the cancel lands part way.
	bt, err := a.Store.BatchInsert(ctx, &store.BatchInsertParams{TenantID: tenant, InputFileID: fileID,
		Endpoint: "/v1/chat/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	svc := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{GroupLines: 7})
	t.Cleanup(func() { _ = svc.Close() })
	validated := make(chan error, 1)
	go func() { validated <- svc.Validate(ctx, bt.ID) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := a.Store.JobCountsByBatch(ctx, bt.ID)
		if err != nil {
			t.Fatal(err)
		}
		if c.Total >= 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("validation stored nothing within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r := a.Do("POST", "/v1/batches/"+bt.ID+"/cancel", key, nil); r.Status != 200 {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	if err := <-validated; err != nil {
		t.Fatal(err)
	}
	if n := a.TaskCount(); n != 0 {
		t.Fatalf("%d tasks in Redis for a batch cancelled before its validation ended", n)
	}
	if err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	b := waitStatus(t, a, key, bt.ID, "cancelled", 10*time.Second)
	rc := b.RequestCounts
	if rc.Completed+rc.Failed != rc.Total || rc.Total < 50 || rc.Total >= 3000 {
		t.Fatalf("batch cancelled part way through validation: counts %+v; want completed + failed = total, between 50 and 3000", rc)
	}
	var out, errs int
	if b.OutputFileID != nil {
		out = len(results(t, a, key, *b.OutputFileID))
	}
	if b.ErrorFileID != nil {
		errs = len(results(t, a, key, *b.ErrorFileID))
	}
	if int64(out) != rc.Completed || int64(errs) != rc.Failed {
		t.Fatalf("counts %+v but files of %d and %d lines", rc, out, errs)
	}
}

// TestNoTaskBeforeValidationEnds validates a batch in small groups, first
// in a pass that dies part way (its context ends, as in a crash), then in a
// pass that finishes, and looks at Redis all along: jobs are stored group
// by group, but no task exists while the batch is validating; once it is
// in_progress every valid line has its task.
func TestNoTaskBeforeValidationEnds(t *testing.T) {
	t.Parallel()
	a := start(t, 0, nil)
	tenant, key := a.Tenant("standard")
	const n = 3000
	fileID := upload(t, a, key, []byte(strings.Join(lines(n), "\n")+"\n"))
	ctx := context.Background()
	bt, err := a.Store.BatchInsert(ctx, &store.BatchInsertParams{TenantID: tenant, InputFileID: fileID,
		Endpoint: "/v1/chat/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	svc := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{GroupLines: 7})
	t.Cleanup(func() { _ = svc.Close() })
	// look reads Redis before the batch: tasks counted while the batch was
	// still validating when read after existed before it left validating.
	look := func() (stored int64, validating bool) {
		t.Helper()
		tasks := a.TaskCount()
		b, err := a.Store.BatchGetByID(ctx, bt.ID)
		if err != nil {
			t.Fatal(err)
		}
		c, err := a.Store.JobCountsByBatch(ctx, bt.ID)
		if err != nil {
			t.Fatal(err)
		}
		if b.Status == store.BatchValidating && tasks > 0 {
			t.Fatalf("%d tasks in Redis while the batch is validating (%d of %d lines stored)", tasks, c.Total, n)
		}
		return c.Total, b.Status == store.BatchValidating
	}
	poll := func(what string, done func(stored int64, validating bool) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !done(look()) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 30s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	dying, die := context.WithCancel(ctx)
	passed := make(chan error, 1)
	go func() { passed <- svc.Validate(dying, bt.ID) }()
	poll("50 stored lines", func(stored int64, _ bool) bool { return stored >= 50 })
	die()
	<-passed // the context's error, or none if it ended between two steps
	stored, validating := look()
	if !validating || stored < 50 || stored >= n {
		t.Fatalf("after the dead pass: %d lines stored, validating %v; want part of %d, validating", stored, validating, n)
	}

	go func() { passed <- svc.Validate(ctx, bt.ID) }()
	poll("end of validation", func(_ int64, validating bool) bool { return !validating })
	if err := <-passed; err != nil {
		t.Fatal(err)
	}
	c, err := a.Store.JobCountsByBatch(ctx, bt.ID)
	if err != nil || c.Total != n || c.Queued != n {
		b, _ := a.Store.BatchGetByID(ctx, bt.ID)
		t.Fatalf("jobs after validation = %+v, %v; want %d queued (batch %s, errors %s)", c, err, n, b.Status, b.Errors)
	}
	if got := a.TaskCount(); got != n {
		t.Fatalf("%d tasks in Redis after validation, want %d", got, n)
	}
}
