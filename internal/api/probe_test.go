package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/store"
)

// The outside probe's duplicate keys: a body naming model or max_tokens
// twice (Go's decoder keeps the last, another parser the first) is refused
// with a 400 naming the member, at the top and inside the body, on the job
// and the synchronous endpoints; nothing is stored or enqueued.
func TestDuplicateKeysAreRefused(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	for _, c := range []struct {
		path, body, param string
	}{
		{"/v1/jobs", `{"body":{"model":"o3","model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":100000,"max_tokens":5}}`, "body.model"},
		{"/v1/jobs", `{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi","content":"ho"}],"max_tokens":5}}`, "body.messages[0].content"},
		{"/v1/jobs", `{"custom_id":"a","custom_id":"b","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}`, "custom_id"},
		{"/v1/chat/completions", `{"model":"o3","model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, "model"},
	} {
		e := checkError(t, a.Do("POST", c.path, key, c.body), 400, client.CodeDuplicateKey, c.param)
		if !strings.Contains(e.Error.Message, "a second time") {
			t.Errorf("%s: message %q does not name the member", c.path, e.Error.Message)
		}
	}
	// Nested past what any store takes.
	deep := `{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"metadata":` +
		strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + `}}`
	checkError(t, a.Do("POST", "/v1/jobs", key, deep), 400, client.CodeTooDeep, "body.metadata")
	nothingQueued(t, a, tenant)
}

// The outside probe's smaller findings: a wait header past any duration,
// webhook ports outside 1-65535, tenant names with control characters, and
// the param of a body that is not an object.
func TestProbeSmallFindings(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	chat := map[string]any{"model": "gpt-4o-mini", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 5}
	for _, v := range []string{"99999999999999999999", "+Inf", "1e400"} {
		r := apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key, chat, http.Header{"X-Llmq-Max-Wait": {v}})
		if r.Status != 200 {
			t.Errorf("X-Llmq-Max-Wait: %s: %d %s, want the longest wait", v, r.Status, r.Body)
		}
	}
	for v, code := range map[string]client.Code{"NaN": client.CodeInvalidHeader, "-1e400": client.CodeInvalidHeader, "-3": client.CodeInvalidHeader, "soon": client.CodeInvalidHeader} {
		checkError(t, apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key, chat, http.Header{"X-Llmq-Max-Wait": {v}}), 400, code, "X-Llmq-Max-Wait")
	}
	for _, u := range []string{"https://example.com:0/hook", "https://example.com:99999/hook", "https://example.com:-1/hook"} {
		checkError(t, a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("hi", "", 5), "webhook_url": u}), 400, client.CodeInvalidURL, "webhook_url")
	}
	checkError(t, a.Do("POST", "/v1/jobs", key, map[string]any{"body": []int{1}}), 400, client.CodeInvalidRequest, "body")
	nothingQueuedAfterSync(t, a, tenant)

	for _, name := range []string{"acme\r\nX-Injected: 1", "acme\x1b[31m", "acme\u202egnp.exe", "zero\u200bwidth"} {
		checkError(t, a.Do("POST", "/admin/v1/tenants", apptest.AdminToken, map[string]any{"name": name, "tier": "standard"}), 400, client.CodeInvalidValue, "name")
	}
	checkError(t, a.Do("PATCH", "/admin/v1/tenants/"+tenant, apptest.AdminToken, map[string]any{"name": "a\nb"}), 400, client.CodeInvalidValue, "name")
}

// nothingQueuedAfterSync checks that the refused requests stored no async
// job: the tenant's only jobs are its synchronous calls.
func nothingQueuedAfterSync(t *testing.T, a *apptest.App, tenantID string) {
	t.Helper()
	jobs, _, err := a.Store.JobList(context.Background(), &store.JobListParams{TenantID: tenantID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if !j.Sync {
			t.Fatalf("a refused request stored job %s", j.ID)
		}
	}
}

// A provider's 200 cut short is never a 200 to the client: after llmq's
// retries within the request's wait, a 502 in OpenAI's shape; its HTML
// 500 never reaches the tenant either.
func TestSyncUnreadableAnswerIsABadGateway(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, body string
		code       client.Code
		status     int
	}{
		{"truncated 200", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"mess`, client.CodeProviderResponseUnreadable, 200},
		{"html 500", "<html><pre>Traceback (most recent call last):\npostgres://app:s3cret@db/prod</pre></html>", "", 500},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(c.body))
			}))
			t.Cleanup(provider.Close)
			a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: strings.Replace(apptest.PolicyYAML, "{{SIM}}", provider.URL+"/v1", 1)})
			_, key := a.Tenant("standard")
			r := apptest.Do(t, a.URL, "POST", "/v1/chat/completions", key,
				map[string]any{"model": "gpt-4o-mini", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 5},
				http.Header{"X-Llmq-Max-Wait": {"0.5"}})
			if r.Status < 500 || strings.Contains(string(r.Body), "s3cret") || strings.Contains(string(r.Body), "Traceback") {
				t.Fatalf("%d %s, want a 5xx in llmq's words", r.Status, r.Body)
			}
			var e apiError
			r.JSON(t, &e)
			if c.code != "" && (r.Status != http.StatusBadGateway || e.Error.Code == nil || *e.Error.Code != c.code) {
				t.Fatalf("%d %s, want 502 %s", r.Status, r.Body, c.code)
			}
		})
	}
}
