package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/cmdline"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/testutil"
)

// Help, asked for in any of the usual ways, is printed on stdout and exits
// 0; `serve`'s lists every LLMQ_* variable the dispatcher reads with its
// default. Before, `dev -h`, `serve -h` and `healthcheck -h` exited 1.
func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args string
		want []string
	}{
		{"-h", []string{"usage: dispatcher", "serve", "dev", "healthcheck", "version"}},
		{"--help", []string{"usage: dispatcher"}},
		{"help", []string{"usage: dispatcher"}},
		{"serve -h", append([]string{"usage: dispatcher serve"}, envLines(config.RoleDispatcher)...)},
		{"serve --help", []string{"usage: dispatcher serve", "LLMQ_METRICS_ADDR (default 127.0.0.1:9464)"}},
		{"help serve", []string{"usage: dispatcher serve", "LLMQ_LISTEN_ADDR (default :8080)"}},
		{"dev -h", []string{"usage: dispatcher dev", "-addr", "LLMQ_LISTEN_ADDR, else 127.0.0.1:8080", "-dir", "-demo", "-provider-url"}},
		{"dev --help", []string{"usage: dispatcher dev"}},
		{"help dev", []string{"usage: dispatcher dev"}},
		{"healthcheck -h", []string{"usage: dispatcher healthcheck", "-worker", ":8081"}},
		{"help help", []string{"usage: dispatcher"}},
	} {
		t.Run(c.args, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := testutil.MainOutput(t, mainMarker, nil, strings.Fields(c.args)...)
			if code != 0 || stderr != "" {
				t.Fatalf("dispatcher %s: exit %d, stderr %q; want 0 and nothing", c.args, code, stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("dispatcher %s does not print %q:\n%s", c.args, w, stdout)
				}
			}
		})
	}
}

// envLines are the help lines of role's variables: name and default.
func envLines(role config.Role) []string {
	var out []string
	for _, v := range config.EnvVars(role) {
		l := v.Name
		if v.Default != "" {
			l += " (default " + v.Default + ")"
		}
		out = append(out, l)
	}
	return out
}

// Bad usage exits 2 with one line that says where help is, and starts
// nothing; --version prints the module's version and exits 0.
func TestBadUsageExitsTwo(t *testing.T) {
	t.Parallel()
	for _, args := range []string{"frobnicate", "serve now", "serve -port 1", "-x", "dev -nosuchflag", "dev extra",
		"dev -demo -1", "dev -concurrency 0", "dev -provider-url ftp://x", "healthcheck now", "healthcheck -verbose"} {
		t.Run(args, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := testutil.MainOutput(t, mainMarker, nil, strings.Fields(args)...)
			if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "dispatcher: ") || strings.Count(stderr, "\n") != 1 {
				t.Fatalf("dispatcher %s: exit %d, stdout %q, stderr %q; want 2 and one line on stderr", args, code, stdout, stderr)
			}
		})
	}
	for _, args := range []string{"--version", "-version", "version"} {
		stdout, stderr, code := testutil.MainOutput(t, mainMarker, nil, args)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "llmq dispatcher ") || !strings.Contains(stdout, "go1.") {
			t.Errorf("dispatcher %s: exit %d, %q %q; want the version line", args, code, stdout, stderr)
		}
	}
}

// A newcomer's first `dispatcher` with no environment is told the admin
// token is not set and that `dispatcher dev` needs none.
func TestNoAdminTokenPointsAtDev(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := testutil.MainOutput(t, mainMarker, bareEnviron())
	testutil.CheckOneLineFailure(t, "dispatcher", stdout, stderr, code, "LLMQ_ADMIN_TOKEN", "is not set", "dispatcher dev")
}

// With Redis unreachable the dispatcher says so in its one line: go-redis's
// own logger writes nothing to the terminal (before, four raw lines).
func TestRedisDownIsOneLine(t *testing.T) {
	t.Parallel()
	env := serveEnviron(t, nil, "LLMQ_REDIS_URL=redis://127.0.0.1:1/0")
	stdout, stderr, code := testutil.MainOutput(t, mainMarker, env)
	testutil.CheckOneLineFailure(t, "dispatcher", stdout, stderr, code, "LLMQ_REDIS_URL", "redis does not answer")
}

// `dispatcher serve` answers /metrics without credentials only on
// LLMQ_METRICS_ADDR; on the API's address it takes the admin token.
func TestServeMetricsListener(t *testing.T) {
	t.Parallel()
	a := startServe(t)
	for _, c := range []struct {
		url, auth string
		want      int
	}{
		{a.metrics + "/metrics", "", 200},
		{a.api + "/metrics", "", 401},
		{a.api + "/metrics", "Bearer " + adminToken, 200},
		{a.metrics + "/v1/jobs", "", 404},
		{a.metrics + "/dashboard", "", 404},
	} {
		if got := status(t, c.url, c.auth); got != c.want {
			t.Errorf("GET %s (auth %t): %d, want %d", c.url, c.auth != "", got, c.want)
		}
	}
}

// a running `dispatcher serve`.
type served struct{ api, metrics string }

// startServe runs `dispatcher serve` on ports the system picks and waits
// for its first line, which names both.
func startServe(t *testing.T) *served {
	t.Helper()
	environ := serveEnviron(t, nil, "LLMQ_DATABASE_URL="+testutil.Postgres(t)+"&pool_max_conns=2", "LLMQ_METRICS_ADDR=127.0.0.1:0",
		"LLMQ_KEY_PREFIX=d-"+testutil.RandomHex(3), "LLMQ_QUEUE_NAMESPACE=d-"+testutil.RandomHex(3), "SIM_API_KEY=test")
	if err := run(t.Context(), []string{"migrate", "up"}, environ, io.Discard, io.Discard); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stdout testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, environ, &stdout, io.Discard) }()
	var exited error
	stopped := false
	t.Cleanup(func() {
		cancel()
		if stopped {
			return
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop within 30s")
		}
	})
	var line string
	testutil.Eventually(t, 30*time.Second, func() bool {
		select {
		case exited = <-done:
			stopped = true
			return true
		default:
		}
		line = stdout.String()
		return strings.Contains(line, "/metrics)")
	})
	if stopped {
		t.Fatalf("serve exited: %v", exited)
	}
	m := servingLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("serve printed %q", line)
	}
	return &served{api: m[1], metrics: m[2]}
}

var servingLine = regexp.MustCompile(`^llmq dispatcher listening on (http://\S+) \(metrics on (http://\S+)/metrics\)`)

const adminToken = apptest.AdminToken

// status is the status of GET url with an Authorization header auth.
func status(t *testing.T, url, auth string) int {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
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
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// serve refuses a schema that is not its own; migrate up, down and status
// change and show it.
func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	environ := serveEnviron(t, nil, "LLMQ_DATABASE_URL="+testutil.Postgres(t)+"&pool_max_conns=2", "LLMQ_METRICS_ADDR=127.0.0.1:0")
	migrate := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append([]string{"migrate"}, args...), environ, &out, io.Discard)
		return out.String(), err
	}
	if err := run(ctx, []string{"serve"}, environ, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "run `dispatcher migrate up` first") {
		t.Fatalf("serve on an empty schema = %v", err)
	}
	if out, err := migrate("status"); err != nil || !strings.Contains(out, "001") || !strings.Contains(out, "pending") ||
		!strings.Contains(out, "the schema is at version 0") {
		t.Fatalf("status before: %v\n%s", err, out)
	}
	out, err := migrate("up")
	if err != nil || !strings.HasPrefix(out, "applied 001, 002") {
		t.Fatalf("up: %v\n%s", err, out)
	}
	if out, err := migrate("up"); err != nil || !strings.HasPrefix(out, "the schema is up to date") {
		t.Fatalf("up again: %v\n%s", err, out)
	}
	if out, err := migrate("down"); err != nil || !strings.HasPrefix(out, "reverted 0") {
		t.Fatalf("down: %v\n%s", err, out)
	}
	if out, err := migrate("status"); err != nil || !strings.Contains(out, "pending") || !strings.Contains(out, "dispatcher migrate up applies the rest") {
		t.Fatalf("status after down: %v\n%s", err, out)
	}
	for _, args := range [][]string{nil, {"sideways"}, {"up", "down"}} {
		if _, err := migrate(args...); cmdline.ExitCode(err) != 2 {
			t.Errorf("migrate %q = %v, want a usage error", args, err)
		}
	}
}
