package recovery_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/recovery"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

const redisDB = 12

func reconciler(a *apptest.App, now func() time.Time) *recovery.Reconciler {
	return recovery.New(recovery.Reconciler{
		Store: a.Store, Redis: a.Redis, Keys: a.Keys, Queue: a.Queue, Inspector: a.Inspector,
		Limiter: a.Limiter, Policy: a.Policy, Logger: a.Logger,
	}, recovery.Options{Now: now, MinAge: time.Second, CheckInterval: 100 * time.Millisecond})
}

// queuedAgain reports whether a placement (apptest.App.Placement) is a job
// queued to run now: waiting in its fair queue, or released as a task.
func queuedAgain(p string) bool {
	return p == "waiting" || p == "released" || p == string(queue.TaskPending) || p == string(queue.TaskActive)
}

// insertJob stores a job the way the API does, but enqueues nothing: an
// enqueue that failed after the row was committed.
func insertJob(t *testing.T, a *apptest.App, tenant string, p *store.JobInsertParams) *store.Job {
	t.Helper()
	p.TenantID, p.Endpoint, p.Model = tenant, "/v1/chat/completions", "gpt-4o-mini"
	p.Request = []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}],"max_tokens":5}`)
	p.EstPromptTokens, p.EstMaxTokens = 10, 5
	if p.Queue == "" {
		p.Queue = queue.Default
	}
	j, _, err := a.Store.JobInsert(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func later() time.Time { return time.Now().Add(time.Minute) }

func TestJobsWithoutTasksAreEnqueuedOnce(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	tenant, _ := a.Tenant("standard")
	ctx := context.Background()
	queued := insertJob(t, a, tenant, &store.JobInsertParams{})
	due := later().Add(time.Hour)
	waiting := insertJob(t, a, tenant, &store.JobInsertParams{Status: store.JobWaiting, NextRunAt: &due, Queue: queue.Low})
	done := insertJob(t, a, tenant, &store.JobInsertParams{})
	if _, _, err := a.Store.JobFail(ctx, &store.JobFailParams{ID: done.ID, Error: store.JobError{Message: "x"}}); err != nil {
		t.Fatal(err)
	}
	r := reconciler(a, later)
	rep, err := r.RunOnce(ctx)
	if err != nil || rep.Requeued != 2 || rep.Scanned != 2 {
		t.Fatalf("first pass = %+v, %v; want 2 requeued of 2 unfinished", rep, err)
	}
	if p := a.Placement(queued.ID); !queuedAgain(p) {
		t.Fatalf("queued job is %s", p)
	}
	// A job due later is enqueued to run when due, not now.
	if st, _ := a.Inspector.JobTaskState(ctx, waiting.ID); st != queue.TaskScheduled {
		t.Fatalf("waiting job's task is %s", st)
	}
	rep, err = r.RunOnce(ctx)
	if err != nil || rep.Requeued != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing requeued", rep, err)
	}
	// Jobs changed in the last MinAge are in flight: left alone.
	fresh := insertJob(t, a, tenant, &store.JobInsertParams{})
	rep, _ = reconciler(a, time.Now).RunOnce(ctx)
	if p := a.Placement(fresh.ID); p != string(queue.TaskMissing) || rep.Requeued != 0 {
		t.Fatalf("a job created just now was touched: %s %+v", p, rep)
	}
}

func TestArchivedTaskIsRevived(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	tenant, _ := a.Tenant("standard")
	ctx := context.Background()
	j := insertJob(t, a, tenant, &store.JobInsertParams{})
	if _, err := a.Queue.EnqueueJob(ctx, queue.JobRef{ID: j.ID, Priority: j.Queue, In: time.Hour}); err != nil {
		t.Fatal(err)
	}
	archive(t, a, j)
	rep, err := reconciler(a, later).RunOnce(ctx)
	if err != nil || rep.Revived != 1 {
		t.Fatalf("pass = %+v, %v; want the archived job revived", rep, err)
	}
	if p := a.Placement(j.ID); !queuedAgain(p) {
		t.Fatalf("revived job is %s", p)
	}
}

// A job whose worker died during its last delivery may be what kills its
// workers: it fails, saying so, instead of being revived forever.
func TestJobWhoseWorkerDiedIsFailedNotRevived(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	tenant, _ := a.Tenant("standard")
	ctx := context.Background()
	j := insertJob(t, a, tenant, &store.JobInsertParams{})
	if _, err := a.Queue.EnqueueJob(ctx, queue.JobRef{ID: j.ID, Priority: j.Queue}); err != nil {
		t.Fatal(err)
	}
	archiveAsWorkerLost(t, a, j)
	rep, err := reconciler(a, later).RunOnce(ctx)
	if err != nil || rep.Failed != 1 || rep.Revived != 0 {
		t.Fatalf("pass = %+v, %v; want the job failed, not revived", rep, err)
	}
	got, err := a.Store.JobGetByID(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != store.JobFailed || got.Error == nil || got.Error.Code != client.CodeWorkerLost ||
		!strings.Contains(got.Error.Message, "worker gone (killed, crashed or cut off from Redis)") {
		t.Fatalf("job = %s, error %+v; want failed with worker_lost", got.Status, got.Error)
	}
	if st, _ := a.Inspector.JobTaskState(ctx, j.ID); st != queue.TaskMissing {
		t.Fatalf("task is %s; want it dropped: the job records why it failed", st)
	}
	if rep, err := reconciler(a, later).RunOnce(ctx); err != nil || rep.Scanned != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing left to look at", rep, err)
	}
}

func TestRedisLossIsDetectedRequeuedAndModelsPaused(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/0"})
	tenant, _ := a.Tenant("standard")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ids []string
	for i := 0; i < 20; i++ {
		j := insertJob(t, a, tenant, &store.JobInsertParams{})
		if _, err := a.Queue.EnqueueJob(ctx, queue.JobRef{ID: j.ID, Priority: j.Queue}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	r := reconciler(a, later)
	// First start: the marker is written; tasks are all present.
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	testutil.Eventually(t, 10*time.Second, func() bool { n, _ := a.Redis.Exists(ctx, a.Keys.Epoch()).Result(); return n == 1 })

	if err := a.Redis.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Every job is queued again; the models' pause keeps them in their fair
	// queue rather than sending them to workers that could not run them.
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, id := range ids {
			if p := a.Placement(id); p != "waiting" {
				return false
			}
		}
		n, _ := a.Redis.Exists(ctx, a.Keys.Epoch()).Result()
		return n == 1
	})
	// Every model is paused: the limiter's state was lost with Redis.
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	res, err := a.Limiter.Reserve(ctx, admission.Scope(m.Routes()[0]), limiter.Cost{Requests: 1})
	if err != nil || res.Allowed || !res.Penalized || res.RetryAfter < 30*time.Second {
		t.Fatalf("reserve after the loss = %+v, %v; want paused", res, err)
	}
	cancel()
	<-done
}

func TestOneReconcilerAtATime(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	unlock, ok, err := a.Store.TryLock(context.Background(), "reconciler")
	if err != nil || !ok {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	tenant, _ := a.Tenant("standard")
	j := insertJob(t, a, tenant, &store.JobInsertParams{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	reconciler(a, later).Run(ctx) // the lock is held elsewhere: nothing runs
	if p := a.Placement(j.ID); p != string(queue.TaskMissing) {
		t.Fatalf("a second reconciler ran while the first held the lock (the job is %s)", p)
	}
	unlock()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go reconciler(a, later).Run(ctx2)
	// Queued again: in its fair queue (while the first pass's pause holds
	// the models), or released as a task.
	testutil.Eventually(t, 10*time.Second, func() bool {
		p := a.Placement(j.ID)
		return p == "waiting" || p == "released" || p == string(queue.TaskPending)
	})
}

// A batch's jobs are its validation's to enqueue, once the whole file is
// checked: the reconciler leaves them alone while the batch validates.
func TestValidatingBatchesAreLeftToTheirValidation(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	tenant, _ := a.Tenant("standard")
	ctx := context.Background()
	f, err := a.Store.FileInsert(ctx, &store.FileInsertParams{TenantID: tenant, Purpose: store.FilePurposeBatch,
		Filename: "in.jsonl", Content: strings.NewReader("{}\n")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.Store.BatchInsert(ctx, &store.BatchInsertParams{TenantID: tenant, InputFileID: f.ID,
		Endpoint: "/v1/chat/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	j := insertJob(t, a, tenant, &store.JobInsertParams{BatchID: b.ID, LineNo: 1, Queue: queue.Batch})
	r := reconciler(a, later)
	if rep, err := r.RunOnce(ctx); err != nil || rep.Requeued != 0 {
		t.Fatalf("while validating: %+v, %v; want nothing requeued", rep, err)
	}
	if p := a.Placement(j.ID); p != string(queue.TaskMissing) {
		t.Fatalf("a validating batch's job is queued: %s", p)
	}
	if _, applied, err := a.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{ID: b.ID,
		From: []store.BatchStatus{store.BatchValidating}, To: store.BatchInProgress}); err != nil || !applied {
		t.Fatalf("batch to in_progress: %v %v", applied, err)
	}
	// In progress, a job without its task is the reconciler's again.
	if rep, err := r.RunOnce(ctx); err != nil || rep.Requeued != 1 {
		t.Fatalf("in progress: %+v, %v; want its job requeued", rep, err)
	}
	if p := a.Placement(j.ID); !queuedAgain(p) {
		t.Fatalf("the job is %s, want queued again", p)
	}
}

// A finished job's webhook whose delivery has not ended is enqueued again
// when its task is missing (Redis lost it), once; a delivery that ended is
// left alone.
func TestPendingWebhooksAreEnqueuedAgain(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	tenant, _ := a.Tenant("standard")
	ctx := context.Background()
	hooked := func() *store.Job {
		j := insertJob(t, a, tenant, &store.JobInsertParams{WebhookURL: "https://example.com/hook"})
		if _, _, err := a.Store.JobFail(ctx, &store.JobFailParams{ID: j.ID, Error: store.JobError{Message: "x"}}); err != nil {
			t.Fatal(err)
		}
		return j
	}
	pending, delivered := hooked(), hooked()
	if err := a.Store.WebhookDone(ctx, store.WebhookRef{Kind: store.WebhookJob, ID: delivered.ID}); err != nil {
		t.Fatal(err)
	}
	task := func(j *store.Job) queue.TaskState {
		st, err := a.Inspector.WebhookTaskState(ctx, "job", j.ID)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	r := reconciler(a, later)
	rep, err := r.RunOnce(ctx)
	if err != nil || rep.Webhooks != 1 {
		t.Fatalf("first pass = %+v, %v; want one webhook enqueued", rep, err)
	}
	if task(pending) != queue.TaskPending || task(delivered) != queue.TaskMissing {
		t.Fatalf("webhook tasks: pending job's %s, delivered job's %s", task(pending), task(delivered))
	}
	if rep, err := r.RunOnce(ctx); err != nil || rep.Webhooks != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing enqueued (the task exists)", rep, err)
	}
	// Finished within MinAge: its worker is enqueueing the delivery now.
	fresh := hooked()
	if rep, _ := reconciler(a, time.Now).RunOnce(ctx); rep.Webhooks != 0 || task(fresh) != queue.TaskMissing {
		t.Fatalf("a job finished just now: %+v, task %s", rep, task(fresh))
	}
}

// asynq archives a task whose delivery came back after its retries were
// used up, such as one that stored its job's result and died before
// settling the budget. The reconciler sends a finished job's archived task
// back, and its delivery settles the charge from the ledger; a failed
// job's archived task is dropped.
func TestFinishedJobsArchivedTasksAreSentBackToSettle(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	tenant, _ := a.Tenant("standard")
	ctx := context.Background()
	acct := a.Account(tenant)
	// A delivery that stored the result and died before Settle, on its
	// last retry: the job succeeded, its task is archived.
	done := insertJob(t, a, tenant, &store.JobInsertParams{})
	if _, _, err := a.Store.JobStart(ctx, done.ID, ""); err != nil {
		t.Fatal(err)
	}
	res, d, err := a.Budgets.Reserve(ctx, acct, done.ID, 1000)
	if err != nil || !d.Allowed {
		t.Fatalf("reserve: %v %+v", err, d)
	}
	const cost = 420
	if _, err := a.Store.JobComplete(ctx, &store.JobCompleteParams{ID: done.ID, Day: res.Day, GlobalDay: res.GlobalDay,
		PromptTokens: 10, CompletionTokens: 5, Cost: cost}); err != nil {
		t.Fatal(err)
	}
	failed := insertJob(t, a, tenant, &store.JobInsertParams{})
	for _, j := range []*store.Job{done, failed} {
		if _, err := a.Queue.EnqueueJob(ctx, queue.JobRef{ID: j.ID, Priority: j.Queue, In: time.Hour}); err != nil {
			t.Fatal(err)
		}
		archive(t, a, j)
	}
	if _, _, err := a.Store.JobFail(ctx, &store.JobFailParams{ID: failed.ID, Error: store.JobError{Message: "x"}}); err != nil {
		t.Fatal(err)
	}
	rep, err := reconciler(a, later).RunOnce(ctx)
	if err != nil || rep.Resent != 1 || rep.Dropped != 1 {
		t.Fatalf("pass = %+v, %v; want one task sent back and one dropped", rep, err)
	}
	if st, _ := a.Inspector.JobTaskState(ctx, done.ID); st != queue.TaskPending {
		t.Fatalf("the succeeded job's task is %s, want pending", st)
	}
	if st, _ := a.Inspector.JobTaskState(ctx, failed.ID); st != queue.TaskMissing {
		t.Fatalf("the failed job's task is %s, want dropped", st)
	}
	// Its delivery settles the charge the dead worker left open.
	if err := a.JobHandler(worker.Options{}).Run(ctx, done.ID); err != nil {
		t.Fatal(err)
	}
	st, err := a.Budgets.Status(ctx, acct)
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent != cost || st.Reserved != 0 {
		t.Fatalf("spent %s, reserved %s; want %d spent and nothing reserved", st.Spent, st.Reserved, cost)
	}
	if rep, err := reconciler(a, later).RunOnce(ctx); err != nil || rep.Resent+rep.Dropped != 0 {
		t.Fatalf("second pass = %+v, %v; want an empty archive", rep, err)
	}
}

// The running jobs of a worker that stopped beating are handed off once,
// each under a task of its own, counting the lost delivery; a job whose
// deliveries all ended with their workers dead fails worker_lost instead.
// A live worker's jobs stay its own.
func TestHandOffTakesADeadWorkersJobs(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, NoScheduler: true})
	tenant, _ := a.Tenant("standard")
	ctx := context.Background()
	for _, w := range []string{"w-dead", "w-live"} {
		if err := a.Store.WorkerBeat(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	dead := insertJob(t, a, tenant, &store.JobInsertParams{})
	killer := insertJob(t, a, tenant, &store.JobInsertParams{})
	live := insertJob(t, a, tenant, &store.JobInsertParams{})
	for _, s := range []struct {
		j *store.Job
		w string
	}{{dead, "w-dead"}, {killer, "w-dead"}, {live, "w-live"}} {
		if _, started, err := a.Store.JobStart(ctx, s.j.ID, s.w); err != nil || !started {
			t.Fatalf("JobStart: %v, %v", started, err)
		}
	}
	// The killer's earlier deliveries all ended with their workers dead.
	for range queue.DefaultMaxRetry {
		if _, _, err := a.Store.JobSetStatus(ctx, &store.JobSetStatusParams{ID: killer.ID,
			From: []store.JobStatus{store.JobRunning, store.JobQueued}, To: store.JobQueued, CountAttempt: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, started, err := a.Store.JobStart(ctx, killer.ID, "w-dead"); err != nil || !started {
		t.Fatalf("JobStart: %v, %v", started, err)
	}
	if err := a.Store.WorkerGone(ctx, "w-dead"); err != nil {
		t.Fatal(err)
	}
	r := reconciler(a, time.Now)
	n, err := r.HandOff(ctx)
	if err != nil || n != 1 {
		t.Fatalf("HandOff = %d, %v; want the dead worker's one job", n, err)
	}
	got, _ := a.Store.JobGetByID(ctx, dead.ID)
	if got.Status != store.JobQueued || got.Attempts != 1 {
		t.Fatalf("handed-off job: %s after %d attempts; want queued, its lost delivery counted", got.Status, got.Attempts)
	}
	tasks, err := asynq.NewInspectorFromRedisClient(a.Redis).ListPendingTasks(a.Queue.Namespace().Queue(queue.Jobs))
	if err != nil || len(tasks) != 1 || !strings.HasPrefix(tasks[0].ID, dead.ID+"~") {
		t.Fatalf("pending tasks %+v, %v; want one of %s's own", tasks, err, dead.ID)
	}
	if got, _ := a.Store.JobGetByID(ctx, killer.ID); got.Status != store.JobFailed || got.Error == nil || got.Error.Code != client.CodeWorkerLost {
		t.Fatalf("job whose workers all died: %s %+v; want failed worker_lost", got.Status, got.Error)
	}
	if got, _ := a.Store.JobGetByID(ctx, live.ID); got.Status != store.JobRunning {
		t.Fatalf("the live worker's job is %s, want running", got.Status)
	}
	if n, err := r.HandOff(ctx); err != nil || n != 0 {
		t.Fatalf("second HandOff = %d, %v; want none", n, err)
	}
}
