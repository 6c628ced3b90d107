package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const redisDB = 3

func setup(t *testing.T) (*Client, *Inspector) {
	t.Helper()
	opt := testutil.AsynqOpt(t, redisDB)
	ns := Namespace(testutil.Prefix(t))
	ac := asynq.NewClient(opt)
	in := asynq.NewInspector(opt)
	t.Cleanup(func() {
		for _, q := range ns.Queues() {
			_ = in.DeleteQueue(q, true)
		}
		_ = ac.Close()
		_ = in.Close()
	})
	return NewClient(ac, ClientOptions{Namespace: ns}), NewInspector(in, ns)
}

func TestEnqueueJobIsIdempotentByJobID(t *testing.T) {
	t.Parallel()
	c, in := setup(t)
	ctx := context.Background()
	ok, err := c.EnqueueJob(ctx, JobRef{ID: "job_a", Priority: Default})
	if err != nil || !ok {
		t.Fatalf("first enqueue = %v, %v; want true, nil", ok, err)
	}
	ok, err = c.EnqueueJob(ctx, JobRef{ID: "job_a", Priority: Default})
	if err != nil || ok {
		t.Fatalf("second enqueue = %v, %v; want false, nil", ok, err)
	}
	st, err := in.JobTaskState(ctx, "job_a")
	if err != nil || st != TaskPending {
		t.Fatalf("state = %q, %v; want pending", st, err)
	}
	st, err = in.JobTaskState(ctx, "job_missing")
	if err != nil || st != TaskMissing {
		t.Fatalf("state of unknown job = %q, %v; want missing", st, err)
	}
	if _, err := c.EnqueueJob(ctx, JobRef{ID: "job_b", Priority: "urgent"}); err == nil {
		t.Fatal("enqueue to an unknown queue succeeded")
	}
}

func TestEnqueueJobsCountsNewTasksOnly(t *testing.T) {
	t.Parallel()
	c, in := setup(t)
	ctx := context.Background()
	var refs []JobRef
	for i := 0; i < 300; i++ {
		refs = append(refs, JobRef{ID: fmt.Sprintf("job_%03d", i), Priority: Batch})
	}
	n, err := c.EnqueueJobs(ctx, refs[:200])
	if err != nil || n != 200 {
		t.Fatalf("EnqueueJobs = %d, %v; want 200", n, err)
	}
	n, err = c.EnqueueJobs(ctx, refs)
	if err != nil || n != 100 {
		t.Fatalf("EnqueueJobs again = %d, %v; want 100 new", n, err)
	}
	stats, err := in.QueueStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int{}
	for _, s := range stats {
		sizes[s.Name] = s.Size
	}
	if sizes[Jobs] != 300 || sizes[Webhooks] != 0 || len(stats) != 2 {
		t.Fatalf("queue sizes = %v (%d queues); want jobs=300 and the webhooks queue empty", sizes, len(stats))
	}
}

func TestScheduledJobAndArchivedDelete(t *testing.T) {
	t.Parallel()
	c, in := setup(t)
	ctx := context.Background()
	if _, err := c.EnqueueJob(ctx, JobRef{ID: "job_later", Priority: Low, In: time.Hour}); err != nil {
		t.Fatal(err)
	}
	st, err := in.JobTaskState(ctx, "job_later")
	if err != nil || st != TaskScheduled {
		t.Fatalf("state = %q, %v; want scheduled", st, err)
	}
	if err := in.in.ArchiveTask(c.Namespace().Queue(Jobs), "job_later"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.EnqueueJob(ctx, JobRef{ID: "job_later", Priority: Low}); ok {
		t.Fatal("enqueue succeeded while the archived task holds the id")
	}
	if err := in.DeleteArchivedJob(ctx, "job_later"); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.EnqueueJob(ctx, JobRef{ID: "job_later", Priority: Low}); !ok || err != nil {
		t.Fatalf("enqueue after deleting the archived task = %v, %v", ok, err)
	}
}

func TestNamespaceQueues(t *testing.T) {
	t.Parallel()
	if got := Namespace("acme").Queues(); !slices.Equal(got, []string{"acme:jobs", "acme:webhooks"}) {
		t.Fatalf("Queues = %q, want the jobs queue and the webhooks queue", got)
	}
	if got := Namespace("").Queue(Jobs); got != "jobs" {
		t.Fatalf("Queue = %q, want the bare name without a namespace", got)
	}
}

func TestPayloadParsing(t *testing.T) {
	t.Parallel()
	if _, err := ParseJobPayload(asynq.NewTask(TypeJob, []byte(`{}`))); err == nil {
		t.Fatal("empty job payload accepted")
	}
	id, err := ParseJobPayload(asynq.NewTask(TypeJob, []byte(`{"job_id":"job_x"}`)))
	if err != nil || id != "job_x" {
		t.Fatalf("ParseJobPayload = %q, %v", id, err)
	}
	for _, id := range []string{"job_01m8ydcff8t0ny6wgwa154xyze", `job_"quoted"`, "job_é", "job_</script>"} {
		b, _ := json.Marshal(jobPayload{JobID: id})
		if got, err := ParseJobPayload(asynq.NewTask(TypeJob, b)); err != nil || got != id {
			t.Errorf("ParseJobPayload(%s) = %q, %v; want %q", b, got, err, id)
		}
	}
	for payload, want := range map[string]string{
		`{ "job_id" : "job_x" }`: "job_x", `{"job_id":"job\u005fx"}`: "job_x", `{"job_id":"job_x","extra":1}`: "job_x",
	} {
		if got, err := ParseJobPayload(asynq.NewTask(TypeJob, []byte(payload))); err != nil || got != want {
			t.Errorf("ParseJobPayload(%s) = %q, %v; want %q", payload, got, err, want)
		}
	}
	for _, payload := range []string{`{"job_id":""}`, `{"job_id":"x"`, `{"job_id":"a"}}`, `"x"`} {
		if got, err := ParseJobPayload(asynq.NewTask(TypeJob, []byte(payload))); err == nil {
			t.Errorf("ParseJobPayload(%s) = %q, want an error", payload, got)
		}
	}
	if _, err := ParseWebhookPayload(asynq.NewTask(TypeWebhook, []byte(`{"kind":"user","id":"x"}`))); err == nil {
		t.Fatal("webhook payload of unknown kind accepted")
	}
}
