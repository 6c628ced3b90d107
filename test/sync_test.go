package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
)

func chatBody(extra string) string {
	return `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello there"}],"max_tokens":20` + extra + `}`
}

// TestSyncChatIsAJob: a synchronous call answers the provider's body with
// its job's id, and the job is the tenant's, sync, succeeded and charged.
func TestSyncChatIsAJob(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	_, key := a.Tenant("standard")
	resp := a.Do("POST", "/v1/chat/completions", key, chatBody(""))
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.Status, resp.Body)
	}
	var cc struct {
		Object string `json:"object"`
		Usage  struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	resp.JSON(t, &cc)
	if cc.Object != "chat.completion" || cc.Usage.TotalTokens == 0 {
		t.Fatalf("body %s", resp.Body)
	}
	id := resp.Header.Get("X-Llmq-Job-Id")
	if id == "" || resp.Header.Get("X-RateLimit-Limit") == "" {
		t.Fatalf("headers %v", resp.Header)
	}
	// The answer is flushed before the job's result is committed: the job
	// is succeeded a moment after it.
	job := waitJob(t, a, key, id, "succeeded")
	if !job.Sync || job.Status != "succeeded" || job.CostUSD <= 0 || job.Usage == nil || job.Usage.TotalTokens != cc.Usage.TotalTokens {
		t.Fatalf("job %+v", job)
	}
	var list client.List[client.Job]
	a.Do("GET", "/v1/jobs", key, nil).JSON(t, &list)
	if len(list.Data) != 1 || list.Data[0].ID != id {
		t.Fatalf("list %+v", list)
	}
	// The answer is written before its spend is settled.
	if u := settledUsage(t, a, key); u["spent_usd"].(float64) <= 0 {
		t.Fatalf("usage %+v", u)
	}

	// Idempotency-Key: the retry gets the first answer, and no second call.
	h := http.Header{"Idempotency-Key": {"k1"}}
	first := apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key, chatBody(""), h)
	again := apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key, chatBody(""), h)
	if first.Status != 200 || !sameJSON(first.Body, again.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %d %s / %d %s", first.Status, first.Body, again.Status, again.Body)
	}
	if n := a.Sim.Stats().Requests; n != 2 {
		t.Fatalf("provider saw %d requests, want 2", n)
	}
}

// TestSyncStream relays the provider's chunks and ends with [DONE]; the
// usage chunk reaches only a client that asked for it, and the job is
// charged from it either way.
func TestSyncStream(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	_, key := a.Tenant("standard")
	for _, withUsage := range []bool{false, true} {
		extra := `,"stream":true`
		if withUsage {
			extra += `,"stream_options":{"include_usage":true}`
		}
		resp := a.Do("POST", "/v1/chat/completions", key, chatBody(extra))
		if resp.Status != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d %v: %s", resp.Status, resp.Header, resp.Body)
		}
		var events []string
		sc := bufio.NewScanner(bytes.NewReader(resp.Body))
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events = append(events, d)
			}
		}
		if len(events) < 3 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("events %q", events)
		}
		sawUsage := false
		var text strings.Builder
		for _, e := range events[:len(events)-1] {
			var c struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Usage *struct {
					TotalTokens int64 `json:"total_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(e), &c); err != nil {
				t.Fatalf("event %q: %v", e, err)
			}
			if c.Usage != nil && c.Usage.TotalTokens > 0 {
				sawUsage = true
			}
			for _, ch := range c.Choices {
				text.WriteString(ch.Delta.Content)
			}
		}
		if sawUsage != withUsage || text.Len() == 0 {
			t.Fatalf("include_usage %v: usage chunk seen %v, text %q", withUsage, sawUsage, text.String())
		}
		// the job's result is committed just after the stream ends
		job := waitJob(t, a, key, resp.Header.Get("X-Llmq-Job-Id"), "succeeded")
		if job.Usage == nil || job.Usage.CompletionTokens == 0 || job.CostUSD <= 0 {
			t.Fatalf("job %+v", job)
		}
	}
}

// TestSyncBadInput answers the clear 4xx POST /v1/jobs gives, before any
// job or call.
func TestSyncBadInput(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	_, key := a.Tenant("standard")
	for _, c := range []struct {
		path, body, param string
		status            int
	}{
		{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, "model", 400},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[]}`, "messages", 400},
		{"/v1/chat/completions", chatBody(`,"stream":"yes"`), "stream", 400},
		{"/v1/chat/completions", chatBody(`,"stream":true,"max_tokens":0`), "", 400},
		{"/v1/chat/completions", chatBody(`,"stream_options":{"include_usage":true}`), "stream_options", 400},
		{"/v1/embeddings", `{"model":"text-embedding-3-small"}`, "input", 400},
		{"/v1/embeddings", `{"model":"text-embedding-3-small","input":"x","stream":true}`, "stream", 400},
	} {
		resp := a.Do("POST", c.path, key, c.body)
		var e client.Error
		resp.JSON(t, &e)
		if resp.Status != c.status || (c.param != "" && e.Param != c.param) || e.Message == "" {
			t.Errorf("%s %s: %d %s", c.path, c.body, resp.Status, resp.Body)
		}
	}
	if n := a.Sim.Stats().Requests; n != 0 {
		t.Fatalf("provider saw %d requests", n)
	}
	var list client.List[client.Job]
	a.Do("GET", "/v1/jobs", key, nil).JSON(t, &list)
	if len(list.Data) != 0 {
		t.Fatalf("jobs %+v", list.Data)
	}
}

// TestSyncWait: a request that cannot start within its wait is a 429 with
// Retry-After, not charged, never sent.
func TestSyncWait(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024},
		Policy: strings.Replace(apptest.PolicyYAML, "limits: {rpm: 3000, tpm: 300000}", "limits: {rpm: 1, tpm: 300000}", 1)})
	_, key := a.Tenant("standard")
	if r := a.Do("POST", "/v1/chat/completions", key, chatBody("")); r.Status != 200 {
		t.Fatalf("first: %d %s", r.Status, r.Body)
	}
	began := time.Now()
	r := apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key, chatBody(""), http.Header{"X-Llmq-Max-Wait": {"200ms"}})
	var e client.Error
	r.JSON(t, &e)
	if r.Status != 429 || e.Code != client.CodeRateLimitExceeded || r.Header.Get("Retry-After") == "" || time.Since(began) > 5*time.Second {
		t.Fatalf("over the limit: %d %v %s", r.Status, r.Header, r.Body)
	}
	var job client.Job
	a.Do("GET", "/v1/jobs/"+r.Header.Get("X-Llmq-Job-Id"), key, nil).JSON(t, &job)
	if job.Status != "failed" || job.CostUSD != 0 || !job.Sync {
		t.Fatalf("refused job %+v", job)
	}
	if n := a.Sim.Stats().Requests; n != 1 {
		t.Fatalf("provider saw %d requests, want 1", n)
	}

}

// TestSyncOverBudget: once the tenant's budget cannot hold a request's worst
// case it is a 429 insufficient_quota naming the budget, not sent.
func TestSyncOverBudget(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	for _, tier := range []string{"standard", "free"} { // defers, rejects
		id, key := a.Tenant(tier)
		if r := a.Do("PATCH", "/admin/v1/tenants/"+id, apptest.AdminToken, map[string]any{"daily_budget_usd": 0.05}); r.Status != 200 {
			t.Fatalf("budget: %d %s", r.Status, r.Body)
		}
		big := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}],"max_tokens":1024,"n":64}`
		ok := 0
		for range 10 {
			r := a.Do("POST", "/v1/chat/completions", key, big)
			if r.Status == 200 {
				ok++
				continue
			}
			var e client.Error
			r.JSON(t, &e)
			if r.Status != 429 || e.Code != client.CodeInsufficientQuota || !strings.Contains(e.Message, "budget") || r.Header.Get("Retry-After") == "" {
				t.Fatalf("%s over budget: %d %v %s", tier, r.Status, r.Header, r.Body)
			}
			break
		}
		if ok == 0 || ok == 10 {
			t.Fatalf("%s: %d answered before the refusal", tier, ok)
		}
	}
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// postCancelled sends a chat request and gives up on it after d.
func postCancelled(t *testing.T, url, key string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(chatBody("")))
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d before the client left", resp.StatusCode)
	}
}

// waitJob polls the tenant's job id (its newest job when id is "") until
// it is in status want.
func waitJob(t *testing.T, a *apptest.App, key, id, want string) client.Job {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var job client.Job
		if id == "" {
			var list client.List[client.Job]
			a.Do("GET", "/v1/jobs?limit=1", key, nil).JSON(t, &list)
			if len(list.Data) == 1 {
				job = list.Data[0]
			}
		} else {
			a.Do("GET", "/v1/jobs/"+id, key, nil).JSON(t, &job)
		}
		if job.Status == want {
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %q is %+v, want status %s", id, job, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A client that leaves while its request waits for the rate limit cancels
// it: no call, no charge. One that leaves mid-call leaves it to finish, and
// it is charged once.
func TestSyncDisconnect(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024,
		Latency: 400 * time.Millisecond},
		Policy: strings.Replace(apptest.PolicyYAML, "limits: {rpm: 3000, tpm: 300000}", "limits: {rpm: 1, tpm: 300000}", 1)})
	_, key := a.Tenant("standard")
	// Load the tokenizer first (a job that never runs: no workers), so the
	// call below starts within the client's patience.
	if r := a.Do("POST", "/v1/jobs", key, map[string]any{"body": json.RawMessage(chatBody(""))}); r.Status != 202 {
		t.Fatalf("warm-up: %d %s", r.Status, r.Body)
	}
	postCancelled(t, a.URL, key, 200*time.Millisecond) // mid-call
	done := waitJob(t, a, key, "", "succeeded")
	if done.CostUSD <= 0 || done.Attempts != 1 {
		t.Fatalf("mid-call: %+v", done)
	}
	postCancelled(t, a.URL, key, 300*time.Millisecond) // waiting for the next minute's request
	cancelled := waitJob(t, a, key, "", "cancelled")
	if cancelled.CostUSD != 0 || cancelled.Attempts != 0 {
		t.Fatalf("before the call: %+v", cancelled)
	}
	if n := a.Sim.Stats().Requests; n != 1 {
		t.Fatalf("provider saw %d requests, want 1", n)
	}
	if u := settledUsage(t, a, key); u["spent_usd"].(float64) != done.CostUSD {
		t.Fatalf("usage %+v, want %v spent and nothing reserved", u, done.CostUSD)
	}
}
