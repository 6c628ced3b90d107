package api_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// checkQueueStoreUnavailable asserts the answer to a request refused while
// Redis cannot serve: 503 in the one error shape, naming the queue store,
// with a Retry-After of a few seconds.
func checkQueueStoreUnavailable(t *testing.T, what string, r *apptest.Response) {
	t.Helper()
	e := checkError(t, r, http.StatusServiceUnavailable, client.CodeQueueStoreUnavailable, "")
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

// checkDatabaseUnavailable asserts the answer to a request refused while
// the database cannot serve: 503 in the one error shape, naming the
// database, with a Retry-After of a few seconds, and nothing of the
// failure itself (the driver's words, an address, a stack).
func checkDatabaseUnavailable(t *testing.T, what string, r *apptest.Response, hidden ...string) {
	t.Helper()
	e := checkError(t, r, http.StatusServiceUnavailable, client.CodeDatabaseUnavailable, "")
	if e.Error.Type != "service_unavailable_error" || !strings.Contains(e.Error.Message, "database") {
		t.Errorf("%s: error %+v does not say the database is unavailable", what, e.Error)
	}
	if e.Error.Param != nil {
		t.Errorf("%s: param = %q, want null", what, *e.Error.Param)
	}
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 || s > 10 {
		t.Errorf("%s: Retry-After = %q, want a few seconds", what, r.Header.Get("Retry-After"))
	}
	for _, s := range append(hidden, "127.0.0.1", "postgres", "dial", "refused", "EOF", "SQLSTATE", "goroutine", ".go:") {
		if strings.Contains(string(r.Body), s) {
			t.Errorf("%s: the answer shows %q: %s", what, s, r.Body)
		}
	}
}

// While the database is unreachable (its connections cut, every new one
// refused), every request that needs it — a tenant's, with a key in the
// dispatcher's cache or not, jobs, the synchronous endpoints, files,
// batches, the admin API — is a 503 database_unavailable with
// Retry-After that creates nothing, enqueues nothing and reserves
// nothing; /readyz says the database is not ready; once it answers again
// the same dispatcher serves, with nothing restarted.
func TestDatabaseDownIsUnavailableAndChangesNothing(t *testing.T) {
	t.Parallel()
	pg, err := url.Parse(testutil.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testutil.StartTCPProxy(t, pg.Host)
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, NoScheduler: true, Env: func(e *config.Env) {
		u, err := url.Parse(e.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = proxy.Addr
		e.DatabaseURL = u.String()
	}})
	tenant, key := a.Tenant("standard")
	_, uncached := a.Tenant("standard") // never used: not in the key cache
	ctx := context.Background()
	r := uploadParts(t, a, key, part{"purpose", "", "batch"}, part{"file", "in.jsonl", jsonl(2)})
	if r.Status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.Status, r.Body)
	}
	fileID := r.Map(t)["id"].(string)
	r = a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("before", "", 5)})
	if r.Status != http.StatusAccepted {
		t.Fatalf("job before the outage: %d %s", r.Status, r.Body)
	}
	before := r.Map(t)["id"].(string)
	tenants, _, err := a.Store.TenantList(ctx, &store.TenantListParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	tasks := a.TaskCount()
	acct := a.Account(tenant)

	streamed := apptest.ChatBody("hi", "", 5)
	streamed["stream"] = true
	requests := []struct {
		method, path, key string
		body              any
	}{
		{"POST", "/v1/jobs", key, map[string]any{"custom_id": "during-outage", "body": apptest.ChatBody("hi", "", 5)}},
		{"POST", "/v1/jobs", uncached, map[string]any{"body": apptest.ChatBody("hi", "", 5)}},
		{"GET", "/v1/jobs/" + before, key, nil},
		{"GET", "/v1/jobs", key, nil},
		{"DELETE", "/v1/jobs/" + before, key, nil},
		{"POST", "/v1/chat/completions", key, apptest.ChatBody("hi", "", 5)},
		{"POST", "/v1/chat/completions", key, streamed},
		{"POST", "/v1/embeddings", key, map[string]any{"model": "text-embedding-3-small", "input": "hi"}},
		{"POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":20}`},
		{"POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":20,"background":true}`},
		{"GET", "/v1/files", key, nil},
		{"GET", "/v1/files/" + fileID, key, nil},
		{"POST", "/v1/batches", key, map[string]any{"input_file_id": fileID, "endpoint": "/v1/chat/completions", "completion_window": "24h"}},
		{"GET", "/v1/batches", key, nil},
		{"GET", "/admin/v1/tenants", apptest.AdminToken, nil},
		{"GET", "/admin/v1/tenants/" + tenant, apptest.AdminToken, nil},
		{"POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": "during-outage", "tier": "standard"}},
		{"POST", "/admin/v1/tenants/" + tenant + "/keys", apptest.AdminToken, nil},
	}

	proxy.Cut()
	port := strings.TrimPrefix(proxy.Addr, "127.0.0.1:")
	for _, q := range requests {
		what := q.method + " " + q.path
		checkDatabaseUnavailable(t, what, a.Do(q.method, q.path, q.key, q.body), port)
	}
	checkDatabaseUnavailable(t, "POST /v1/files", uploadParts(t, a, key, part{"purpose", "", "batch"}, part{"file", "in.jsonl", jsonl(2)}), port)
	ready := a.Do("GET", "/readyz", "", nil)
	if m := ready.Map(t); ready.Status != http.StatusServiceUnavailable || m["redis"] != "ok" || m["database"] == "ok" {
		t.Fatalf("readyz with the database down: %d %s", ready.Status, ready.Body)
	}
	if strings.Contains(string(ready.Body), port) {
		t.Fatalf("readyz shows the database's address: %s", ready.Body)
	}
	// Nothing was reserved: the budget lives in Redis, which is up.
	if d, err := a.Budgets.Status(ctx, acct); err != nil || d.Reserved != 0 || d.Spent != 0 {
		t.Fatalf("the tenant's budget after the refused requests: %+v, %v", d, err)
	}

	// Back: the same dispatcher serves again, and the refused requests
	// left nothing behind.
	proxy.Restore()
	testutil.Eventually(t, 10*time.Second, func() bool { return a.Do("GET", "/readyz", "", nil).Status == http.StatusOK })
	jobs, _, err := a.Store.JobList(ctx, &store.JobListParams{TenantID: tenant, Limit: 10})
	if err != nil || len(jobs) != 1 || jobs[0].ID != before || jobs[0].Status != store.JobQueued {
		t.Fatalf("the tenant's jobs after the outage: %d (%v), want the one made before, still queued", len(jobs), err)
	}
	if n := a.TaskCount(); n != tasks {
		t.Fatalf("%d jobs enqueued after the outage, %d before", n, tasks)
	}
	nothingStored := func(what string, n int, err error) {
		t.Helper()
		if err != nil || n != 0 {
			t.Fatalf("%s after the outage: %d (%v)", what, n, err)
		}
	}
	batches, _, err := a.Store.BatchList(ctx, &store.BatchListParams{TenantID: tenant})
	nothingStored("batches", len(batches), err)
	rows, err := a.Store.UsageReport(ctx, &store.UsageReportParams{Day: time.Now().UTC().Format(time.DateOnly), TenantID: tenant})
	nothingStored("ledger rows", len(rows), err)
	files, _, err := a.Store.FileList(ctx, &store.FileListParams{TenantID: tenant})
	if err != nil || len(files) != 1 || files[0].ID != fileID {
		t.Fatalf("the tenant's files after the outage: %d (%v), want the one uploaded before", len(files), err)
	}
	after, _, err := a.Store.TenantList(ctx, &store.TenantListParams{Limit: 1000})
	if err != nil || len(after) != len(tenants) {
		t.Fatalf("%d tenants after the outage, %d before (%v)", len(after), len(tenants), err)
	}
	if r := a.Do("POST", "/v1/jobs", uncached, map[string]any{"body": apptest.ChatBody("after", "", 5)}); r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/jobs once the database is back: %d %s", r.Status, r.Body)
	}
}
