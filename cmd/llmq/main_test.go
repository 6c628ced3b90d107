package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/testutil"
)

// redisDB is the Redis database of the command's tests (docs/ARCHITECTURE.md).
const redisDB = 13

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// env is a test llmq and the environment that points llmq at it.
type env struct {
	app      *apptest.App
	environ  []string
	tenantID string
	key      string
}

func setup(t *testing.T, workers int) *env {
	t.Helper()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Workers: workers})
	tenantID, key := a.Tenant("standard")
	return &env{app: a, tenantID: tenantID, key: key, environ: []string{
		"LLMQ_URL=" + a.URL, "LLMQ_API_KEY=" + key, "LLMQ_ADMIN_TOKEN=" + apptest.AdminToken, "HOME=/nonexistent",
	}}
}

// result is what one run of the command printed and returned.
type result struct {
	stdout, stderr string
	err            error
}

func (r result) code() int {
	if r.err == nil {
		return 0
	}
	return exitCode(r.err)
}

func (r result) String() string {
	msg := ""
	if r.err != nil {
		msg = message(r.err)
	}
	return fmt.Sprintf("exit %d %s\nstdout:\n%s\nstderr:\n%s", r.code(), msg, r.stdout, r.stderr)
}

func (e *env) run(t *testing.T, args ...string) result {
	t.Helper()
	return runWith(t, e.environ, "", args...)
}

func runWith(t *testing.T, environ []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, args, environ, strings.NewReader(stdin), &out, &errOut)
	return result{out.String(), errOut.String(), err}
}

// ok runs args and fails the test unless the command succeeds.
func (e *env) ok(t *testing.T, args ...string) result {
	t.Helper()
	r := e.run(t, args...)
	if r.err != nil {
		t.Fatalf("llmq %s: %v", strings.Join(args, " "), r)
	}
	return r
}

func (e *env) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(e.app.URL, e.key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func decode[T any](t *testing.T, s string) *T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return &v
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args    []string
		environ []string
		code    int
		want    string
	}{
		{nil, nil, exitUsage, "no command given"},
		{[]string{"frobnicate"}, nil, exitUsage, `unknown command "frobnicate"`},
		{[]string{"jobs", "get"}, []string{"LLMQ_API_KEY=k"}, exitUsage, "jobs get takes ID"},
		{[]string{"jobs", "get", "a", "b"}, []string{"LLMQ_API_KEY=k"}, exitUsage, "jobs get takes ID"},
		{[]string{"jobs", "list", "--colour"}, nil, exitUsage, "flag provided but not defined: -colour"},
		{[]string{"usage"}, nil, exitUsage, "no API key: set LLMQ_API_KEY or pass --api-key"},
		{[]string{"admin", "tenants", "list"}, []string{"LLMQ_API_KEY=k"}, exitUsage, "no admin token"},
		{[]string{"usage", "--url", "localhost:1"}, []string{"LLMQ_API_KEY=k"}, exitUsage, "not an http(s) URL"},
		{[]string{"submit", "x.jsonl", "--concurrency", "0"}, nil, exitUsage, "--concurrency"},
		{[]string{"submit", "x.jsonl", "--out", "/no/such/dir/out.jsonl"}, nil, exitUsage, "no directory /no/such/dir"},
		{[]string{"admin", "tenants", "update", "ten_1"}, []string{"LLMQ_ADMIN_TOKEN=t"}, exitUsage, "needs --name, --tier"},
		{[]string{"admin", "tenants", "create", "--name", "a", "--tier", "standard", "--budget", "-3"}, []string{"LLMQ_ADMIN_TOKEN=t"}, exitUsage, "positive number"},
	}
	for _, tc := range cases {
		r := runWith(t, tc.environ, "", tc.args...)
		if r.code() != tc.code || !strings.Contains(message(r.err), tc.want) {
			t.Errorf("llmq %q: %v\nwant exit %d and %q", tc.args, r, tc.code, tc.want)
		}
	}
	r := runWith(t, nil, "", "help")
	if r.err != nil || !strings.Contains(r.stdout, "llmq submit") && !strings.Contains(r.stdout, "submit FILE") {
		t.Fatalf("help: %v", r)
	}
	if r := runWith(t, nil, "", "jobs", "list", "-h"); r.err != nil || !strings.Contains(r.stdout, "usage: llmq") {
		t.Fatalf("-h: %v", r)
	}
}

// A list that fails (a wrong key) prints nothing on stdout: before, the
// table's header came first, then the error.
func TestFailedListPrintsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	for _, args := range [][]string{{"jobs", "list"}, {"batches"}, {"files", "list"}, {"jobs", "list", "--all"}} {
		r := runWith(t, []string{"LLMQ_URL=" + e.app.URL, "LLMQ_API_KEY=llmq_wrong"}, "", args...)
		if r.code() != exitFailed || r.stdout != "" || !strings.Contains(message(r.err), "401") {
			t.Errorf("llmq %s with a wrong key: %v; want exit 1 and nothing on stdout", strings.Join(args, " "), r)
		}
	}
	r := runWith(t, []string{"LLMQ_URL=" + e.app.URL, "LLMQ_ADMIN_TOKEN=wrong-admin-token-0123"}, "", "admin", "tenants", "list")
	if r.code() != exitFailed || r.stdout != "" {
		t.Errorf("admin tenants list with a wrong token: %v", r)
	}
	// An empty list is still a table, with its header.
	if r := e.ok(t, "jobs", "list"); !strings.HasPrefix(r.stdout, "ID ") {
		t.Errorf("empty list: %q", r.stdout)
	}
}

func TestServerErrors(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	// A wrong key: the server's message, and which setting to check.
	r := runWith(t, []string{"LLMQ_URL=" + e.app.URL, "LLMQ_API_KEY=llmq_wrong"}, "", "usage")
	if r.code() != exitFailed || !strings.Contains(message(r.err), "401 Incorrect or missing API key") || !strings.Contains(message(r.err), "LLMQ_API_KEY") {
		t.Fatalf("wrong key: %v", r)
	}
	// Flags override the environment.
	if r := runWith(t, []string{"LLMQ_URL=http://127.0.0.1:1", "LLMQ_API_KEY=llmq_wrong"}, "", "usage", "--url", e.app.URL, "--api-key", e.key); r.err != nil {
		t.Fatalf("flags over env: %v", r)
	}
	// Nothing listens: one line naming LLMQ_URL.
	r = runWith(t, []string{"LLMQ_URL=http://127.0.0.1:1", "LLMQ_API_KEY=k"}, "", "usage")
	if r.code() != exitFailed || !strings.Contains(message(r.err), "cannot reach llmq") || !strings.Contains(message(r.err), "LLMQ_URL") {
		t.Fatalf("unreachable: %v", r)
	}
	r = e.run(t, "jobs", "get", "job_nope")
	if r.code() != exitFailed || message(r.err) != "404 No job found with id 'job_nope'." {
		t.Fatalf("unknown job: %v", r)
	}
}

func TestUsageCommand(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	r := e.ok(t, "usage")
	for _, want := range []string{"tenant     " + e.tenantID + " (tier standard)", "spent      $0.00", "budget     $50.00", "remaining  $50.00"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("usage output lacks %q:\n%s", want, r.stdout)
		}
	}
	u := decode[client.Usage](t, e.ok(t, "usage", "--json").stdout)
	if u.Tenant != e.tenantID || *u.BudgetUSD != 50 {
		t.Fatalf("usage --json = %+v", u)
	}
	// The common flags may come before the command too.
	if u := decode[client.Usage](t, e.ok(t, "--json", "usage").stdout); u.Tenant != e.tenantID {
		t.Fatalf("--json usage = %+v", u)
	}
}

func TestJobsCommands(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := context.Background()
	c := e.client(t)
	j, err := c.Jobs.Create(ctx, &client.JobCreateParams{CustomID: "hello", Body: apptest.ChatBody("Say hi", "hello", 20)})
	if err != nil {
		t.Fatal(err)
	}

	r := e.ok(t, "jobs", "wait", j.ID)
	got := decode[client.Job](t, r.stdout)
	if got.ID != j.ID || got.Status != "succeeded" || got.Response == nil || !strings.Contains(string(got.Response.Body), "hello") {
		t.Fatalf("jobs wait: %+v", got)
	}
	got = decode[client.Job](t, e.ok(t, "jobs", "get", j.ID).stdout)
	if got.Status != "succeeded" || got.Usage == nil {
		t.Fatalf("jobs get: %+v", got)
	}

	r = e.ok(t, "jobs", "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID ") || !strings.HasPrefix(lines[1], j.ID) || !strings.Contains(lines[1], "succeeded") || !strings.Contains(lines[1], "hello") {
		t.Fatalf("jobs list:\n%s", r.stdout)
	}

	// Cancelling a finished job is refused; with --json the list is JSON
	// lines filtered by status.
	if r := e.run(t, "jobs", "cancel", j.ID); r.code() != exitFailed || !strings.Contains(message(r.err), "409") {
		t.Fatalf("cancel finished: %v", r)
	}
	r = e.ok(t, "jobs", "list", "--status", "succeeded", "--json")
	if n := strings.Count(r.stdout, "\n"); n != 1 || decode[client.Job](t, r.stdout).ID != j.ID {
		t.Fatalf("jobs list --json:\n%s", r.stdout)
	}
	if r := e.ok(t, "jobs", "list", "--status", "failed"); strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("no failed jobs, but:\n%s", r.stdout)
	}
}

func TestJobsCancelAndPaging(t *testing.T) {
	t.Parallel()
	e := setup(t, 0) // no workers: jobs stay queued
	ctx := context.Background()
	c := e.client(t)
	var ids []string
	for i := range 5 {
		j, err := c.Jobs.Create(ctx, &client.JobCreateParams{CustomID: fmt.Sprint("c", i), Body: apptest.ChatBody("x", "", 10)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	r := e.ok(t, "jobs", "cancel", ids[0])
	if r.stdout != ids[0]+" cancelled\n" {
		t.Fatalf("jobs cancel: %v", r)
	}
	// One page says how to get the next; --all walks every page.
	r = e.ok(t, "jobs", "list", "--limit", "2")
	if strings.Count(r.stdout, "\n") != 3 || !strings.Contains(r.stderr, "--after "+ids[3]) {
		t.Fatalf("one page: %v", r)
	}
	r = e.ok(t, "jobs", "list", "--all", "--limit", "2", "--json")
	if strings.Count(r.stdout, "\n") != 5 || r.stderr != "" {
		t.Fatalf("--all: %v", r)
	}
	r = e.ok(t, "jobs", "list", "--status", "cancelled")
	if !strings.Contains(r.stdout, ids[0]) || strings.Count(r.stdout, "\n") != 2 {
		t.Fatalf("--status cancelled:\n%s", r.stdout)
	}
}

func TestAdminCommands(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)

	r := e.ok(t, "admin", "tenants", "create", "--name", "acme", "--tier", "standard", "--budget", "25")
	tenant := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(tenant, "ten_") {
		t.Fatalf("tenants create: %v", r)
	}
	if r := e.run(t, "admin", "tenants", "create", "--name", "x", "--tier", "gold"); r.code() != exitFailed || !strings.Contains(message(r.err), "Unknown tier 'gold'") {
		t.Fatalf("unknown tier: %v", r)
	}
	r = e.ok(t, "admin", "tenants", "list")
	if !strings.Contains(r.stdout, tenant) || !strings.Contains(r.stdout, "acme") || !strings.Contains(r.stdout, "$25.00") || !strings.Contains(r.stdout, e.tenantID) {
		t.Fatalf("tenants list:\n%s", r.stdout)
	}
	got := decode[client.Tenant](t, e.ok(t, "admin", "tenants", "get", tenant).stdout)
	if got.Name != "acme" || got.WebhookSecret == "" {
		t.Fatalf("tenants get: %+v", got)
	}
	got = decode[client.Tenant](t, e.ok(t, "admin", "tenants", "update", tenant, "--tier", "premium", "--name", "acme2").stdout)
	if got.Tier != "premium" || got.Name != "acme2" || got.DailyBudgetUSD == nil || *got.DailyBudgetUSD != 25 {
		t.Fatalf("tenants update: %+v", got)
	}
	got = decode[client.Tenant](t, e.ok(t, "admin", "tenants", "update", "--budget", "tier", tenant).stdout)
	if got.DailyBudgetUSD != nil {
		t.Fatalf("--budget tier: %+v", got)
	}

	r = e.ok(t, "admin", "keys", "create", tenant)
	key := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(key, "llmq_") || !strings.Contains(r.stderr, "only once") {
		t.Fatalf("keys create: %v", r)
	}
	r = e.ok(t, "admin", "keys", "list", tenant)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || strings.Contains(r.stdout, key) || !strings.Contains(lines[1], key[:12]+"…") || !strings.HasSuffix(lines[1], "-") {
		t.Fatalf("keys list:\n%s", r.stdout)
	}
	keyID := strings.Fields(lines[1])[0]

	// The new key works: a job of the new tenant shows in the usage report.
	ne := *e
	ne.environ = []string{"LLMQ_URL=" + e.app.URL, "LLMQ_API_KEY=" + key}
	ne.key = key
	j, err := ne.client(t).Jobs.Create(context.Background(), &client.JobCreateParams{Body: apptest.ChatBody("hi", "", 20)})
	if err != nil {
		t.Fatal(err)
	}
	ne.ok(t, "jobs", "wait", j.ID)
	r = e.ok(t, "admin", "usage", "--tenant", tenant)
	if !strings.Contains(r.stdout, tenant+"  gpt-4o-mini  1 ") || !strings.Contains(r.stdout, "total") {
		t.Fatalf("admin usage:\n%s", r.stdout)
	}
	rep := decode[client.UsageReport](t, e.ok(t, "admin", "usage", "--json").stdout)
	if len(rep.Data) != 1 || rep.Data[0].TenantID != tenant || rep.TotalCostUSD <= 0 {
		t.Fatalf("admin usage --json: %+v", rep)
	}

	r = e.ok(t, "admin", "keys", "revoke", keyID)
	if r.stdout != keyID+" revoked\n" {
		t.Fatalf("keys revoke: %v", r)
	}
	if r := ne.run(t, "usage"); r.code() != exitFailed || !strings.Contains(message(r.err), "401") {
		t.Fatalf("revoked key: %v", r)
	}
	// Without the token the admin API refuses, naming the setting.
	bad := runWith(t, []string{"LLMQ_URL=" + e.app.URL, "LLMQ_ADMIN_TOKEN=wrong-token-0123456789"}, "", "admin", "tenants", "list")
	if bad.code() != exitFailed || !strings.Contains(message(bad.err), "LLMQ_ADMIN_TOKEN") {
		t.Fatalf("wrong admin token: %v", bad)
	}
}

// batchInput writes an OpenAI batch input file of n chat requests; the
// custom ids of the lines in bad ask for a model the policy lacks.
func batchInput(t *testing.T, n int, bad ...int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		model := "gpt-4o-mini"
		for _, x := range bad {
			if x == i {
				model = "gpt-nope"
			}
		}
		body := apptest.ChatBody(fmt.Sprintf("Question %d", i), fmt.Sprintf("req-%d", i), 20)
		body["model"] = model
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("req-%d", i), "method": "POST", "url": "/v1/chat/completions", "body": body})
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "requests.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func readResults(t *testing.T, path string) []client.BatchResult {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []client.BatchResult
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		out = append(out, *decode[client.BatchResult](t, line))
	}
	return out
}

// TestSubmitJobs: --jobs sends each line as a job; with --wait it draws
// progress and writes results and errors in the batch output format, in
// input order; a line the server refuses is an error line, not the end.
func TestSubmitJobs(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	in := batchInput(t, 6, 2)
	dir := t.TempDir()
	out, errs := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "err.jsonl")

	r := e.run(t, "submit", in, "--jobs", "--wait", "--out", out, "--errors", errs, "--poll", "50ms", "--concurrency", "3")
	if r.code() != exitIncomplete || message(r.err) != "1 of 6 requests failed (see "+errs+")" {
		t.Fatalf("submit --jobs: %v", r)
	}
	// Two phases, each with its own bar and rate: sending the lines, then
	// waiting for the jobs; the total time counts both.
	for _, want := range []string{"sending", "sent 5, refused 1", "sent 6 lines in ", ": 5 jobs, 1 refused\n",
		"done 5, failed 1", "6/6", "6 jobs: 5 done, 1 failed in ", " sending, ", " waiting)", "wrote results to " + out} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	// The waiting bar's first frame has no rate yet: what finished while
	// the lines were being sent is no instant burst of req/s.
	_, waiting, _ := strings.Cut(r.stderr, "1 refused\n")
	for _, frame := range strings.Split(waiting, "\r") {
		if strings.Contains(frame, "done ") {
			if !strings.Contains(frame, "ETA -") && !strings.Contains(frame, "done 5, failed 1") {
				t.Errorf("the first waiting frame is %q; want no rate yet", frame)
			}
			break
		}
	}
	results := readResults(t, out)
	if len(results) != 5 {
		t.Fatalf("%d results, want 5", len(results))
	}
	for i, res := range results {
		want := fmt.Sprintf("req-%d", []int{0, 1, 3, 4, 5}[i])
		if res.CustomID != want || !strings.HasPrefix(res.ID, "job_") || res.Error != nil || res.Response == nil ||
			res.Response.StatusCode != 200 || !strings.Contains(string(res.Response.Body), want) {
			t.Fatalf("result %d = %+v, want %s answered", i, res, want)
		}
	}
	failed := readResults(t, errs)
	if len(failed) != 1 || failed[0].CustomID != "req-2" || failed[0].Error == nil || !strings.Contains(failed[0].Error.Message, "gpt-nope") || failed[0].Response != nil {
		t.Fatalf("errors = %+v", failed)
	}

	// Sent again, the same lines return the jobs they made: nothing runs
	// (or is paid for) twice.
	r = e.run(t, "submit", in, "--jobs")
	if r.code() != exitIncomplete {
		t.Fatalf("second submit: %v", r)
	}
	rows := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(rows) != 5 {
		t.Fatalf("second submit printed:\n%s", r.stdout)
	}
	for i, row := range rows {
		if id, cid, _ := strings.Cut(row, "\t"); id != results[i].ID || cid != results[i].CustomID {
			t.Fatalf("second submit row %q, want %s %s", row, results[i].ID, results[i].CustomID)
		}
	}
	if !strings.Contains(r.stderr, "line 3 (req-2)") {
		t.Fatalf("refusal not named:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "; 5 had already finished (sent before)") {
		t.Fatalf("the re-sent lines are not said to have run already:\n%s", r.stderr)
	}
}

// TestSubmitJobsChecksEveryLineFirst: one bad line, and nothing is sent.
func TestSubmitJobsChecksEveryLineFirst(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	for _, tc := range []struct{ input, want string }{
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini"}}` + "\n{oops\n", "line 2 is not a request line"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}` + "\n" + `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}`, `line 2 repeats the custom_id "a" of line 1`},
		{`{"custom_id":"a","method":"GET","url":"/v1/chat/completions","body":{}}`, "method must be POST"},
		{`{"method":"POST","url":"/v1/chat/completions","body":{}}`, "line 1 has no custom_id"},
		{"\n\n", "no requests"},
	} {
		r := runWith(t, e.environ, tc.input, "submit", "-", "--jobs")
		if r.code() != exitFailed || !strings.Contains(message(r.err), tc.want) {
			t.Errorf("input %q: %v\nwant %q", tc.input, r, tc.want)
		}
	}
	l, err := e.client(t).Jobs.List(context.Background(), nil)
	if err != nil || len(l.Data) != 0 {
		t.Fatalf("jobs after refused inputs: %+v, %v", l, err)
	}
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		done, failed, total, delta int64
		elapsed                    time.Duration
		want                       string
	}{
		{0, 0, 100, 0, 0, "done 0, failed 0, ETA -"},
		{40, 10, 100, 50, 10 * time.Second, "done 40, failed 10, 5.0 req/s, ETA 10s"},
		// Measured from the first count seen, not from zero.
		{60, 0, 100, 10, 20 * time.Second, "done 60, failed 0, 30.0 req/min, ETA 1m20s"},
		{99, 1, 100, 100, time.Second, "done 99, failed 1"},
	} {
		head := fmt.Sprintf("done %d, failed %d", tc.done, tc.failed)
		if got := describe(head, tc.done+tc.failed, tc.total, tc.delta, tc.elapsed); got != tc.want {
			t.Errorf("describe(%d, %d, %d, %d, %v) = %q, want %q", tc.done, tc.failed, tc.total, tc.delta, tc.elapsed, got, tc.want)
		}
	}
}

// TestRateWindow: after a first burst, the rate (and so the time left) is
// that of the last 30 seconds.
func TestRateWindow(t *testing.T) {
	t.Parallel()
	p := &progress{}
	t0 := time.Unix(1_800_000_000, 0)
	steps := []struct {
		at         time.Duration
		n, delta   int64
		wantWindow time.Duration
	}{
		{0, 100, 0, 0}, // joined with 100 already done
		{10 * time.Second, 600, 500, 10 * time.Second},
		{20 * time.Second, 700, 600, 20 * time.Second},
		{40 * time.Second, 900, 300, 30 * time.Second}, // the window starts at the 10s sample
		{60 * time.Second, 1100, 400, 40 * time.Second},
		{61 * time.Second, 1110, 410, 41 * time.Second}, // the anchor: the last sample before 31s
	}
	for _, s := range steps {
		delta, elapsed := p.observe(t0.Add(s.at), s.n)
		if delta != s.delta || elapsed != s.wantWindow {
			t.Fatalf("at %v: %d in %v, want %d in %v", s.at, delta, elapsed, s.delta, s.wantWindow)
		}
	}
}
