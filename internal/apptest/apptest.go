// Package apptest builds a whole llmq for tests: the app over a Postgres
// schema and a Redis database of the test's own, the HTTP API on a loopback
// server, the simulated provider, and optionally in-process workers. Tests of
// the API, the worker and the integration suite share it, so each test
// writes only what it checks.
package apptest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

// AdminToken is the admin token of every test app.
const AdminToken = "test-admin-token-0123456789"

// PolicyYAML is a policy with one simulated provider (its base_url is
// filled in), a chat and an embedding model, and tiers free (reject, low),
// standard (defer, default) and premium (critical), plus internal
// (unlimited, exempt from the API limit).
const PolicyYAML = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 10s
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 3000, tpm: 300000}
    max_output_tokens: 1024
  - name: text-embedding-3-small
    provider: sim
    price: {input_per_mtok: 0.02}
    limits: {rpm: 3000, tpm: 1000000}
tiers:
  - name: free
    daily_budget_usd: 1
    priority: low
    on_exhausted: reject
    api_rps: 5
  - name: standard
    daily_budget_usd: 50
    priority: default
    on_exhausted: defer
    api_rps: 1000
  - name: premium
    daily_budget_usd: 500
    priority: critical
    on_exhausted: defer
    api_rps: 1000
  - name: internal
    unlimited: true
    priority: critical
    api_exempt: true
`

// Options configure a test app.
type Options struct {
	// RedisDB is the package's Redis database (docs/ARCHITECTURE.md).
	RedisDB int
	// RedisURL, when set, replaces the shared server (e.g. a private
	// testutil.StartRedis server a test may flush or restart).
	RedisURL string
	// Policy is the policy YAML; "{{SIM}}" is replaced by the simulator's
	// base URL. Defaults to PolicyYAML.
	Policy string
	// Sim configures the simulated provider. Defaults to 3,000 RPM, 300,000
	// TPM and a default max_tokens of 1,024 (the policy's max_output_tokens),
	// answering with Echo.
	Sim *sim.Config
	// Workers starts this many in-process workers. Defaults to none.
	Workers int
	// NoScheduler leaves the jobs the API queues in their fair queue: no
	// scheduler releases them into asynq's queues. Defaults to false: one
	// runs, as in every dispatcher and worker.
	NoScheduler bool
	// WorkerOptions configure the workers' handlers.
	WorkerOptions worker.Options
	// Env changes the environment before validation.
	Env func(*config.Env)
	// Clock replaces Redis time for budget days and the workers' clock.
	// Defaults to none.
	Clock func() time.Time
	// Logs receives the app's log records, at the levels it enables.
	// Defaults to warnings and errors in the test log.
	Logs slog.Handler
	// Environ adds variables to the app's environment, such as the key of a
	// provider the policy names. Defaults to none.
	Environ []string
	// Offload tunes the offloader. Defaults to its defaults.
	Offload offload.Options
}

// App is a running test llmq.
type App struct {
	*app.App
	URL string
	Sim *sim.TestServer
	// Environ is the LLMQ_* environment of the app, for starting worker or
	// dispatcher processes against the same services.
	Environ []string
	t       testing.TB
}

// AppRedisURL is the Redis of a test app of a package whose database is db:
// TEST_APP_REDIS_URL when it is set (a redis+cluster:// or redis+sentinel://
// URL: the end-to-end suite's main cases run again on a cluster with it;
// each app's key prefix and queue namespace keep tests apart), else that
// database of the test Redis.
func AppRedisURL(t testing.TB, db int) string {
	if u := os.Getenv("TEST_APP_REDIS_URL"); u != "" {
		return u
	}
	return testutil.RedisURLForDB(t, db)
}

// Start builds and starts a test app; everything stops when the test ends.
func Start(t testing.TB, o Options) *App {
	t.Helper()
	simCfg := sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Echo: true}
	if o.Sim != nil {
		simCfg = *o.Sim
	}
	ss := sim.Start(simCfg)
	t.Cleanup(ss.Close)

	policy := o.Policy
	if policy == "" {
		policy = PolicyYAML
	}
	policy = strings.ReplaceAll(policy, "{{SIM}}", ss.BaseURL)
	dir := t.TempDir()
	policyPath := dir + "/policy.yaml"
	if err := os.WriteFile(policyPath, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	name := strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	ns := "t-" + name + "-" + testutil.RandomHex(3)
	redisURL := o.RedisURL
	if redisURL == "" {
		redisURL = AppRedisURL(t, o.RedisDB)
	}
	environ := []string{
		"LLMQ_REDIS_URL=" + redisURL,
		// Many tests, and the worker processes some of them start, each
		// open a pool: keep them small so a parallel run stays well inside
		// Postgres's default 100 connections.
		"LLMQ_DATABASE_URL=" + testutil.Postgres(t) + "&pool_max_conns=6",
		"LLMQ_POLICY=" + policyPath,
		"LLMQ_ADMIN_TOKEN=" + AdminToken,
		"LLMQ_KEY_PREFIX=" + ns,
		"LLMQ_QUEUE_NAMESPACE=" + ns,
		"LLMQ_LISTEN_ADDR=127.0.0.1:0",
		"LLMQ_METRICS_ADDR=127.0.0.1:0", // processes started from Environ run side by side
		"LLMQ_LOG_LEVEL=warn",
		"LLMQ_SHUTDOWN_TIMEOUT=5s",
		"SIM_API_KEY=test",
	}
	environ = append(environ, o.Environ...)
	env, err := config.LoadEnv(environ)
	if err != nil {
		t.Fatal(err)
	}
	if o.Env != nil {
		o.Env(env)
	}
	if err := env.Validate(config.RoleDispatcher); err != nil {
		t.Fatal(err)
	}
	logs := o.Logs
	if logs == nil {
		logs = slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	logger := slog.New(logs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, err := config.NewPolicyHolder(policyPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Open(ctx, env, logger, app.Parts{Policy: holder, LookupEnv: app.LookupIn(environ), Clock: o.Clock, Migrate: true,
		Offload: o.Offload})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	apiSrv, err := a.API()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(apiSrv)
	t.Cleanup(srv.Close)
	ta := &App{App: a, URL: srv.URL, Sim: ss, Environ: environ, t: t}
	if !o.NoScheduler {
		sctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.Scheduler().Run(sctx); close(done) }()
		t.Cleanup(func() { stop(); <-done })
	}
	for i := 0; i < o.Workers; i++ {
		ta.StartWorker(o.WorkerOptions)
	}
	t.Cleanup(func() { ta.cleanQueues() })
	return ta
}

// StartWorker starts one more in-process worker.
func (a *App) StartWorker(opts worker.Options) *worker.Server {
	srv, mux, err := a.WorkerServer(opts)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := srv.Start(mux); err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(srv.Shutdown)
	return srv
}

// JobHandler is the app's handler of job tasks, failing the test on an
// option that is invalid.
func (a *App) JobHandler(opts worker.Options) *worker.Handler {
	h, err := a.App.JobHandler(opts)
	if err != nil {
		a.t.Fatal(err)
	}
	return h
}

// cleanQueues deletes the test's queues so the shared Redis DB stays small.
func (a *App) cleanQueues() {
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	for _, q := range a.Queue.Namespace().Queues() {
		_ = in.DeleteQueue(q, true)
	}
}

// Response is an HTTP answer read whole.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v, failing the test when it is not JSON.
func (r *Response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("response (%d) is not JSON: %v\n%s", r.Status, err, r.Body)
	}
}

// Map decodes the body as a JSON object.
func (r *Response) Map(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	r.JSON(t, &m)
	return m
}

// Do sends a request with bearer token (may be empty) and body (a string or
// []byte is sent as it is; anything else as JSON; nil sends none), typed
// application/json.
func (a *App) Do(method, path, token string, body any) *Response {
	a.t.Helper()
	return Do(a.t, a.URL, method, path, token, body, nil)
}

// Do sends one request to base.
func Do(t testing.TB, base, method, path, token string, body any, header http.Header) *Response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json") // header may say otherwise
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: data}
}

// Tenant creates a tenant of tier with one key, and returns both.
func (a *App) Tenant(tier string) (tenantID, key string) {
	a.t.Helper()
	r := a.Do("POST", "/admin/v1/tenants", AdminToken, map[string]any{"name": "tenant-" + testutil.RandomHex(3), "tier": tier})
	if r.Status != http.StatusCreated {
		a.t.Fatalf("create tenant: %d %s", r.Status, r.Body)
	}
	tenantID = r.Map(a.t)["id"].(string)
	r = a.Do("POST", "/admin/v1/tenants/"+tenantID+"/keys", AdminToken, nil)
	if r.Status != http.StatusCreated {
		a.t.Fatalf("create key: %d %s", r.Status, r.Body)
	}
	return tenantID, r.Map(a.t)["key"].(string)
}

// ChatBody is a small chat request for model gpt-4o-mini; user is echoed
// by the simulator when it runs with Echo.
func ChatBody(content, user string, maxTokens int) map[string]any {
	b := map[string]any{
		"model":      "gpt-4o-mini",
		"messages":   []map[string]any{{"role": "user", "content": content}},
		"max_tokens": maxTokens,
	}
	if user != "" {
		b["user"] = user
	}
	return b
}

// testWriter sends log lines to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Placement says where job id is: "waiting" or "released" in its model's
// fair queue, else its asynq task's state ("pending", "scheduled",
// "active", "retry", "archived", "missing"...).
func (a *App) Placement(id string) string {
	a.t.Helper()
	ctx := context.Background()
	j, err := a.Store.JobGetByID(ctx, id)
	if err != nil {
		a.t.Fatalf("job %s: %v", id, err)
	}
	if m, ok := a.Policy.Current().Model(j.Model); ok {
		p, err := a.Queue.Placement(ctx, m.Queue(), id)
		if err != nil {
			a.t.Fatal(err)
		}
		if p != "" {
			return p
		}
	}
	st, err := a.Inspector.JobTaskState(ctx, id)
	if err != nil {
		a.t.Fatal(err)
	}
	return string(st)
}

// TaskCount is the number of jobs and deliveries enqueued: tasks, in any
// state, in the app's queues, and jobs waiting in a fair queue, each once.
func (a *App) TaskCount() int {
	a.t.Helper()
	ctx := context.Background()
	ids := map[string]bool{}
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	for _, q := range a.Queue.Namespace().Queues() {
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
			in.ListPendingTasks, in.ListActiveTasks, in.ListScheduledTasks, in.ListRetryTasks, in.ListArchivedTasks,
		} {
			for page := 1; ; page++ {
				tasks, err := list(q, asynq.Page(page), asynq.PageSize(1000))
				if errors.Is(err, asynq.ErrQueueNotFound) {
					break
				}
				if err != nil {
					a.t.Fatal(err)
				}
				for _, t := range tasks {
					ids[t.ID] = true
				}
				if len(tasks) < 1000 {
					break
				}
			}
		}
	}
	for i := range a.Policy.Current().Models {
		members, err := a.Redis.SMembers(ctx, a.Keys.FairMembers(a.Policy.Current().Models[i].Queue())).Result()
		if err != nil {
			a.t.Fatal(err)
		}
		for _, id := range members {
			ids[id] = true
		}
	}
	return len(ids)
}

// Account is the budget account of tenant id under the policy in force.
func (a *App) Account(tenantID string) budget.Account {
	a.t.Helper()
	tn, err := a.Store.TenantGetByID(context.Background(), tenantID)
	if err != nil {
		a.t.Fatal(err)
	}
	acct, _, err := admission.Account(a.Policy.Current(), tn)
	if err != nil {
		a.t.Fatal(err)
	}
	return acct
}

// EndedJob is job id once it has ended. A synchronous call's answer is
// written before its job is settled and stored, so a test reading the job
// right after the answer waits here for it.
func (a *App) EndedJob(id string) *store.Job {
	a.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		job, err := a.Store.JobGetByID(context.Background(), id)
		if err != nil {
			a.t.Fatal(err)
		}
		if job.Status.Terminal() {
			return job
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("job %s is still %s", id, job.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
