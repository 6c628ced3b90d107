package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) {
	// A child of testutil.MainOutput is the worker program.
	testutil.RunMainIfChild(mainMarker, "worker", main)
	testutil.VerifyNoLeaks(m)
}

var metricsAt = regexp.MustCompile(`metrics on (http://\S+/metrics)`)

// redisDB is the Redis database of cmd/worker's tests (docs/ARCHITECTURE.md).
const redisDB = 6

// mainMarker in a child's environment makes the test binary run main.
const mainMarker = "WORKER_TEST_RUN_MAIN"

// policy writes a policy file: the test apps' policy with edit applied,
// its provider unreachable (no test here calls it).
func policy(t *testing.T, edit func(string) string) string {
	t.Helper()
	p := strings.ReplaceAll(apptest.PolicyYAML, "{{SIM}}", "http://127.0.0.1:1/v1")
	if edit != nil {
		p = edit(p)
	}
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	if err := os.WriteFile(path, []byte(p), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// environ is a worker environment on the tests' Redis and a Postgres schema
// of the test's own, with the provider's key set; extra overrides it.
func environ(t *testing.T, policyPath string, extra ...string) []string {
	t.Helper()
	ns := "worker-" + testutil.RandomHex(4)
	env := []string{
		"LLMQ_REDIS_URL=" + testutil.RedisURLForDB(t, redisDB),
		"LLMQ_DATABASE_URL=" + migrated(t, testutil.Postgres(t)+"&pool_max_conns=2"),
		"LLMQ_POLICY=" + policyPath,
		"LLMQ_KEY_PREFIX=" + ns,
		"LLMQ_QUEUE_NAMESPACE=" + ns,
		"LLMQ_LISTEN_ADDR=127.0.0.1:0",
		"LLMQ_METRICS_ADDR=127.0.0.1:0",
		"LLMQ_SHUTDOWN_TIMEOUT=2s",
		"SIM_API_KEY=test",
	}
	return override(env, extra...)
}

// migrated applies the migrations to the database at url, as `dispatcher
// migrate up` does before workers start, and returns url.
func migrated(t *testing.T, url string) string {
	t.Helper()
	db, err := store.OpenMigrated(t.Context(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	return url
}

// A worker never migrates: on a schema that is not its own it stops with a
// line saying what to run, and its check wrote nothing (not even goose's
// version table).
func TestRefusesASchemaNotItsOwn(t *testing.T) {
	t.Parallel()
	empty := testutil.Postgres(t)
	env := override(environ(t, policy(t, nil)), "LLMQ_DATABASE_URL="+empty+"&pool_max_conns=2")
	err := run(t.Context(), nil, env, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "run `dispatcher migrate up` first") {
		t.Fatalf("worker on an empty schema = %v", err)
	}
	conn, err := pgx.Connect(t.Context(), empty)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables []string
	if err := conn.QueryRow(t.Context(), `SELECT COALESCE(array_agg(tablename::text), '{}') FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if len(tables) != 0 {
		t.Fatalf("the worker's check of an empty schema created %v", tables)
	}
}

// override sets or, given "NAME" without "=", removes variables of env.
func override(env []string, extra ...string) []string {
	out := env
	for _, kv := range extra {
		name, _, _ := strings.Cut(kv, "=")
		kept := out[:0:0]
		for _, old := range out {
			if n, _, _ := strings.Cut(old, "="); n != name {
				kept = append(kept, old)
			}
		}
		out = kept
		if strings.Contains(kv, "=") {
			out = append(out, kv)
		}
	}
	return out
}

type badConfig struct {
	name   string
	extra  []string            // environment changes
	policy func(string) string // policy file changes
	want   []string            // what the error must name
}

var badConfigs = []badConfig{
	{name: "not a number", extra: []string{"LLMQ_WORKER_CONCURRENCY=lots"},
		want: []string{"LLMQ_WORKER_CONCURRENCY", "whole number", `"lots"`}},
	{name: "zero concurrency", extra: []string{"LLMQ_WORKER_CONCURRENCY=0"},
		want: []string{"LLMQ_WORKER_CONCURRENCY", "at least 1"}},
	{name: "not a duration", extra: []string{"LLMQ_SHUTDOWN_TIMEOUT=soon"},
		want: []string{"LLMQ_SHUTDOWN_TIMEOUT", "duration"}},
	{name: "wrong scheme", extra: []string{"LLMQ_REDIS_URL=http://127.0.0.1:6379"},
		want: []string{"LLMQ_REDIS_URL", "scheme"}},
	{name: "invalid policy field",
		policy: func(p string) string { return strings.Replace(p, "on_exhausted: reject", "on_exhausted: later", 1) },
		want:   []string{"tiers[0].on_exhausted", `"later"`, "llmq.yaml:"}},
	{name: "unknown policy field",
		policy: func(p string) string {
			return strings.Replace(p, "limits: {rpm: 3000, tpm: 300000}", "limits: {rpn: 3000, tpm: 300000}", 1)
		},
		want: []string{"models[0].limits.rpn"}},
	{name: "no policy file", extra: []string{"LLMQ_POLICY=/nonexistent/llmq.yaml"},
		want: []string{"/nonexistent/llmq.yaml", "cannot read", "LLMQ_POLICY", "llmq.example.yaml"}},
	{name: "redis down", extra: []string{"LLMQ_REDIS_URL=redis://127.0.0.1:1/0"},
		want: []string{"LLMQ_REDIS_URL", "redis does not answer"}},
	{name: "missing provider key", extra: []string{"SIM_API_KEY"},
		want: []string{"providers[0].api_key_env", "SIM_API_KEY", "not set"}},
	{name: "empty provider key", extra: []string{"SIM_API_KEY="},
		want: []string{"providers[0].api_key_env", "SIM_API_KEY", "not set"}},
}

// Bad configuration stops the worker before it takes any job, with one line
// that names the variable or the policy field and why.
func TestRunRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, c := range badConfigs {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := environ(t, policy(t, c.policy), c.extra...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stdout, stderr testutil.SyncBuffer
			err := run(ctx, nil, env, &stdout, &stderr)
			testutil.CheckOneLineError(t, err, c.want...)
			if strings.Contains(stdout.String(), "worker running") {
				t.Errorf("the worker started: %s", stdout.String())
			}
		})
	}
}

// Help exits 0 and lists every LLMQ_* variable the worker reads, with its
// default; bad usage exits 2 with one line; --version prints the module's
// version. Before, `worker -h` exited 1 ("unexpected arguments").
func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, args := range []string{"-h", "--help", "help", "-help"} {
		stdout, stderr, code := testutil.MainOutput(t, mainMarker, nil, args)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: worker") {
			t.Fatalf("worker %s: exit %d, stderr %q, stdout %q", args, code, stderr, stdout)
		}
		for _, v := range config.EnvVars(config.RoleWorker) {
			want := v.Name
			if v.Default != "" {
				want += " (default " + v.Default + ")"
			}
			if !strings.Contains(stdout, want) {
				t.Errorf("worker %s does not list %q", args, want)
			}
		}
		if !strings.Contains(stdout, "LLMQ_LISTEN_ADDR (default :8081)") || strings.Contains(stdout, "LLMQ_ADMIN_TOKEN") {
			t.Errorf("worker %s: the worker's own defaults, and only its variables:\n%s", args, stdout)
		}
	}
	for _, args := range []string{"serve", "-concurrency 5", "--nosuchflag"} {
		stdout, stderr, code := testutil.MainOutput(t, mainMarker, nil, strings.Fields(args)...)
		if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "worker: ") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("worker %s: exit %d, stdout %q, stderr %q; want 2 and one line", args, code, stdout, stderr)
		}
	}
	stdout, stderr, code := testutil.MainOutput(t, mainMarker, nil, "--version")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "llmq worker ") {
		t.Errorf("worker --version: exit %d, %q %q", code, stdout, stderr)
	}
}

// What a user sees from the program: exit status 1 and exactly one line,
// "worker: " and the reason, whatever is wrong.
func TestMainPrintsOneLine(t *testing.T) {
	t.Parallel()
	for _, c := range badConfigs {
		switch c.name {
		case "not a number", "invalid policy field", "missing provider key", "no policy file",
			"redis down": // go-redis's own logger must not write to the terminal
		default:
			continue // one of each kind is enough for the program
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := testutil.MainOutput(t, mainMarker, environ(t, policy(t, c.policy), c.extra...))
			testutil.CheckOneLineFailure(t, "worker", stdout, stderr, code, c.want...)
		})
	}
}

// A running worker answers /healthz, and /readyz with 200 while Redis
// answers and 503 while it does not, and /metrics on LLMQ_METRICS_ADDR
// only; cancelling it shuts it down cleanly.
func TestRunServesHealthAndReadiness(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	port := testutil.FreePort(t)
	env := environ(t, policy(t, nil),
		"LLMQ_REDIS_URL=redis://"+srv.Addr+"/0", fmt.Sprintf("LLMQ_LISTEN_ADDR=127.0.0.1:%d", port))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, env, &stdout, &stderr) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stdout.String(), "worker running") {
		select {
		case err := <-done:
			t.Fatalf("worker exited: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker did not start within 30s:\n%s", stderr.String())
		}
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	status := func(path string) int {
		t.Helper()
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if h, r := status("/healthz"), status("/readyz"); h != 200 || r != 200 {
		t.Fatalf("Redis up: healthz %d, readyz %d; want 200, 200", h, r)
	}
	m := metricsAt.FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("the worker does not say where its metrics are: %s", stdout.String())
	}
	if resp, err := client.Get(m[1]); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %v %v", m[1], resp, err)
	} else {
		resp.Body.Close()
	}
	if s := status("/metrics"); s != 404 {
		t.Fatalf("/metrics on the health address: %d, want 404", s)
	}
	srv.Stop()
	if h, r := status("/healthz"), status("/readyz"); h != 200 || r != 503 {
		t.Fatalf("Redis down: healthz %d, readyz %d; want 200, 503", h, r)
	}
	srv.Start()
	// Ready again once the client reconnects (its dial backoff may hold a
	// moment after the server is back).
	r := status("/readyz")
	for deadline := time.Now().Add(10 * time.Second); r != 200 && time.Now().Before(deadline); r = status("/readyz") {
		time.Sleep(100 * time.Millisecond)
	}
	if r != 200 {
		t.Fatalf("Redis back: readyz %d, want 200", r)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not stop within 30s")
	}
}
