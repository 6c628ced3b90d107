package wire_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmq/llmq/client"

	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

func TestWriteError(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	wire.WriteError(rec, &wire.Error{Status: http.StatusTooManyRequests, RetryAfter: 1500 * time.Millisecond,
		Message: "Slow <down> & wait.", Type: "rate_limit_error", Code: client.CodeRateLimitExceeded})
	const want = `{"error":{"message":"Slow \u003cdown\u003e \u0026 wait.","type":"rate_limit_error","code":"rate_limit_exceeded","param":null}}` + "\n"
	if got := rec.Body.String(); got != want {
		t.Errorf("body = %s, want %s", got, want)
	}
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("status %d, headers %v", rec.Code, rec.Header())
	}

	// No Retry-After without a delay; an empty code and param are null.
	rec = httptest.NewRecorder()
	wire.WriteError(rec, &wire.Error{Status: http.StatusBadRequest, Message: "m", Type: "invalid_request_error", Param: "model"})
	if got, want := rec.Body.String(), `{"error":{"message":"m","type":"invalid_request_error","code":null,"param":"model"}}`+"\n"; got != want {
		t.Errorf("body = %s, want %s", got, want)
	}
	if _, ok := rec.Header()["Retry-After"]; ok {
		t.Errorf("Retry-After set without a delay: %v", rec.Header())
	}
}

func TestJob(t *testing.T) {
	t.Parallel()
	created, finished := time.Unix(1700000000, 0), time.Unix(1700000060, 0)
	j := &store.Job{
		ID: "job_01", Endpoint: "/v1/chat/completions", Model: "gpt-4o-mini", Queue: "low",
		Status: store.JobFailed, Attempts: 2, RateLimited: 1, EstPromptTokens: 10, EstMaxTokens: 20,
		EstCost: 1500, CreatedAt: created, FinishedAt: &finished,
		Error:    &store.JobError{Message: "bad", Type: "invalid_request_error", Code: client.CodeInvalidValue},
		Metadata: json.RawMessage(`{"k":"v"}`),
	}
	b, err := json.Marshal(wire.Job(j))
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"id":"job_01","object":"job","custom_id":null,"endpoint":"/v1/chat/completions","model":"gpt-4o-mini",` +
		`"served_by":null,"status":"failed","priority":"low","batch_id":null,"attempts":2,"rate_limited":1,"created_at":1700000000,` +
		`"started_at":null,"finished_at":1700000060,"next_run_at":null,"response":null,` +
		`"error":{"message":"bad","type":"invalid_request_error","code":"invalid_value","param":null},"usage":null,` +
		`"cost_usd":0,"estimate":{"prompt_tokens":10,"max_tokens":20,"cost_usd":0.0015},"webhook_url":null,` +
		`"metadata":{"k":"v"},"sync":false}`
	if string(b) != want {
		t.Errorf("job =\n%s\nwant\n%s", b, want)
	}
	// A job a fallback's deployment answered names both.
	j.Deployment, j.ServedModel = "azure-east/mini", "gpt-4o-mini-fallback"
	if out := wire.Job(j); out.ServedBy == nil || *out.ServedBy != (client.JobServedBy{Model: "gpt-4o-mini-fallback", Deployment: "azure-east/mini"}) {
		t.Errorf("served_by = %+v", out.ServedBy)
	}
	j.ServedModel = ""
	if out := wire.Job(j); out.ServedBy.Model != "gpt-4o-mini" {
		t.Errorf("served_by = %+v, want the job's own model", out.ServedBy)
	}
}

// A job shows usage when it was charged for a call: it succeeded, or it
// ended otherwise while its call ran and was charged (at no cost too: a
// free model); never when no call was charged.
func TestJobUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		job  store.Job
		want *client.JobUsage
	}{
		{store.Job{Status: store.JobSucceeded}, &client.JobUsage{}},
		{store.Job{Status: store.JobCancelled}, nil},
		{store.Job{Status: store.JobFailed, Error: &store.JobError{Message: "bad"}}, nil},
		{store.Job{Status: store.JobCancelled, PromptTokens: 7, CompletionTokens: 5, TotalTokens: 12, Cost: 9},
			&client.JobUsage{PromptTokens: 7, CompletionTokens: 5, TotalTokens: 12}},
		{store.Job{Status: store.JobCancelled, PromptTokens: 7, TotalTokens: 7}, &client.JobUsage{PromptTokens: 7, TotalTokens: 7}},
		{store.Job{Status: store.JobFailed, Cost: 3, TotalTokens: 1, UsageEstimated: true}, &client.JobUsage{TotalTokens: 1, Estimated: true}},
	} {
		got := wire.JobUsage(&c.job)
		if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("JobUsage of a %s job costing %v: %+v, want %+v", c.job.Status, c.job.Cost, got, c.want)
		}
	}
}

func TestBatchResultErrorBody(t *testing.T) {
	t.Parallel()
	j := &store.Job{ID: "job_01abc", CustomID: "r-1", Status: store.JobFailed, ResponseStatus: 400, ProviderRequestID: "req_1", LineNo: 3,
		Error: &store.JobError{Message: "bad", Type: "invalid_request_error", Param: "messages"}}
	b, err := json.Marshal(wire.BatchResult(j, store.BatchCompleted))
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"id":"batch_req_01abc","custom_id":"r-1","response":{"status_code":400,"request_id":"req_1",` +
		`"body":{"error":{"message":"bad","type":"invalid_request_error","code":null,"param":"messages"}}},` +
		`"error":{"code":"invalid_request_error","message":"bad","line":3}}`
	if string(b) != want {
		t.Errorf("result =\n%s\nwant\n%s", b, want)
	}
}
