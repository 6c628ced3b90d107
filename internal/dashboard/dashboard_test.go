package dashboard_test

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/dashboard"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// redisDB is the Redis database of the dashboard and metrics tests
// (docs/ARCHITECTURE.md).
const redisDB = 9

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// policy is apptest's chat model with a daily token bucket, so a seeded
// level barely moves (it refills 10M tokens a day: ~116 a second) while a
// browser reads it.
const policy = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 3000, tpm: 5000000, tpd: 10000000, burst: 1m}
tiers:
  - name: standard
    daily_budget_usd: 50
    priority: default
    api_rps: 1000
  - name: premium
    daily_budget_usd: 500
    priority: critical
    api_rps: 1000
`

// fixture is a dispatcher (the API with the dashboard, the monitor and
// /metrics mounted as the dispatcher mounts them) over a seeded scenario.
type fixture struct {
	a   *apptest.App
	url string

	acme, beta string // tenants: acme past its soft limit ($41.25 of $50), beta at $12.50 of $500
	batch      string // 10 jobs: 6 succeeded, 1 failed, 3 queued
}

func setup(t *testing.T) *fixture { return setupOn(t, "") }

// setupOn is setup on the Redis at redisURL ("" for the package's DB).
func setupOn(t *testing.T, redisURL string) *fixture {
	t.Helper()
	ctx := context.Background()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, RedisURL: redisURL, Policy: policy})
	rec := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, NoProcessMetrics: true})
	srv := testutil.Must(a.API())
	closer, err := dashboard.MountApp(srv, a.App, rec, dashboard.Options{Refresh: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	f := &fixture{a: a, url: hs.URL}

	f.acme, _ = a.Tenant("standard")
	f.beta, _ = a.Tenant("premium")
	spend(t, a, f.acme, 41_250_000)
	spend(t, a, f.beta, 12_500_000)

	// 4,000,000 tokens of the model's 10,000,000 a day are taken (and 200).
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	// Its provider's answers: 4,900,000 tokens left this minute, and
	// prompts counted a quarter more than llmq's estimate.
	for i := range 3 {
		tokens := int64(4_000_000)
		if i > 0 {
			tokens = 100
		}
		res, err := a.Limiter.Reserve(ctx, admission.Scope(m.Routes()[0]), limiter.Cost{Requests: 1, Tokens: tokens})
		if err != nil || !res.Allowed {
			t.Fatalf("reserve: %v %+v", err, res)
		}
		if _, err := a.Limiter.Settle(ctx, res.Reservation, limiter.Feedback{PromptRatio: 1.25,
			Observed: []limiter.Observed{{Bucket: "tpm", Remaining: 4_900_000}}}); err != nil {
			t.Fatal(err)
		}
	}
	rec.UnpredictedRateLimit("gpt-4o-mini", []string{"tpm"})
	// A restored Redis: one day raised to the ledger by $0.46.
	rec.BudgetRaised(budget.RaisedRestored, 460_000)

	f.batch = seedBatch(t, a, f.acme)

	// The last hour's charts: 4 jobs at $0.25 each, and 1 of 4 calls a 429.
	for range 4 {
		rec.JobFinished(f.acme, "standard", "gpt-4o-mini", string(store.JobSucceeded), 1000, 200, 250_000)
	}
	for _, code := range []int{200, 200, 200, 429} {
		rec.ProviderCall("sim/gpt-4o-mini", "gpt-4o-mini", code, 100*time.Millisecond)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

// spend charges amount to the tenant's budget day, as a settled job would.
func spend(t *testing.T, a *apptest.App, tenantID string, amount money.Micros) {
	t.Helper()
	ctx := context.Background()
	acct := a.Account(tenantID)
	res, dec, err := a.Budgets.Reserve(ctx, acct, "job_seed"+tenantID, amount)
	if err != nil || !dec.Allowed {
		t.Fatalf("reserve %s: %v, %+v", amount, err, dec)
	}
	if err := a.Budgets.Settle(ctx, res, amount, true); err != nil {
		t.Fatal(err)
	}
}

// seedBatch inserts an in-progress batch of 10 jobs through the store: 6
// succeeded, 1 failed and 3 still queued in the batch queue.
func seedBatch(t *testing.T, a *apptest.App, tenantID string) string {
	t.Helper()
	ctx := context.Background()
	file, err := a.Store.FileInsert(ctx, &store.FileInsertParams{
		TenantID: tenantID, Purpose: store.FilePurposeBatch, Filename: "in.jsonl", Content: strings.NewReader("{}\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.Store.BatchInsert(ctx, &store.BatchInsertParams{
		TenantID: tenantID, InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h", Total: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{
		ID: b.ID, From: []store.BatchStatus{store.BatchValidating}, To: store.BatchInProgress,
	}); err != nil {
		t.Fatal(err)
	}
	jobs := make([]*store.JobInsertParams, 10)
	for i := range jobs {
		jobs[i] = &store.JobInsertParams{
			TenantID: tenantID, BatchID: b.ID, LineNo: i, Endpoint: "/v1/chat/completions", Model: "gpt-4o-mini",
			Request: []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`), Queue: queue.Batch,
		}
	}
	ids, err := a.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Format(time.DateOnly)
	for _, id := range ids[:6] {
		if _, err := a.Store.JobComplete(ctx, &store.JobCompleteParams{ID: id, Day: day, ResponseBody: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := a.Store.JobFail(ctx, &store.JobFailParams{ID: ids[6], Error: store.JobError{Message: "bad", Type: "invalid_request_error"}}); err != nil {
		t.Fatal(err)
	}
	// No worker runs: the other three wait in the batch queue.
	for _, id := range ids[7:] {
		if _, err := a.Queue.EnqueueJob(ctx, queue.JobRef{ID: id, Priority: queue.Batch}); err != nil {
			t.Fatal(err)
		}
	}
	return b.ID
}

func basic(token string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+token))
}

func get(t *testing.T, method, url, auth string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func TestAdminPagesNeedTheAdminToken(t *testing.T) {
	t.Parallel()
	// asynqmon lists every queue of its Redis database: on a private
	// server, so the queues other tests add and remove meanwhile do not
	// make it fail.
	f := setupOn(t, "redis://"+testutil.StartRedis(t).Addr)
	for _, path := range []string{"/dashboard", "/dashboard/assets/dashboard.css", "/monitoring/", "/monitoring/api/queues", "/admin/v1/tenants", "/metrics"} {
		for _, auth := range []string{"", basic("wrong-token-0123456789"), "Bearer wrong-token-0123456789"} {
			if r := get(t, "GET", f.url+path, auth); r.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET %s with %q: %d, want 401", path, auth, r.StatusCode)
			}
		}
		for _, auth := range []string{basic(apptest.AdminToken), "Bearer " + apptest.AdminToken} {
			if r := get(t, "GET", f.url+path, auth); r.StatusCode != http.StatusOK {
				t.Errorf("GET %s as admin (%.6s…): %d, want 200", path, auth, r.StatusCode)
			}
		}
	}
	// Unknown admin paths say nothing without the token: 401, not 404.
	for _, path := range []string{"/admin/", "/admin/v1/nope"} {
		for _, auth := range []string{"", basic("wrong-token-0123456789"), "Bearer wrong-token-0123456789"} {
			if r := get(t, "GET", f.url+path, auth); r.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET %s with %q: %d, want 401", path, auth, r.StatusCode)
			}
		}
		if r := get(t, "GET", f.url+path, "Bearer "+apptest.AdminToken); r.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s as admin: %d, want 404", path, r.StatusCode)
		}
	}
	// Browsers are asked to log in.
	if r := get(t, "GET", f.url+"/dashboard", ""); !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), `Basic realm="llmq"`) {
		t.Errorf("WWW-Authenticate = %q", r.Header.Get("WWW-Authenticate"))
	}
	// The monitor is read-only by default (LLMQ_MONITORING_READONLY).
	q := f.a.Queue.Namespace().Queue(queue.Jobs)
	if r := get(t, "POST", f.url+"/monitoring/api/queues/"+q+":pause", basic(apptest.AdminToken)); r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST pause through the monitor: %d, want 405", r.StatusCode)
	}
}

// What a browser sends for another site's page, with the basic-auth
// password it remembers, is refused on every page the admin token opens; a
// link followed from elsewhere opens the dashboard, which no site may frame.
func TestAdminPagesRefuseCrossSiteRequests(t *testing.T) {
	t.Parallel()
	f := setup(t)
	do := func(method, path string, h http.Header) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, f.url+path, nil)
		req.Header = h
		req.Header.Set("Authorization", basic(apptest.AdminToken))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	script := http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"cors"}, "Sec-Fetch-Dest": {"empty"}}
	frame := http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"iframe"}}
	for _, path := range []string{"/dashboard", "/monitoring/", "/monitoring/api/queues", "/metrics"} {
		for name, h := range map[string]http.Header{"a script": script, "a frame": frame, "an Origin": {"Origin": {"https://evil.example"}}} {
			if r := do("GET", path, h.Clone()); r.StatusCode != http.StatusForbidden {
				t.Errorf("GET %s from %s of another site: %d, want 403", path, name, r.StatusCode)
			}
		}
	}
	link := http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"document"}}
	r := do("GET", "/dashboard", link)
	if r.StatusCode != http.StatusOK || r.Header.Get("X-Frame-Options") != "DENY" ||
		r.Header.Get("Content-Security-Policy") != "frame-ancestors 'none'" {
		t.Errorf("a link to /dashboard: %d, X-Frame-Options %q, CSP %q; want 200, DENY, frame-ancestors 'none'",
			r.StatusCode, r.Header.Get("X-Frame-Options"), r.Header.Get("Content-Security-Policy"))
	}
	if r := do("GET", "/dashboard", http.Header{"Sec-Fetch-Site": {"same-origin"}}); r.StatusCode != http.StatusOK {
		t.Errorf("same-origin: %d", r.StatusCode)
	}
}

// The dashboard shows each tier's API limits and who is exempt from them:
// exempt tiers, tenants and keys (by id and prefix, never the key).
func TestDashboardShowsAPILimitsAndExemptions(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: policy + `  - name: metered
    daily_budget_usd: 5
    api_limits: {second: 50, day: 200000}
    api_algorithm: token_bucket
    api_lease: 10
    api_endpoint_limits:
      files.create: {minute: 10}
    webhook_host_rps: 2
  - name: internal
    unlimited: true
    api_exempt: true
`})
	rec := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, NoProcessMetrics: true})
	srv := testutil.Must(a.API())
	closer, err := dashboard.MountApp(srv, a.App, rec, dashboard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)

	r := a.Do("POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": "billing-service", "tier": "metered", "api_exempt": true})
	exemptTenant := r.Map(t)["id"].(string)
	other, _ := a.Tenant("metered")
	k := a.Do("POST", "/admin/v1/tenants/"+other+"/keys", apptest.AdminToken, map[string]any{"api_exempt": true}).Map(t)
	keyID, plain, prefix := k["id"].(string), k["key"].(string), k["prefix"].(string)

	req, _ := http.NewRequest("GET", hs.URL+"/dashboard", nil)
	req.Header.Set("Authorization", basic(apptest.AdminToken))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(body)
	for _, want := range []string{
		`data-api-tier="metered"`, `<td class="limits">50/second, 200000/day</td><td>token_bucket</td><td>80%</td><td>slices of 10</td>`,
		`files.create 10/minute`, `2/s per host`, `<td class="limits">1000/second</td><td>sliding_window</td>`,
		`data-api-tier="internal"`, `exempt</span>`,
		`data-exempt-tenant="` + exemptTenant + `"`, `billing-service`,
		`data-exempt-key="` + keyID + `"`, prefix + `…`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the dashboard lacks %q", want)
		}
	}
	if strings.Contains(page, plain) || strings.Contains(page, "could not be read") {
		t.Fatal("the dashboard shows a key, or a section failed")
	}
}

// The jobs waiting in the fair queues show per tenant, priority and model,
// with how long the oldest has waited.
func TestDashboardShowsWaitingJobs(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: policy, NoScheduler: true})
	rec := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, NoProcessMetrics: true})
	srv := testutil.Must(a.API())
	closer, err := dashboard.MountApp(srv, a.App, rec, dashboard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	tenant, key := a.Tenant("standard")
	for range 3 {
		if r := a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("hi", "", 5)}); r.Status != 202 {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
	}
	req, _ := http.NewRequest("GET", hs.URL+"/dashboard", nil)
	req.Header.Set("Authorization", basic(apptest.AdminToken))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	row := `<tr data-waiting="` + tenant + `:default:gpt-4o-mini">`
	if !strings.Contains(string(body), row) || !strings.Contains(string(body), `<td class="num jobs">3</td>`) {
		t.Fatalf("the page lacks the waiting row %s with 3 jobs:\n%s", row, body)
	}
}
