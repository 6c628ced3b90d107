package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// bareEnviron is this process's environment without any LLMQ_* or TEST_*
// variable, nor a provider key: what a newcomer's shell has.
func bareEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LLMQ_") && !strings.HasPrefix(kv, "TEST_") && !strings.HasPrefix(kv, "OPENAI_API_KEY=") {
			out = append(out, kv)
		}
	}
	return out
}

// devRun is one run of `dispatcher dev`.
type devRun struct {
	base        string // the URL it serves, from its banner
	out, errOut testutil.SyncBuffer
	cancel      context.CancelFunc
	done        chan error
}

// startDev runs dev on a port the system picks (a port looked up free and
// passed in could be taken meanwhile by a parallel test) until its banner
// is printed.
func startDev(t *testing.T, dir string, environ []string, extra ...string) *devRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &devRun{cancel: cancel, done: make(chan error, 1)}
	args := append([]string{"dev", "-dir", dir, "-addr", "127.0.0.1:0"}, extra...)
	go func() { d.done <- run(ctx, args, environ, &d.out, &d.errOut) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(d.out.String(), "Ctrl-C stops llmq") {
		select {
		case err := <-d.done:
			t.Fatalf("dev exited before it was ready: %v\n%s\n%s", err, d.out.String(), d.errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev did not print its banner within 30s:\n%s\n%s", d.out.String(), d.errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := runningLine.FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("the banner does not say where llmq runs:\n%s", d.out.String())
	}
	d.base = m[1]
	return d
}

func (d *devRun) stop(t *testing.T) {
	t.Helper()
	d.cancel()
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("dev: %v\n%s", err, d.errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dev did not stop within 30s")
	}
}

var (
	runningLine = regexp.MustCompile(`^llmq is running at (http://127\.0\.0\.1:\d+) `)
	keyLine     = regexp.MustCompile(`(?m)^\s+key:\s+(llmq_\S+)$`)
	curlPost    = regexp.MustCompile(`(?m)^\s+(curl -s -X POST \S+/v1/jobs .*)$`)
	tokenLine   = regexp.MustCompile(`(?m)^\s+admin token:\s+(\S+)$`)
	adminLine   = regexp.MustCompile(`(?m)^\s+dashboard:\s+(\S+)/dashboard\s+\(user: admin, password: (\S+), the admin token\)$`)
	exportLine  = regexp.MustCompile(`(?m)^\s+export (LLMQ_URL=\S+) (LLMQ_API_KEY=\S+) LLMQ_ADMIN_TOKEN=(\S+)$`)
	llmqLine    = regexp.MustCompile(`(?m)^\s+go run \./cmd/llmq (.+)$`)
)

// keyOf is the tenant key dev printed.
func keyOf(t *testing.T, d *devRun) string {
	t.Helper()
	m := keyLine.FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("the banner shows no key:\n%s", d.out.String())
	}
	return m[1]
}

func devClient(t *testing.T, base, key string) *client.Client {
	t.Helper()
	c, err := client.New(base, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitJobs waits until every job succeeded.
func waitJobs(t *testing.T, c *client.Client, ids ...string) {
	t.Helper()
	waitJobsWithin(t, c, 30*time.Second, ids...)
}

// waitJobsWithin is waitJobs with its own bound.
func waitJobsWithin(t *testing.T, c *client.Client, within time.Duration, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	for _, id := range ids {
		j, err := c.Jobs.Wait(ctx, id, &client.WaitOptions{Interval: 50 * time.Millisecond, MaxInterval: 200 * time.Millisecond})
		if err != nil || j.Status != "succeeded" || j.Response == nil {
			t.Fatalf("job %s = %+v, %v; want succeeded within %v", id, j, err, within)
		}
	}
	t.Logf("%d jobs succeeded after %v", len(ids), time.Since(start).Round(time.Millisecond))
}

// buildLLMQ builds the CLI the banner's llmq lines run, in the background.
func buildLLMQ(t *testing.T) <-chan string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "llmq")
	done := make(chan string, 1)
	go func() {
		out, err := exec.Command("go", "build", "-o", bin, "github.com/llmq/llmq/cmd/llmq").CombinedOutput()
		if err != nil {
			bin = "build failed: " + err.Error() + "\n" + string(out)
		}
		done <- bin
	}()
	return done
}

// TestDevRunsOnABareMachine: with no LLMQ_* variable set, `dispatcher dev`
// starts with an embedded Redis, SQLite and the simulated provider; the
// curl and llmq lines it prints work, and the dashboard and the queue
// monitor open with the admin password it prints. Stopped with jobs still
// unfinished, it starts again with the same key, the finished job, the
// day's spend and the batch; the embedded Redis's snapshot brings back the
// unfinished jobs' tasks and the dashboard's last hour, so nothing is
// rebuilt or re-enqueued, and nothing is logged.
func TestDevRunsOnABareMachine(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is not installed (apt-get install curl): the test runs the printed curl line")
	}
	llmqBin := buildLLMQ(t)
	dir := t.TempDir() + "/llmq-dev"
	ctx := context.Background()

	// One job at a time, so that jobs are still waiting when dev stops.
	d := startDev(t, dir, bareEnviron(), "-concurrency", "1")
	base, banner := d.base, d.out.String()
	key := keyOf(t, d)
	curl := curlPost.FindStringSubmatch(banner)
	admin := adminLine.FindStringSubmatch(banner)
	export := exportLine.FindStringSubmatch(banner)
	token := tokenLine.FindStringSubmatch(banner)
	if curl == nil || admin == nil || export == nil || token == nil || admin[1] != base {
		t.Fatalf("the banner lacks the curl, admin token, dashboard or export line:\n%s", banner)
	}
	// One admin token: the dashboard's password is the one the CLI exports.
	if admin[2] != token[1] || export[3] != token[1] {
		t.Fatalf("admin token %q, dashboard password %q, exported %q: want one token\n%s", token[1], admin[2], export[3], banner)
	}
	out, err := exec.Command("sh", "-c", curl[1]).CombinedOutput()
	if err != nil {
		t.Fatalf("the printed curl line failed: %v\n%s", err, out)
	}
	var created map[string]any
	if err := json.Unmarshal(out, &created); err != nil || created["status"] != "queued" {
		t.Fatalf("the printed curl line answered %s", out)
	}
	id := created["id"].(string)
	c := devClient(t, base, key)
	waitJobs(t, c, id)

	for _, path := range []string{"/dashboard", "/monitoring/api/queues"} {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.SetBasicAuth("admin", admin[2])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s with the printed admin password: %d", path, resp.StatusCode)
		}
	}

	// The llmq lines, run as printed (the CLI built rather than go run).
	bin := <-llmqBin
	if strings.HasPrefix(bin, "build failed") {
		t.Fatal(bin)
	}
	cmds := llmqLine.FindAllStringSubmatch(banner, -1)
	if len(cmds) < 3 {
		t.Fatalf("the banner shows %d llmq lines, want at least 3:\n%s", len(cmds), banner)
	}
	for _, m := range cmds {
		cmd := exec.Command(bin, strings.Fields(m[1])...)
		cmd.Env = append(bareEnviron(), export[1], export[2], "LLMQ_ADMIN_TOKEN="+export[3])
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("llmq %s: %v\n%s", m[1], err, out)
		}
		if m[1] == "jobs list" && !strings.Contains(string(out), id) || m[1] == "usage" && !strings.Contains(string(out), "spent") ||
			m[1] == "admin tenants list" && !strings.Contains(string(out), "dev") {
			t.Fatalf("llmq %s printed:\n%s", m[1], out)
		}
	}

	u, err := c.Usage(ctx)
	if err != nil || u.SpentUSD <= 0 {
		t.Fatalf("usage after a job = %+v, %v; want some spend", u, err)
	}
	f, err := c.Files.Upload(ctx, "in.jsonl", strings.NewReader(
		`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}`+"\n"), "batch")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	// Leave work unfinished: five jobs for one worker slot, the simulator
	// taking 0.3–1 s a call.
	var pending []string
	for i := 0; i < 5; i++ {
		j, err := c.Jobs.Create(ctx, &client.JobCreateParams{Body: map[string]any{"model": "gpt-4o-mini", "max_tokens": 5,
			"messages": []map[string]string{{"role": "user", "content": "hi"}}}})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, j.ID)
	}
	d.stop(t)

	db, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "llmq.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	unfinished, _, err := db.JobListUnfinished(ctx, &store.JobListUnfinishedParams{})
	_ = db.Close()
	if err != nil || len(unfinished) == 0 {
		t.Fatalf("no job was unfinished when dev stopped (%v): the restart would not need the reconciler", err)
	}

	if _, err := os.Stat(filepath.Join(dir, "redis.json")); err != nil {
		t.Fatalf("no snapshot of the embedded redis: %v", err)
	}

	d = startDev(t, dir, bareEnviron())
	defer d.stop(t)
	if again := keyOf(t, d); again != key {
		t.Fatalf("the restart printed another key: %s", again)
	}
	c = devClient(t, d.base, key)
	if j, err := c.Jobs.Get(ctx, id); err != nil || j.Status != "succeeded" || j.Response == nil {
		t.Fatalf("after the restart the job is %+v, %v", j, err)
	}
	if u2, err := c.Usage(ctx); err != nil || u2.SpentUSD < u.SpentUSD {
		t.Fatalf("usage after the restart = %+v, %v; want at least the $%v spent before", u2, err, u.SpentUSD)
	}
	if got, err := c.Batches.Get(ctx, b.ID); err != nil || got.ID != b.ID {
		t.Fatalf("after the restart the batch is %+v, %v", got, err)
	}
	// The snapshot kept the unfinished jobs' tasks. Under load, one of them
	// was seen still queued 30 s after the restart: a job the fair queue
	// had released without its task in the snapshot comes back through
	// the scheduler's sweep of stale releases (StaleAfter, 30 s, looked at
	// every 10 s), so the wait covers that backstop.
	waitJobsWithin(t, c, 90*time.Second, pending...)

	// The last hour counts every job done, before the restart too: once the
	// recorder has flushed, the tile shows every succeeded job (before, the
	// restart left only those done since).
	// The batch's line may still be running: count the succeeded jobs
	// again with every look at the tile.
	succeededJobs := func() int {
		n := 0
		for _, err := range c.Jobs.All(ctx, &client.JobListParams{Status: "succeeded"}) {
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		return n
	}
	var tile string
	succeeded := -1
	deadline := time.Now().Add(20 * time.Second)
	for tile != strconv.Itoa(succeeded) {
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the jobs tile shows %s done in the last hour; %d jobs succeeded", tile, succeeded)
		}
		time.Sleep(200 * time.Millisecond)
		succeeded = succeededJobs()
		tile = jobsTile(t, d.base, admin[2])
	}
	if succeeded != 2+len(pending) {
		t.Fatalf("%d jobs succeeded, want %d (the first job, the batch's line and the %d left unfinished)", succeeded, 2+len(pending), len(pending))
	}
	for _, line := range []string{"rebuilt spend", "redis lost", "WARN", "ERROR"} {
		if strings.Contains(d.errOut.String(), line) {
			t.Errorf("the restart logged %q:\n%s", line, d.errOut.String())
		}
	}
}

var jobsTileValue = regexp.MustCompile(`data-tile="jobs"><div class="label">[^<]*</div><div class="value">([0-9,]+)</div>`)

// jobsTile is the value of the dashboard's "Jobs done, last hour" tile.
func jobsTile(t *testing.T, base, password string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/dashboard", nil)
	req.SetBasicAuth("admin", password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	m := jobsTileValue.FindSubmatch(page)
	if m == nil {
		t.Fatalf("no jobs tile on the dashboard (%d):\n%.2000s", resp.StatusCode, page)
	}
	return strings.ReplaceAll(string(m[1]), ",", "")
}

// -addr defaults to LLMQ_LISTEN_ADDR, and the flag wins over it; before,
// dev ignored the variable.
func TestDevAddrFollowsListenAddr(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args    []string
		environ []string
		want    string
	}{
		{nil, nil, "127.0.0.1:8080"},
		{nil, []string{"LLMQ_LISTEN_ADDR=127.0.0.1:9999"}, "127.0.0.1:9999"},
		{[]string{"-addr", "127.0.0.1:7777"}, []string{"LLMQ_LISTEN_ADDR=127.0.0.1:9999"}, "127.0.0.1:7777"},
	} {
		o, err := parseDev(c.args, c.environ, io.Discard)
		if err != nil || o.addr != c.want {
			t.Errorf("dev %v with %v: addr %v, %v; want %s", c.args, c.environ, o, err, c.want)
		}
	}
}

// TestDevDemo: -demo N submits N sample jobs and a small batch.
func TestDevDemo(t *testing.T) {
	t.Parallel()
	d := startDev(t, t.TempDir(), bareEnviron(), "-demo", "3")
	defer d.stop(t)
	c := devClient(t, d.base, keyOf(t, d))
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		bs, err := c.Batches.List(ctx, &client.ListParams{})
		if err != nil {
			t.Fatal(err)
		}
		// The demo submits its jobs first, then the batch.
		if len(bs.Data) == 1 && bs.Data[0].RequestCounts.Total > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no validated demo batch within 30s: %+v", bs.Data)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var demo int
	for j, err := range c.Jobs.All(ctx, &client.JobListParams{}) {
		if err != nil {
			t.Fatal(err)
		}
		if j.BatchID == nil {
			demo++
		}
	}
	if demo != 3 {
		t.Fatalf("-demo 3 submitted %d jobs", demo)
	}
}

// TestDevProviderURL: -provider-url sends the jobs to that provider with
// the key from the variable -provider-key-env names, and without the key
// dev stops at once with one line that says where the key goes.
func TestDevProviderURL(t *testing.T) {
	t.Parallel()
	providerKey := "sk-real-" + testutil.RandomHex(8)
	provider := sim.Start(sim.Config{APIKey: providerKey, DefaultMaxTokens: 1024})
	t.Cleanup(provider.Close)

	var out, errOut testutil.SyncBuffer
	err := run(context.Background(), []string{"dev", "-dir", t.TempDir(), "-addr", "127.0.0.1:0", "-provider-url", provider.BaseURL},
		bareEnviron(), &out, &errOut)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "OPENAI_API_KEY") ||
		!strings.Contains(err.Error(), "-provider-url") || out.String() != "" {
		t.Fatalf("dev without the provider's key: %v (stdout %q); want one line naming -provider-url and OPENAI_API_KEY", err, out.String())
	}

	d := startDev(t, t.TempDir(), append(bareEnviron(), "DEV_TEST_PROVIDER_KEY="+providerKey),
		"-provider-url", provider.BaseURL, "-provider-key-env", "DEV_TEST_PROVIDER_KEY")
	defer d.stop(t)
	if !strings.Contains(d.out.String(), "provider: "+provider.BaseURL) {
		t.Fatalf("the banner does not name the provider:\n%s", d.out.String())
	}
	c := devClient(t, d.base, keyOf(t, d))
	j, err := c.Jobs.Create(context.Background(), &client.JobCreateParams{Body: map[string]any{"model": "gpt-4o-mini", "max_tokens": 5,
		"messages": []map[string]string{{"role": "user", "content": "hi"}}}})
	if err != nil {
		t.Fatal(err)
	}
	waitJobs(t, c, j.ID)
	if st := provider.Stats(); st.Requests != 1 {
		t.Fatalf("the provider at -provider-url got %d requests, want 1 (stats %+v)", st.Requests, st)
	}
}

// TestDevLogsText: dev logs text lines unless LLMQ_LOG_FORMAT says
// otherwise (a production process logs JSON by default).
func TestDevLogsText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		environ []string
		json    bool
	}{{nil, false}, {[]string{"LLMQ_LOG_FORMAT=json"}, true}} {
		env, err := devEnv(&devOptions{dir: t.TempDir(), concurrency: 1}, c.environ, "http://127.0.0.1:8080")
		if err != nil {
			t.Fatal(err)
		}
		var buf strings.Builder
		env.Logger(&buf).Warn("hello", "k", "v")
		line := buf.String()
		if isJSON := json.Valid([]byte(line)); isJSON != c.json ||
			!c.json && (!strings.Contains(line, "level=WARN msg=hello k=v") || strings.Count(line, "\n") != 1) {
			t.Fatalf("dev with %v logs %q, want JSON %v", c.environ, line, c.json)
		}
	}
}

// TestDevSimulatorNeedsItsKey: the simulator dev mounts on the API's
// address answers nobody without the key made at its start (OpenAI's 401,
// on its API and its control API alike; the last start's key and the old
// fixed "dev" are refused), and its ids are random: two starts answer
// their first response with different ids, where a seed and a counter gave
// the same.
func TestDevSimulatorNeedsItsKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	call := func(method, url, key, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	const respBody = `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":16}`
	var keys, ids []string
	for start := range 2 {
		d := startDev(t, dir, bareEnviron())
		b, err := os.ReadFile(filepath.Join(dir, "sim-key"))
		if err != nil {
			t.Fatal(err)
		}
		key := strings.TrimSpace(string(b))
		if !strings.Contains(d.out.String(), filepath.Join(dir, "sim-key")) {
			t.Errorf("the banner does not say where the simulator's key is:\n%s", d.out.String())
		}
		refused := append([]string{"", "dev"}, keys...)
		for _, wrong := range refused {
			for _, p := range []struct{ method, path, body string }{
				{"POST", "/sim/v1/responses", respBody},
				{"POST", "/sim/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`},
				{"GET", "/sim/v1/models", ""},
				{"GET", "/sim/sim/bills", ""},
				{"POST", "/sim/sim/mode", `{"worst_case":true}`},
			} {
				code, body := call(p.method, d.base+p.path, wrong, p.body)
				var e struct {
					Error struct {
						Type string `json:"type"`
						Code string `json:"code"`
					} `json:"error"`
				}
				if code != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || e.Error.Code != "invalid_api_key" || e.Error.Type != "invalid_request_error" {
					t.Errorf("start %d: %s %s with key %q: %d %s", start, p.method, p.path, wrong, code, body)
				}
			}
		}
		code, body := call("POST", d.base+"/sim/v1/responses", key, respBody)
		var r struct {
			ID string `json:"id"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &r) != nil || !strings.HasPrefix(r.ID, "resp_") {
			t.Fatalf("start %d: the simulator with its key: %d %s", start, code, body)
		}
		keys, ids = append(keys, key), append(ids, r.ID)
		d.stop(t)
	}
	if keys[0] == keys[1] || ids[0] == ids[1] {
		t.Errorf("two starts made keys %q and response ids %q: want each different", keys, ids)
	}
}

// TestDevRaisesAnOlderSnapshotToTheLedger: dev killed between two saves of
// its embedded Redis starts from the older snapshot, holding less spend
// than the ledger charged, and miniredis has no run id by which a day could
// notice. Dev raises today's days to the ledger before it serves: the first
// usage read counts every charged job, to the micro-dollar.
func TestDevRaisesAnOlderSnapshotToTheLedger(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	runJob := func(d *devRun) {
		t.Helper()
		c := devClient(t, d.base, keyOf(t, d))
		j, err := c.Jobs.Create(ctx, &client.JobCreateParams{Body: map[string]any{"model": "gpt-4o-mini", "max_tokens": 20,
			"messages": []map[string]string{{"role": "user", "content": "hi"}}}})
		if err != nil {
			t.Fatal(err)
		}
		waitJobs(t, c, j.ID)
	}
	d := startDev(t, dir, bareEnviron())
	runJob(d)
	d.stop(t)
	snapshot := filepath.Join(dir, "redis.json")
	older, err := os.ReadFile(snapshot)
	if err != nil {
		t.Fatal(err)
	}
	d = startDev(t, dir, bareEnviron())
	runJob(d)
	runJob(d)
	u, err := devClient(t, d.base, keyOf(t, d)).Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.stop(t)
	// As if dev had been killed before its later saves.
	if err := os.WriteFile(snapshot, older, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "llmq.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := db.UsageSumByTenantDay(ctx, u.Tenant, u.Day)
	_ = db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if spent := money.Micros(math.Round(u.SpentUSD * 1e6)); spent != ledger {
		t.Fatalf("before the restart: spent %s, ledger %s", spent, ledger)
	}

	d = startDev(t, dir, bareEnviron())
	defer d.stop(t)
	after, err := devClient(t, d.base, keyOf(t, d)).Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if spent := money.Micros(math.Round(after.SpentUSD * 1e6)); after.Day != u.Day || spent != ledger {
		t.Fatalf("after a restart from the older snapshot: spent %s on %s, want the ledger's %s", spent, after.Day, ledger)
	}
	if !strings.Contains(d.errOut.String(), "raised a day's spend to the ledger") {
		t.Fatalf("dev did not say it raised the day:\n%s", d.errOut.String())
	}
}
