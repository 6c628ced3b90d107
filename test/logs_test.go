package integration

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/testutil"
)

// logsPolicy serves gpt-4o-mini and a model the provider no longer has, so
// that one job succeeds and the other fails at once (404 model_not_found);
// the provider's key comes from a variable of its own.
const logsPolicy = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: LOGS_PROVIDER_KEY
    timeout: 10s
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 3000, tpm: 300000}
  - name: retired-model
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 3000, tpm: 300000}
tiers:
  - name: standard
    daily_budget_usd: 50
    priority: default
    on_exhausted: defer
    api_rps: 1000
`

// logLine is one JSON log record.
type logLine struct {
	Level  string `json:"level"`
	Msg    string `json:"msg"`
	Job    string `json:"job"`
	Status string `json:"status"`
}

// TestLogsOfJobs runs a succeeding and a failing job through the API and an
// in-process worker with every record captured at debug: each job logs one
// line per state change (queued, running, then its end), at debug except
// the failure, which is a warning; no prompt, tenant key or provider key
// appears anywhere in the logs.
func TestLogsOfJobs(t *testing.T) {
	t.Parallel()
	providerKey := "sk-provider-" + testutil.RandomHex(12)
	var logs testutil.SyncBuffer
	// The production logger, at debug.
	debug := &config.Env{LogLevel: "debug", LogFormat: "json"}
	a := apptest.Start(t, apptest.Options{
		RedisDB: redisDB,
		Policy:  logsPolicy,
		Sim: &sim.Config{APIKey: providerKey, OnlyKnownModels: true, Models: map[string]sim.Model{"gpt-4o-mini": {}},
			DefaultMaxTokens: 1024, Echo: true},
		Workers: 1,
		Logs:    debug.Logger(&logs).Handler(),
		Environ: []string{"LOGS_PROVIDER_KEY=" + providerKey},
	})
	_, key := a.Tenant("standard")
	prompt := "a prompt nobody may read " + testutil.RandomHex(8)

	submit := func(model string) string {
		t.Helper()
		body := apptest.ChatBody(prompt, "", 10)
		body["model"] = model
		r := a.Do("POST", "/v1/jobs", key, map[string]any{"body": body})
		if r.Status != http.StatusAccepted {
			t.Fatalf("create job: %d %s", r.Status, r.Body)
		}
		return r.Map(t)["id"].(string)
	}
	ok, bad := submit("gpt-4o-mini"), submit("retired-model")
	waitJob := func(id, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			st := a.Do("GET", "/v1/jobs/"+id, key, nil).Map(t)["status"]
			if st == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s is %v after 30s, want %s", id, st, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitJob(ok, "succeeded")
	waitJob(bad, "failed")
	// A worker logs a job's end just after storing it: wait for the lines.
	var out string
	var byJob map[string][]logLine
	ended := func(id string) bool {
		ls := byJob[id]
		return len(ls) > 0 && (stateOf(ls[len(ls)-1]) == "succeeded" || stateOf(ls[len(ls)-1]) == "failed")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, byJob = logs.String(), parseLogs(t, logs.String())
		if ended(ok) && ended(bad) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no end of both jobs in the logs:\n%s", out)
		}
	}

	for what, secret := range map[string]string{"the prompt": prompt, "the tenant key": key, "the provider key": providerKey} {
		if strings.Contains(out, secret) {
			t.Errorf("%s appears in the logs", what)
		}
	}
	check := func(id string, want [][2]string) {
		t.Helper()
		got := byJob[id]
		var seen [][2]string
		for _, l := range got {
			seen = append(seen, [2]string{stateOf(l), l.Level})
		}
		if len(seen) != len(want) {
			t.Fatalf("job %s logged %v, want one line per state change %v\n%s", id, seen, want, out)
		}
		for i := range want {
			if seen[i] != want[i] {
				t.Fatalf("job %s logged %v, want %v\n%s", id, seen, want, out)
			}
		}
	}
	check(ok, [][2]string{{"queued", "DEBUG"}, {"running", "DEBUG"}, {"succeeded", "DEBUG"}})
	check(bad, [][2]string{{"queued", "DEBUG"}, {"running", "DEBUG"}, {"failed", "WARN"}})
}

// parseLogs reads JSON log lines and groups those of a job by its id.
func parseLogs(t *testing.T, out string) map[string][]logLine {
	t.Helper()
	byJob := map[string][]logLine{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, sc.Bytes())
		}
		if l.Job != "" {
			byJob[l.Job] = append(byJob[l.Job], l)
		}
	}
	return byJob
}

// stateOf is the job state a log line records: its status attribute, or
// the end its message names.
func stateOf(l logLine) string {
	switch {
	case l.Status != "":
		return l.Status
	case strings.Contains(l.Msg, "succeeded"):
		return "succeeded"
	case strings.Contains(l.Msg, "failed"):
		return "failed"
	}
	return "not a state change: " + l.Msg
}

// TestProductionLogsAreJSON builds the logger of a process whose
// environment sets nothing about logs: one JSON object per line, at info.
func TestProductionLogsAreJSON(t *testing.T) {
	t.Parallel()
	env, err := config.LoadEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	logger := env.Logger(&out)
	logger.Debug("hidden")
	logger.Info("shown", "k", "v")
	var l map[string]any
	if err := json.Unmarshal([]byte(out.String()), &l); err != nil || l["msg"] != "shown" || l["level"] != "INFO" || l["k"] != "v" {
		t.Fatalf("default logs = %q (%v), want one JSON line at info", out.String(), err)
	}
}
