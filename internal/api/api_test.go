package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

const redisDB = 5

func start(t *testing.T) *apptest.App {
	t.Helper()
	return apptest.Start(t, apptest.Options{RedisDB: redisDB})
}

type apiError struct {
	Error struct {
		Message string       `json:"message"`
		Type    string       `json:"type"`
		Code    *client.Code `json:"code"`
		Param   *string      `json:"param"`
	} `json:"error"`
}

// checkError asserts an OpenAI-shaped error with status, code and param.
func checkError(t *testing.T, r *apptest.Response, status int, code client.Code, param string) apiError {
	t.Helper()
	var e apiError
	r.JSON(t, &e)
	if r.Status != status {
		t.Fatalf("status = %d, want %d: %s", r.Status, status, r.Body)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("error without message or type: %s", r.Body)
	}
	deref := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}
	if code != "" && deref((*string)(e.Error.Code)) != string(code) {
		t.Fatalf("code = %s, want %q: %s", deref((*string)(e.Error.Code)), code, r.Body)
	}
	if param != "" && deref(e.Error.Param) != param {
		t.Fatalf("param = %s, want %q: %s", deref(e.Error.Param), param, r.Body)
	}
	if strings.Contains(string(r.Body), "goroutine") || strings.Contains(string(r.Body), ".go:") {
		t.Fatalf("error leaks internals: %s", r.Body)
	}
	return e
}

// nothingQueued asserts that tenant has no job and no queue holds a task.
func nothingQueued(t *testing.T, a *apptest.App, tenantID string) {
	t.Helper()
	jobs, _, err := a.Store.JobList(context.Background(), &store.JobListParams{TenantID: tenantID, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 0 {
		t.Fatalf("a rejected request stored %d jobs", len(jobs))
	}
	if n := a.TaskCount(); n != 0 {
		t.Fatalf("a rejected request enqueued %d tasks", n)
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	chat := func(extra map[string]any) map[string]any {
		b := apptest.ChatBody("hello", "", 50)
		for k, v := range extra {
			b[k] = v
		}
		return map[string]any{"body": b}
	}
	huge := `{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<20) + `"}]}}`
	cases := []struct {
		name   string
		body   any
		status int
		code   client.Code
		param  string
	}{
		{"malformed JSON", `{"body": {"model": "gpt-4o-mini", `, 400, client.CodeInvalidJSON, ""},
		{"not an object", `[1,2]`, 400, client.CodeInvalidJSON, ""},
		{"empty body", ``, 400, client.CodeInvalidJSON, ""},
		{"unknown field", `{"bdy":{}}`, 400, client.CodeUnknownField, "bdy"},
		{"wrong type", `{"body":{},"priority":5}`, 400, client.CodeInvalidType, "priority"},
		{"no body", `{}`, 400, client.CodeMissingBody, "body"},
		{"unknown model", chat(map[string]any{"model": "gpt-9"}), 400, client.CodeModelNotFound, "body.model"},
		{"no messages", map[string]any{"body": map[string]any{"model": "gpt-4o-mini"}}, 400, client.CodeInvalidRequest, "body.messages"},
		{"empty messages", chat(map[string]any{"messages": []any{}}), 400, client.CodeInvalidRequest, "body.messages"},
		{"bad role", chat(map[string]any{"messages": []any{map[string]any{"role": "robot", "content": "x"}}}), 400, client.CodeInvalidRequest, ""},
		{"max_tokens beyond capacity", chat(map[string]any{"max_tokens": 400000}), 400, client.CodeTokensExceedCapacity, "body.max_tokens"},
		{"max_tokens zero", chat(map[string]any{"max_tokens": 0}), 400, client.CodeInvalidRequest, "body.max_tokens"},
		{"stream", chat(map[string]any{"stream": true}), 400, client.CodeInvalidRequest, "body.stream"},
		{"over the size limit", huge, 413, client.CodeRequestTooLarge, ""},
		{"unknown endpoint", map[string]any{"endpoint": "/v1/completions", "body": apptest.ChatBody("x", "", 5)}, 400, client.CodeInvalidEndpoint, "endpoint"},
		{"chat model on embeddings", map[string]any{"endpoint": "/v1/embeddings", "body": map[string]any{"model": "gpt-4o-mini", "input": "x"}}, 400, client.CodeModelNotSupported, "body.model"},
		{"priority above tier", map[string]any{"priority": "critical", "body": apptest.ChatBody("x", "", 5)}, 400, client.CodePriorityNotAllowed, "priority"},
		{"unknown priority", map[string]any{"priority": "urgent", "body": apptest.ChatBody("x", "", 5)}, 400, client.CodeInvalidValue, "priority"},
		{"bad webhook", map[string]any{"webhook_url": "ftp://x", "body": apptest.ChatBody("x", "", 5)}, 400, client.CodeInvalidURL, "webhook_url"},
		{"too much metadata", map[string]any{"metadata": manyKeys(17), "body": apptest.ChatBody("x", "", 5)}, 400, client.CodeInvalidMetadata, "metadata"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, a.Do("POST", "/v1/jobs", key, c.body), c.status, c.code, c.param)
		})
	}
	nothingQueued(t, a, tenant)
}

func manyKeys(n int) map[string]string {
	m := map[string]string{}
	for i := 0; i < n; i++ {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	return m
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	body := map[string]any{"body": apptest.ChatBody("x", "", 5)}
	checkError(t, a.Do("POST", "/v1/jobs", "", body), 401, client.CodeInvalidAPIKey, "")
	checkError(t, a.Do("POST", "/v1/jobs", "llmq_wrongwrongwrongwrongwrongwrongwrongwron", body), 401, client.CodeInvalidAPIKey, "")
	checkError(t, a.Do("GET", "/v1/jobs", apptest.AdminToken, nil), 401, client.CodeInvalidAPIKey, "")

	// Revoke the key: it stops working at once.
	keys := a.Do("GET", "/admin/v1/tenants/"+tenant+"/keys", apptest.AdminToken, nil).Map(t)
	keyID := keys["data"].([]any)[0].(map[string]any)["id"].(string)
	if r := a.Do("DELETE", "/admin/v1/keys/"+keyID, apptest.AdminToken, nil); r.Status != 200 {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	checkError(t, a.Do("POST", "/v1/jobs", key, body), 401, client.CodeInvalidAPIKey, "")
	nothingQueued(t, a, tenant)

	// The admin API wants the admin token, and only it.
	checkError(t, a.Do("GET", "/admin/v1/tenants", "", nil), 401, client.CodeInvalidAdminToken, "")
	checkError(t, a.Do("GET", "/admin/v1/tenants", key, nil), 401, client.CodeInvalidAdminToken, "")
	if strings.Contains(string(a.Do("GET", "/admin/v1/tenants", apptest.AdminToken, nil).Body), "whsec_") {
		t.Fatal("tenant list shows webhook secrets")
	}
}

func TestAnotherTenantsJobIsNotFound(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, keyA := a.Tenant("standard")
	tenantB, keyB := a.Tenant("standard")
	r := a.Do("POST", "/v1/jobs", keyA, map[string]any{"body": apptest.ChatBody("mine", "", 5)})
	if r.Status != 202 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	id := r.Map(t)["id"].(string)
	checkError(t, a.Do("GET", "/v1/jobs/"+id, keyB, nil), 404, client.CodeNotFound, "")
	checkError(t, a.Do("DELETE", "/v1/jobs/"+id, keyB, nil), 404, client.CodeNotFound, "")
	if l := a.Do("GET", "/v1/jobs", keyB, nil).Map(t); len(l["data"].([]any)) != 0 {
		t.Fatalf("tenant B lists A's jobs: %v", l)
	}
	// B's failed cancel changed nothing.
	if st := a.Do("GET", "/v1/jobs/"+id, keyA, nil).Map(t)["status"]; st != "queued" {
		t.Fatalf("status after B's cancel = %v", st)
	}
	nothingQueuedFor(t, a, tenantB)
}

func nothingQueuedFor(t *testing.T, a *apptest.App, tenantID string) {
	t.Helper()
	jobs, _, err := a.Store.JobList(context.Background(), &store.JobListParams{TenantID: tenantID, Limit: 10})
	if err != nil || len(jobs) != 0 {
		t.Fatalf("tenant %s has %d jobs (%v)", tenantID, len(jobs), err)
	}
}

func TestCreateGetListCancel(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("standard")
	var ids []string
	for i := 0; i < 5; i++ {
		r := a.Do("POST", "/v1/jobs", key, map[string]any{"custom_id": fmt.Sprintf("c%d", i), "body": apptest.ChatBody("hi", "", 10),
			"metadata": map[string]string{"run": "7"}})
		if r.Status != http.StatusAccepted {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		j := r.Map(t)
		if j["status"] != "queued" || j["object"] != "job" || j["priority"] != "default" || j["custom_id"] != fmt.Sprintf("c%d", i) {
			t.Fatalf("created job = %v", j)
		}
		est := j["estimate"].(map[string]any)
		if est["max_tokens"].(float64) != 10 || est["prompt_tokens"].(float64) < 1 || est["cost_usd"].(float64) <= 0 {
			t.Fatalf("estimate = %v", est)
		}
		ids = append(ids, j["id"].(string))
	}
	// Each job waits in its fair queue, then the scheduler queues its task
	// under the job's id in asynq's jobs queue (and nothing in the
	// webhooks queue).
	testutil.Eventually(t, 5*time.Second, func() bool {
		stats, err := a.Inspector.QueueStats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stats {
			if (s.Name == queue.Jobs) != (s.Size == 5) {
				return false
			}
		}
		return true
	})
	// Pages of two, newest first, no gaps or repeats.
	var seen []string
	after := ""
	for page := 0; page < 5; page++ {
		l := a.Do("GET", "/v1/jobs?limit=2"+after, key, nil).Map(t)
		for _, d := range l["data"].([]any) {
			seen = append(seen, d.(map[string]any)["id"].(string))
		}
		if l["has_more"] != true {
			break
		}
		after = "&after=" + l["last_id"].(string)
	}
	if len(seen) != 5 || seen[0] != ids[4] || seen[4] != ids[0] {
		t.Fatalf("listed %v, want the 5 jobs newest first (%v)", seen, ids)
	}
	checkError(t, a.Do("GET", "/v1/jobs?limit=0", key, nil), 400, client.CodeInvalidValue, "limit")
	checkError(t, a.Do("GET", "/v1/jobs?status=lost", key, nil), 400, client.CodeInvalidValue, "status")
	if l := a.Do("GET", "/v1/jobs?status=succeeded", key, nil).Map(t); len(l["data"].([]any)) != 0 {
		t.Fatal("status filter ignored")
	}

	r := a.Do("DELETE", "/v1/jobs/"+ids[0], key, nil)
	if r.Status != 200 || r.Map(t)["status"] != "cancelled" {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	if r := a.Do("DELETE", "/v1/jobs/"+ids[0], key, nil); r.Status != 200 {
		t.Fatalf("cancelling a cancelled job again: %d %s", r.Status, r.Body)
	}
	checkError(t, a.Do("GET", "/v1/jobs/job_01nosuchjob00000000000000", key, nil), 404, client.CodeNotFound, "")
	checkError(t, a.Do("GET", "/v1/nothing", key, nil), 404, client.CodeUnknownURL, "")
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	h := http.Header{"Idempotency-Key": {"order-1"}}
	body := map[string]any{"custom_id": "o1", "body": apptest.ChatBody("once", "", 5)}
	r1 := apptest.Do(t, a.URL, "POST", "/v1/jobs", key, body, h)
	r2 := apptest.Do(t, a.URL, "POST", "/v1/jobs", key, body, h)
	if r1.Status != 202 || r2.Status != 202 || r1.Map(t)["id"] != r2.Map(t)["id"] || r2.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s / %d %s", r1.Status, r1.Body, r2.Status, r2.Body)
	}
	other := map[string]any{"custom_id": "o1", "body": apptest.ChatBody("different", "", 5)}
	checkError(t, apptest.Do(t, a.URL, "POST", "/v1/jobs", key, other, h), 409, client.CodeIdempotencyKeyReused, "Idempotency-Key")
	jobs, _, err := a.Store.JobList(context.Background(), &store.JobListParams{TenantID: tenant, Limit: 10})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("jobs stored = %d (%v), want 1", len(jobs), err)
	}
	if n := a.TaskCount(); n != 1 {
		t.Fatalf("tasks queued = %d, want 1", n)
	}
}

func TestPerKeyRateLimitHeaders(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("free") // api_rps 5
	var limited *apptest.Response
	for i := 0; i < 8; i++ {
		r := a.Do("GET", "/v1/jobs", key, nil)
		if r.Header.Get("X-RateLimit-Limit") != "5" || r.Header.Get("X-RateLimit-Remaining") == "" || r.Header.Get("X-RateLimit-Reset") == "" {
			t.Fatalf("response %d lacks X-RateLimit-* headers: %v", i, r.Header)
		}
		// The budget header is on every tenant response, the 429 included.
		if r.Header.Get("X-Budget-Remaining") != "1.000000" {
			t.Fatalf("response %d (%d): X-Budget-Remaining = %q", i, r.Status, r.Header.Get("X-Budget-Remaining"))
		}
		if r.Status == 429 {
			limited = r
			break
		}
	}
	if limited == nil {
		t.Fatal("8 requests within a second never hit the 5 rps limit")
	}
	checkError(t, limited, 429, client.CodeRateLimitExceeded, "")
	if limited.Header.Get("Retry-After") == "" || limited.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("429 headers: %v", limited.Header)
	}
	// An exempt tier has no per-key limit.
	_, internal := a.Tenant("internal")
	for i := 0; i < 20; i++ {
		if r := a.Do("GET", "/v1/jobs", internal, nil); r.Status != 200 || r.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("exempt key: %d %v", r.Status, r.Header)
		}
	}
}

func TestAdminTenantsAndKeys(t *testing.T) {
	t.Parallel()
	a := start(t)
	checkError(t, a.Do("POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": "x", "tier": "gold"}), 400, client.CodeUnknownTier, "tier")
	checkError(t, a.Do("POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": "", "tier": "free"}), 400, client.CodeInvalidValue, "name")
	checkError(t, a.Do("POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": "x", "tier": "free", "daily_budget_usd": -1}), 400, client.CodeInvalidValue, "daily_budget_usd")
	r := a.Do("POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": "acme", "tier": "free", "daily_budget_usd": 2.5})
	if r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	ten := r.Map(t)
	id := ten["id"].(string)
	if ten["daily_budget_usd"] != 2.5 || !strings.HasPrefix(ten["webhook_secret"].(string), "whsec_") {
		t.Fatalf("tenant = %v", ten)
	}
	r = a.Do("PATCH", "/admin/v1/tenants/"+id, apptest.AdminToken, map[string]any{"tier": "premium", "daily_budget_usd": nil})
	if r.Status != 200 || r.Map(t)["tier"] != "premium" || r.Map(t)["daily_budget_usd"] != nil {
		t.Fatalf("update: %d %s", r.Status, r.Body)
	}
	checkError(t, a.Do("PATCH", "/admin/v1/tenants/"+id, apptest.AdminToken, map[string]any{"tier": "gold"}), 400, client.CodeUnknownTier, "tier")
	checkError(t, a.Do("PATCH", "/admin/v1/tenants/ten_nope", apptest.AdminToken, map[string]any{"name": "n"}), 404, client.CodeNotFound, "")

	k := a.Do("POST", "/admin/v1/tenants/"+id+"/keys", apptest.AdminToken, nil).Map(t)
	plain := k["key"].(string)
	if !strings.HasPrefix(plain, k["prefix"].(string)) || len(plain) < 40 {
		t.Fatalf("key = %v", k)
	}
	// The plaintext is shown once: never in listings, never stored.
	l := a.Do("GET", "/admin/v1/tenants/"+id+"/keys", apptest.AdminToken, nil)
	if strings.Contains(string(l.Body), plain) {
		t.Fatal("key listing shows the plaintext key")
	}
	keys, err := a.Store.APIKeyListByTenant(context.Background(), id)
	if err != nil || len(keys) != 1 || strings.Contains(string(keys[0].Hash), plain) {
		t.Fatalf("stored keys = %v (%v)", keys, err)
	}
	checkError(t, a.Do("DELETE", "/admin/v1/keys/key_nope", apptest.AdminToken, nil), 404, client.CodeNotFound, "")
	if r := a.Do("GET", "/v1/usage", plain, nil); r.Status != 200 || r.Map(t)["tier"] != "premium" {
		t.Fatalf("usage with the new key: %d %s", r.Status, r.Body)
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	a := start(t)
	if r := a.Do("GET", "/healthz", "", nil); r.Status != 200 {
		t.Fatalf("healthz: %d", r.Status)
	}
	if r := a.Do("GET", "/readyz", "", nil); r.Status != 200 || r.Map(t)["status"] != "ready" {
		t.Fatalf("readyz: %d %s", r.Status, r.Body)
	}
}

// During a rotation of the admin token the new token and the previous one
// are both accepted; once the previous is removed (a restart without
// LLMQ_ADMIN_TOKEN_PREVIOUS) only the new one is.
func TestAdminTokenRotation(t *testing.T) {
	t.Parallel()
	const next = "rotated-admin-token-9876543210"
	during := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: func(e *config.Env) {
		e.AdminToken, e.AdminTokenPrevious = next, apptest.AdminToken
	}})
	after := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: func(e *config.Env) { e.AdminToken = next }})
	for _, c := range []struct {
		name  string
		a     *apptest.App
		token string
		want  int
	}{
		{"during, new", during, next, 200},
		{"during, previous", during, apptest.AdminToken, 200},
		{"during, other", during, "not-the-admin-token-at-all", 401},
		{"after, new", after, next, 200},
		{"after, previous", after, apptest.AdminToken, 401},
	} {
		if r := c.a.Do("GET", "/admin/v1/tenants", c.token, nil); r.Status != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, r.Status, r.Body, c.want)
		}
	}
}

// GET /admin/v1/retention says what the policy's retention would purge,
// purging nothing; tenants' keys cannot ask.
func TestAdminRetentionPreview(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: apptest.PolicyYAML + "retention: {finished_jobs: 720h, ledger: 2160h}\n"})
	_, key := a.Tenant("standard")
	r := a.Do("GET", "/admin/v1/retention", apptest.AdminToken, nil)
	var got client.Retention
	r.JSON(t, &got)
	if r.Status != 200 || got.FinishedJobs != "720h0m0s" || got.JobsBefore == nil || got.Jobs != 0 || got.Files != "0s" || got.FilesBefore != nil ||
		got.Ledger != "2160h0m0s" || got.LedgerBefore == nil || got.LedgerRows != 0 {
		t.Fatalf("retention preview: %d %s", r.Status, r.Body)
	}
	if r := a.Do("GET", "/admin/v1/retention", key, nil); r.Status != 401 {
		t.Fatalf("a tenant's key: %d %s", r.Status, r.Body)
	}
}

// Rotating a tenant's webhook secret: a new secret, the previous one
// signing beside it until the overlap ends; a bad overlap changes nothing.
func TestRotateWebhookSecret(t *testing.T) {
	t.Parallel()
	a := start(t)
	ctx := context.Background()
	tenant, _ := a.Tenant("standard")
	before, err := a.Store.TenantGetByID(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	path := "/admin/v1/tenants/" + tenant + "/webhook_secret/rotate"
	checkError(t, a.Do("POST", path, apptest.AdminToken, map[string]any{"overlap": "45d"}), 400, client.CodeInvalidValue, "overlap")
	checkError(t, a.Do("POST", "/admin/v1/tenants/ten_nope/webhook_secret/rotate", apptest.AdminToken, nil), 404, client.CodeNotFound, "")
	if got, _ := a.Store.TenantGetByID(ctx, tenant); got.WebhookSecret != before.WebhookSecret {
		t.Fatal("a refused rotation changed the secret")
	}
	r := a.Do("POST", path, apptest.AdminToken, map[string]any{"overlap": "2h"})
	var ten client.Tenant
	r.JSON(t, &ten)
	if r.Status != 200 || ten.WebhookSecret == "" || ten.WebhookSecret == before.WebhookSecret || ten.WebhookSecretPreviousExpiresAt == nil {
		t.Fatalf("rotate: %d %s", r.Status, r.Body)
	}
	after, err := a.Store.TenantGetByID(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if got := after.WebhookSecrets(now); len(got) != 2 || got[0] != ten.WebhookSecret || got[1] != before.WebhookSecret {
		t.Fatalf("secrets during the overlap = %d, want the new and the previous", len(got))
	}
	if got := after.WebhookSecrets(now.Add(2*time.Hour + time.Second)); len(got) != 1 || got[0] != ten.WebhookSecret {
		t.Fatalf("secrets after the overlap = %d, want the new alone", len(got))
	}
}
