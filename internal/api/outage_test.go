package api_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// checkQueueStoreUnavailable asserts the answer to a request refused while
// Redis cannot serve: 503 in the one error shape, naming the queue store,
// with a Retry-After of a few seconds.
func checkQueueStoreUnavailable(t *testing.T, what string, r *apptest.Response) {
	t.Helper()
	e := checkError(t, r, http.StatusServiceUnavailable, "queue_store_unavailable", "")
	if e.Error.Type != "service_unavailable_error" || !strings.Contains(e.Error.Message, "queue store") {
		t.Errorf("%s: error %+v does not say the queue store is unavailable", what, e.Error)
	}
	if e.Error.Param != nil {
		t.Errorf("%s: param = %q, want null", what, *e.Error.Param)
	}
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 || s > 10 {
		t.Errorf("%s: Retry-After = %q, want a few seconds", what, r.Header.Get("Retry-After"))
	}
}

// nothingStored asserts that tenant has no job, no batch and no spend in
// the ledger: a refused request left nothing half made.
func nothingStored(t *testing.T, a *apptest.App, tenantID string) {
	t.Helper()
	ctx := context.Background()
	nothingQueuedFor(t, a, tenantID)
	batches, _, err := a.Store.BatchList(ctx, &store.BatchListParams{TenantID: tenantID})
	if err != nil || len(batches) != 0 {
		t.Fatalf("tenant %s has %d batches (%v)", tenantID, len(batches), err)
	}
	rows, err := a.Store.UsageReport(ctx, &store.UsageReportParams{Day: time.Now().UTC().Format(time.DateOnly), TenantID: tenantID})
	if err != nil || len(rows) != 0 {
		t.Fatalf("tenant %s has %d ledger rows (%v)", tenantID, len(rows), err)
	}
}

// While Redis does not answer, every request that needs it (a job, a
// synchronous completion, streamed or not, an embedding, a batch, the
// usage) is a 503 with Retry-After that creates nothing; once Redis is
// back, empty, the same requests succeed, with nothing restarted.
func TestRedisDownIsUnavailableAndChangesNothing(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/" + strconv.Itoa(redisDB)})
	tenant, key := a.Tenant("standard")
	r := uploadParts(t, a, key, part{"purpose", "", "batch"}, part{"file", "in.jsonl", jsonl(2)})
	if r.Status != 200 {
		t.Fatalf("upload: %d %s", r.Status, r.Body)
	}
	fileID := r.Map(t)["id"].(string)

	job := map[string]any{"custom_id": "during-outage", "body": apptest.ChatBody("hi", "", 5)}
	chat := apptest.ChatBody("hi", "", 5)
	streamed := apptest.ChatBody("hi", "", 5)
	streamed["stream"] = true
	embedding := map[string]any{"model": "text-embedding-3-small", "input": "hi"}
	batch := map[string]any{"input_file_id": fileID, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
	requests := []struct {
		method, path string
		body         any
		ok           int
	}{
		{"POST", "/v1/jobs", job, http.StatusAccepted},
		{"POST", "/v1/chat/completions", chat, http.StatusOK},
		{"POST", "/v1/chat/completions", streamed, http.StatusOK},
		{"POST", "/v1/embeddings", embedding, http.StatusOK},
		{"POST", "/v1/batches", batch, http.StatusOK},
		{"GET", "/v1/usage", nil, http.StatusOK},
	}

	srv.Stop()
	for _, q := range requests {
		checkQueueStoreUnavailable(t, q.method+" "+q.path, a.Do(q.method, q.path, key, q.body))
	}
	nothingStored(t, a, tenant)
	// The admin API needs only the database.
	if r := a.Do("GET", "/admin/v1/tenants/"+tenant, apptest.AdminToken, nil); r.Status != http.StatusOK {
		t.Fatalf("admin read with Redis down: %d %s", r.Status, r.Body)
	}

	// Back, and empty: the first job is accepted as soon as the clients
	// reconnect by themselves.
	srv.Start()
	testutil.Eventually(t, 10*time.Second, func() bool {
		r := a.Do("POST", "/v1/jobs", key, job)
		if r.Status != http.StatusAccepted && r.Status != http.StatusServiceUnavailable {
			t.Fatalf("POST /v1/jobs once Redis is back: %d %s", r.Status, r.Body)
		}
		return r.Status == http.StatusAccepted
	})
	for _, q := range requests[1:] {
		if r := a.Do(q.method, q.path, key, q.body); r.Status != q.ok {
			t.Fatalf("%s %s once Redis is back: %d %s", q.method, q.path, r.Status, r.Body)
		}
	}
}

// A Redis that has become a replica (the old master after a Sentinel
// failover, until the clients follow) refuses writes with READONLY: a 503
// too, that reserves nothing, and the API serves again once it is a master.
func TestRedisReadOnlyReplicaIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/" + strconv.Itoa(redisDB)})
	tenant, key := a.Tenant("standard")
	rdb := srv.Client()
	ctx := context.Background()
	// Nothing listens on port 1: the replica never syncs, and keeps its data.
	if err := rdb.ReplicaOf(ctx, "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	checkQueueStoreUnavailable(t, "POST /v1/jobs", a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("hi", "", 5)}))
	checkQueueStoreUnavailable(t, "POST /v1/chat/completions", a.Do("POST", "/v1/chat/completions", key, apptest.ChatBody("hi", "", 5)))
	nothingStored(t, a, tenant)

	if err := rdb.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	u := a.Do("GET", "/v1/usage", key, nil)
	if u.Status != http.StatusOK {
		t.Fatalf("usage once Redis is a master again: %d %s", u.Status, u.Body)
	}
	if m := u.Map(t); m["spent_usd"] != 0.0 || m["reserved_usd"] != 0.0 {
		t.Fatalf("usage after the refused requests: %s, want nothing spent or reserved", u.Body)
	}
	if r := a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("hi", "", 5)}); r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/jobs once Redis is a master again: %d %s", r.Status, r.Body)
	}
}
