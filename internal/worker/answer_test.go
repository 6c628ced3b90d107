package worker_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// startAnswering starts a test app whose only provider answers every call
// 200 with body, and counts the calls.
func startAnswering(t *testing.T, body string) (*apptest.App, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(provider.Close)
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB,
		Policy: strings.Replace(apptest.PolicyYAML, "{{SIM}}", provider.URL+"/v1", 1)})
	return a, &calls
}

func answer(usage string) string {
	return `{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]` + usage + `}`
}

// The outside probe's answers with usage that cannot be believed: none at
// all succeeds charged the worst case, flagged; negative or absurd usage
// (past what the request as sent could be billed) fails the job after one
// call, charged that bound; non-integer usage (an answer that cannot be
// read) fails it charged the worst case; the arithmetic never wraps around
// to a free call.
func TestProviderUsageIsChecked(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, usage, status string
		code                client.Code
	}{
		{"missing", ``, "succeeded", ""},
		{"negative", `,"usage":{"prompt_tokens":-5,"completion_tokens":3,"total_tokens":-2}`, "failed", "provider_usage_invalid"},
		{"1e15 tokens", `,"usage":{"prompt_tokens":1000000000000000,"completion_tokens":3,"total_tokens":1000000000000003}`, "failed", "provider_usage_invalid"},
		{"beyond max_tokens", `,"usage":{"prompt_tokens":10,"completion_tokens":900,"total_tokens":910}`, "failed", "provider_usage_invalid"},
		{"non-integer", `,"usage":{"prompt_tokens":1.5,"completion_tokens":3,"total_tokens":4.5}`, "failed", "provider_response_invalid"},
		{"believable", `,"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}`, "succeeded", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a, calls := startAnswering(t, answer(c.usage))
			_, key := a.Tenant("standard")
			id := submit(t, a, key, map[string]any{"body": apptest.ChatBody("hi", "", 5)})
			if err := a.JobHandler(worker.Options{}).Run(context.Background(), id); err != nil {
				t.Fatalf("run: %v", err)
			}
			j := job(t, a, id)
			if string(j.Status) != c.status || calls.Load() != 1 {
				t.Fatalf("job %s after %d calls (%+v), want %s after one", j.Status, calls.Load(), j.Error, c.status)
			}
			if c.code != "" && (j.Error == nil || j.Error.Code != c.code) {
				t.Fatalf("error %+v, want code %s", j.Error, c.code)
			}
			entry, err := a.Store.UsageGetByJob(context.Background(), id)
			if err != nil {
				t.Fatalf("ledger row: %v", err)
			}
			if c.name == "believable" {
				if j.UsageEstimated || entry.PromptTokens != 9 || entry.Cost >= j.EstCost {
					t.Fatalf("charged %+v (job %+v), want the provider's count", entry, j)
				}
				return
			}
			want := j.EstCost // no usage: the reservation's worst case
			if c.status == "failed" && c.code == "provider_usage_invalid" {
				// Usage past what the request as sent could be billed: the
				// most it could be billed, the model's 128,000-token context
				// window read and its max_tokens produced, at its price.
				m, _ := a.Policy.Current().Model("gpt-4o-mini")
				want = m.Deployments[0].Price.WorstCase(m.ContextWindow, 5)
				if j.PromptTokens != m.ContextWindow {
					t.Fatalf("usage recorded %d prompt tokens, want the bound's %d", j.PromptTokens, m.ContextWindow)
				}
			}
			if !j.UsageEstimated || entry.Cost != want || entry.Cost <= 0 || j.CompletionTokens != 5 || j.Cost != want {
				t.Fatalf("charged %+v (job: estimated %v, cost %d, est %d, completion %d), want %d",
					entry, j.UsageEstimated, j.Cost, j.EstCost, j.CompletionTokens, want)
			}
			if j.Status == store.JobFailed && (j.ResponseStatus != http.StatusBadGateway || len(j.ResponseBody) != 0) {
				t.Fatalf("a failed job kept the provider's answer: %d %s", j.ResponseStatus, j.ResponseBody)
			}
			u := a.Do("GET", "/v1/jobs/"+id, key, nil).Map(t)["usage"].(map[string]any)
			if u["estimated"] != true {
				t.Fatalf("GET /v1/jobs usage = %v, want estimated", u)
			}
		})
	}
}
