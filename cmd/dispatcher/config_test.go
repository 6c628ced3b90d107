package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/testutil"
)

// mainMarker in a child's environment makes the test binary run main.
const mainMarker = "DISPATCHER_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	// A child of testutil.MainOutput is the dispatcher program.
	testutil.RunMainIfChild(mainMarker, "dispatcher", main)
	os.Exit(m.Run())
}

// serveEnviron is a dispatcher environment whose policy file is the test
// apps' with edit applied; extra replaces variables. Its database is never
// reached: every configuration here is refused before.
func serveEnviron(t *testing.T, edit func(string) string, extra ...string) []string {
	t.Helper()
	p := strings.ReplaceAll(apptest.PolicyYAML, "{{SIM}}", "http://127.0.0.1:1/v1")
	if edit != nil {
		p = edit(p)
	}
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	if err := os.WriteFile(path, []byte(p), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"LLMQ_REDIS_URL":    testutil.RedisURLForDB(t, 6),
		"LLMQ_DATABASE_URL": "postgres://llmq@127.0.0.1:1/llmq?sslmode=disable",
		"LLMQ_POLICY":       path,
		"LLMQ_ADMIN_TOKEN":  apptest.AdminToken,
		"LLMQ_LISTEN_ADDR":  "127.0.0.1:0",
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

type badConfig struct {
	name   string
	extra  []string
	policy func(string) string
	want   []string
}

var badConfigs = []badConfig{
	{name: "short admin token", extra: []string{"LLMQ_ADMIN_TOKEN=short"},
		want: []string{"LLMQ_ADMIN_TOKEN", "16"}},
	{name: "not a number", extra: []string{"LLMQ_MAX_BODY_BYTES=1MB"},
		want: []string{"LLMQ_MAX_BODY_BYTES", "whole number", `"1MB"`}},
	{name: "not a boolean", extra: []string{"LLMQ_MONITORING_READONLY=maybe"},
		want: []string{"LLMQ_MONITORING_READONLY", "true or false"}},
	{name: "bad listen address", extra: []string{"LLMQ_LISTEN_ADDR=8080"},
		want: []string{"LLMQ_LISTEN_ADDR"}},
	{name: "wrong database scheme", extra: []string{"LLMQ_DATABASE_URL=mysql://db/llmq"},
		want: []string{"LLMQ_DATABASE_URL"}},
	{name: "invalid policy field",
		policy: func(p string) string { return strings.Replace(p, "daily_budget_usd: 50", "daily_budget_usd: -50", 1) },
		want:   []string{"tiers[1].daily_budget_usd", "llmq.yaml:"}},
	{name: "no policy file", extra: []string{"LLMQ_POLICY=/nonexistent/llmq.yaml"},
		want: []string{"/nonexistent/llmq.yaml"}},
}

// Bad configuration stops `dispatcher serve` before it listens, with one
// line that names the variable or the policy field and why.
func TestServeRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, c := range badConfigs {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stdout testutil.SyncBuffer
			err := run(ctx, []string{"serve"}, serveEnviron(t, c.policy, c.extra...), &stdout, io.Discard)
			testutil.CheckOneLineError(t, err, c.want...)
			if strings.Contains(stdout.String(), "listening") {
				t.Errorf("the dispatcher started: %s", stdout.String())
			}
		})
	}
}

// What a user sees from the program: exit status 1 and exactly one line,
// "dispatcher: " and the reason.
func TestMainPrintsOneLineOnBadConfig(t *testing.T) {
	t.Parallel()
	for _, c := range badConfigs {
		switch c.name {
		case "short admin token", "invalid policy field":
		default:
			continue // one of each kind is enough for the program
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := testutil.MainOutput(t, mainMarker, serveEnviron(t, c.policy, c.extra...))
			testutil.CheckOneLineFailure(t, "dispatcher", stdout, stderr, code, c.want...)
		})
	}
}

// `dispatcher healthcheck` succeeds only while /readyz on LLMQ_LISTEN_ADDR
// answers 200, probing loopback when the address has no host, and the
// program's exit status says so (the container healthcheck reads it).
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	ready.Store(true)
	var paths atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.Method + " " + r.URL.Path)
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	check := func(addr string) error {
		return run(context.Background(), []string{"healthcheck"}, []string{"LLMQ_LISTEN_ADDR=" + addr}, io.Discard, io.Discard)
	}

	for _, addr := range []string{"127.0.0.1:" + port, ":" + port, "0.0.0.0:" + port} {
		if err := check(addr); err != nil {
			t.Errorf("ready, LLMQ_LISTEN_ADDR=%s: %v", addr, err)
		}
	}
	if got := paths.Load(); got != "GET /readyz" {
		t.Errorf("probed %v, want GET /readyz", got)
	}
	if _, _, code := testutil.MainOutput(t, mainMarker, []string{"LLMQ_LISTEN_ADDR=:" + port}, "healthcheck"); code != 0 {
		t.Errorf("ready: exit code %d, want 0", code)
	}

	ready.Store(false)
	if err := check(":" + port); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("not ready: %v, want an error naming 503", err)
	}
	if _, stderr, code := testutil.MainOutput(t, mainMarker, []string{"LLMQ_LISTEN_ADDR=:" + port}, "healthcheck"); code != 1 || strings.Count(stderr, "\n") != 1 {
		t.Errorf("not ready: exit code %d, stderr %q; want 1 and one line", code, stderr)
	}

	srv.Close()
	if err := check(":" + port); err == nil {
		t.Error("nothing listening: healthcheck succeeded")
	}
	if err := check("nonsense"); err == nil || !strings.Contains(err.Error(), "LLMQ_LISTEN_ADDR") {
		t.Errorf("bad address: %v, want an error naming LLMQ_LISTEN_ADDR", err)
	}
	if err := run(context.Background(), []string{"healthcheck", "now"}, nil, io.Discard, io.Discard); err == nil {
		t.Error("healthcheck accepted an argument")
	}
}

func TestReadyzURL(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		":8080":          "http://127.0.0.1:8080/readyz",
		"0.0.0.0:9100":   "http://127.0.0.1:9100/readyz",
		"[::]:8080":      "http://[::1]:8080/readyz",
		"10.0.0.5:8080":  "http://10.0.0.5:8080/readyz",
		"localhost:8080": "http://localhost:8080/readyz",
	} {
		if got, err := readyzURL(addr); err != nil || got != want {
			t.Errorf("readyzURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	if _, err := readyzURL("8080"); err == nil {
		t.Error(`readyzURL("8080") succeeded`)
	}
}
