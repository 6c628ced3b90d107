package queue

import (
	"context"
	"encoding/json"
	"fmt"
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
	return testutil.Must(NewClient(ac, ClientOptions{Namespace: ns})), NewInspector(in, ns)
}

func TestEnqueueJobIsIdempotentByJobID(t *testing.T) {
	t.Parallel()
	c, in := setup(t)
	ctx := context.Background()
	ok, err := c.EnqueueJob(ctx, JobRef{ID: "job_a", Queue: Default})
	if err != nil || !ok {
		t.Fatalf("first enqueue = %v, %v; want true, nil", ok, err)
	}
	ok, err = c.EnqueueJob(ctx, JobRef{ID: "job_a", Queue: Default})
	if err != nil || ok {
		t.Fatalf("second enqueue = %v, %v; want false, nil", ok, err)
	}
	st, err := in.JobTaskState(ctx, Default, "job_a")
	if err != nil || st != TaskPending {
		t.Fatalf("state = %q, %v; want pending", st, err)
	}
	st, err = in.JobTaskState(ctx, Default, "job_missing")
	if err != nil || st != TaskMissing {
		t.Fatalf("state of unknown job = %q, %v; want missing", st, err)
	}
	if _, err := c.EnqueueJob(ctx, JobRef{ID: "job_b", Queue: "urgent"}); err == nil {
		t.Fatal("enqueue to an unknown queue succeeded")
	}
}

func TestEnqueueJobsCountsNewTasksOnly(t *testing.T) {
	t.Parallel()
	c, in := setup(t)
	ctx := context.Background()
	var refs []JobRef
	for i := 0; i < 300; i++ {
		refs = append(refs, JobRef{ID: fmt.Sprintf("job_%03d", i), Queue: Batch})
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
	if sizes[Batch] != 300 || sizes[Default] != 0 || len(stats) != 5 {
		t.Fatalf("queue sizes = %v (%d queues); want batch=300, 5 queues", sizes, len(stats))
	}
}

func TestScheduledJobAndArchivedDelete(t *testing.T) {
	t.Parallel()
	c, in := setup(t)
	ctx := context.Background()
	if _, err := c.EnqueueJob(ctx, JobRef{ID: "job_later", Queue: Low, In: time.Hour}); err != nil {
		t.Fatal(err)
	}
	st, err := in.JobTaskState(ctx, Low, "job_later")
	if err != nil || st != TaskScheduled {
		t.Fatalf("state = %q, %v; want scheduled", st, err)
	}
	if err := in.in.ArchiveTask(c.Namespace().Queue(Low), "job_later"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.EnqueueJob(ctx, JobRef{ID: "job_later", Queue: Low}); ok {
		t.Fatal("enqueue succeeded while the archived task holds the id")
	}
	if err := in.DeleteArchivedJob(ctx, Low, "job_later"); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.EnqueueJob(ctx, JobRef{ID: "job_later", Queue: Low}); !ok || err != nil {
		t.Fatalf("enqueue after deleting the archived task = %v, %v", ok, err)
	}
}

func TestNamespaceNamesAndWeights(t *testing.T) {
	t.Parallel()
	ns := Namespace("acme")
	if got := ns.Queue(Critical); got != "acme:critical" {
		t.Fatalf("Queue = %q", got)
	}
	if name, ok := ns.Name("acme:batch"); !ok || name != Batch {
		t.Fatalf("Name = %q, %v", name, ok)
	}
	if _, ok := ns.Name("other:batch"); ok {
		t.Fatal("Name accepted another namespace")
	}
	w := ns.JobWeights()
	if w["acme:critical"] <= w["acme:default"] || w["acme:default"] <= w["acme:low"] || w["acme:low"] <= w["acme:batch"] {
		t.Fatalf("weights do not put interactive work above batch: %v", w)
	}
	if _, ok := w["acme:webhooks"]; ok || len(w) != len(Priorities) {
		t.Fatalf("job weights %v, want the priorities' queues only (webhooks have a server of their own)", w)
	}
	if q := Namespace("").Queues(); q[0] != Critical {
		t.Fatalf("Queues()[0] = %q, want critical first", q[0])
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
	// Written without encoding/json for plain ids, byte for byte what it
	// writes; read back whatever wrote it, escapes and spacing included.
	for _, id := range []string{"job_01m8ydcff8t0ny6wgwa154xyze", "a", `job_"quoted"`, "job_é", `job_\x`, "job_</script>"} {
		b, err := jobPayload(id)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := json.Marshal(JobPayload{JobID: id}); string(b) != string(want) {
			t.Errorf("payload of %q = %s, want %s", id, b, want)
		}
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
