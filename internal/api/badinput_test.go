package api_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/wire"
)

// An unknown path under /v1/ is a 404 in OpenAI's error shape even with a
// valid key and a body that would make a good job: nothing is stored or
// enqueued.
func TestUnknownPathIsNotFoundAndChangesNothing(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	job := map[string]any{"body": apptest.ChatBody("hello", "", 5)}
	for _, path := range []string{
		"/v1/nope",
		"/v1/completions", // OpenAI's legacy endpoint, not served
		"/v1/job",
		"/v1/jobs/job_x/retry",
	} {
		t.Run(path, func(t *testing.T) {
			e := checkError(t, a.Do("POST", path, key, job), 404, client.CodeUnknownURL, "")
			if e.Error.Type != wire.TypeNotFound {
				t.Fatalf("type = %q, want %s", e.Error.Type, wire.TypeNotFound)
			}
		})
	}
	nothingQueued(t, a, tenant)
}

// Another tenant's job id is a 404 for GET and DELETE, and the owner's job
// is untouched: the same row in the store, its task still in the queue.
func TestAnotherTenantsJobIdChangesNothing(t *testing.T) {
	t.Parallel()
	// No scheduler: the job stays where the API put it.
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, NoScheduler: true})
	ctx := context.Background()
	_, keyA := a.Tenant("standard")
	tenantB, keyB := a.Tenant("standard")
	r := a.Do("POST", "/v1/jobs", keyA, map[string]any{"body": apptest.ChatBody("mine", "", 5)})
	if r.Status != 202 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	id := r.Map(t)["id"].(string)
	before, err := a.Store.JobGetByID(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	sizeBefore := a.TaskCount()
	if p := a.Placement(id); p != "waiting" {
		t.Fatalf("the new job is %q, want waiting in its fair queue", p)
	}

	for _, method := range []string{"GET", "DELETE"} {
		e := checkError(t, a.Do(method, "/v1/jobs/"+id, keyB, nil), 404, client.CodeNotFound, "")
		if e.Error.Type != wire.TypeNotFound {
			t.Fatalf("%s: type = %q, want %s", method, e.Error.Type, wire.TypeNotFound)
		}
	}

	after, err := a.Store.JobGetByID(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("tenant B's requests changed A's job:\nbefore %+v\nafter  %+v", before, after)
	}
	if got := a.TaskCount(); got != sizeBefore {
		t.Fatalf("queued tasks: %d before tenant B's requests, %d after", sizeBefore, got)
	}
	if p := a.Placement(id); p != "waiting" {
		t.Fatalf("A's job after B's cancel is %q, want waiting in its fair queue", p)
	}
	nothingQueuedFor(t, a, tenantB)
}

// /readyz answers 503 in the error shape while Redis is down, and 200 again
// once it is back; /healthz, which says only that the process runs, stays
// 200 throughout.
func TestReadyzIsUnavailableWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/0"})
	if r := a.Do("GET", "/readyz", "", nil); r.Status != 200 {
		t.Fatalf("readyz with Redis up: %d %s", r.Status, r.Body)
	}

	srv.Stop()
	checkError(t, a.Do("GET", "/readyz", "", nil), 503, client.CodeNotReady, "")
	if r := a.Do("GET", "/healthz", "", nil); r.Status != 200 {
		t.Fatalf("healthz with Redis down: %d %s", r.Status, r.Body)
	}

	srv.Start()
	if r := a.Do("GET", "/readyz", "", nil); r.Status != 200 || r.Map(t)["status"] != "ready" {
		t.Fatalf("readyz once Redis is back: %d %s", r.Status, r.Body)
	}
}
