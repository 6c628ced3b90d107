package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/worker"
)

// Requests to the Responses API that cannot run are refused with the
// Responses API's error, naming the parameter, and change nothing: no job,
// no task, nothing reserved.
func TestResponsesBadInput(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	cases := []struct {
		name, body string
		code       client.Code
		param      string
		status     int
	}{
		{"no input", `{"model":"gpt-4o-mini"}`, client.CodeInvalidRequest, "input", 400},
		{"input not text", `{"model":"gpt-4o-mini","input":7}`, client.CodeInvalidRequest, "input", 400},
		{"bad role", `{"model":"gpt-4o-mini","input":[{"role":"robot","content":"x"}]}`, client.CodeInvalidRequest, "input[0].role", 400},
		{"part without text", `{"model":"gpt-4o-mini","input":[{"role":"user","content":[{"type":"input_text"}]}]}`, client.CodeInvalidRequest, "input[0].content[0].text", 400},
		{"max_output_tokens too small", `{"model":"gpt-4o-mini","input":"x","max_output_tokens":1}`, client.CodeInvalidRequest, "max_output_tokens", 400},
		{"max_output_tokens beyond capacity", `{"model":"gpt-4o-mini","input":"x","max_output_tokens":400000}`, client.CodeTokensExceedCapacity, "max_output_tokens", 400},
		{"unknown model", `{"model":"gpt-9","input":"x"}`, client.CodeModelNotFound, "model", 400},
		{"embedding model", `{"model":"text-embedding-3-small","input":"x"}`, client.CodeModelNotSupported, "model", 400},
		{"stream not boolean", `{"model":"gpt-4o-mini","input":"x","stream":"yes"}`, client.CodeInvalidValue, "stream", 400},
		{"background not boolean", `{"model":"gpt-4o-mini","input":"x","background":1}`, client.CodeInvalidValue, "background", 400},
		{"background streamed", `{"model":"gpt-4o-mini","input":"x","background":true,"stream":true}`, client.CodeInvalidValue, "stream", 400},
		{"stream_options without stream", `{"model":"gpt-4o-mini","input":"x","stream_options":{}}`, client.CodeInvalidValue, "stream_options", 400},
		{"not JSON", `{"model":`, client.CodeInvalidJSON, "", 400},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, a.Do("POST", "/v1/responses", key, c.body), c.status, c.code, c.param)
		})
	}
	// As a job: the same refusals, named inside the body; background is
	// refused (a job is already in the background).
	checkError(t, a.Do("POST", "/v1/jobs", key, `{"endpoint":"/v1/responses","body":{"model":"gpt-4o-mini","input":[]}}`), 400, client.CodeInvalidRequest, "body.input")
	checkError(t, a.Do("POST", "/v1/jobs", key, `{"endpoint":"/v1/responses","body":{"model":"gpt-4o-mini","input":"x","background":true}}`), 400, client.CodeInvalidRequest, "body.background")
	nothingQueued(t, a, tenant)
	if d, err := a.Budgets.Status(t.Context(), a.Account(tenant)); err != nil || d.Reserved != 0 || d.Spent != 0 {
		t.Fatalf("budget after refusals: %+v %v", d, err)
	}
}

// A streamed response relays the provider's typed events as named
// Server-Sent Events, in order, ending with response.completed and no
// [DONE]; the job is charged the usage response.completed carries.
func TestResponsesStreamRelay(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("standard")
	r := apptest.Do(t, a.URL, "POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"Count to five.","max_output_tokens":40,"stream":true}`, nil)
	if r.Status != 200 || r.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %s: %s", r.Status, r.Header, r.Body)
	}
	var names []string
	var last struct {
		Type     string `json:"type"`
		Response struct {
			Usage struct {
				InputTokens  int64 `json:"input_tokens"`
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	sc.Buffer(nil, 1<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data := strings.TrimPrefix(line, "data: ")
			if data == "[DONE]" {
				t.Fatal("a Responses stream ended with [DONE]")
			}
			if err := json.Unmarshal([]byte(data), &last); err != nil || last.Type != event {
				t.Fatalf("event %q with data %s", event, data)
			}
			names = append(names, event)
		}
	}
	if len(names) < 5 || names[0] != "response.created" || names[len(names)-1] != "response.completed" {
		t.Fatalf("events %v", names)
	}
	job := a.EndedJob(r.Header.Get("X-Llmq-Job-Id")).ID
	var j struct {
		Status string `json:"status"`
		Usage  struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	a.Do("GET", "/v1/jobs/"+job, key, nil).JSON(t, &j)
	if j.Status != "succeeded" || j.Usage.PromptTokens != last.Response.Usage.InputTokens || j.Usage.CompletionTokens != last.Response.Usage.OutputTokens || j.Usage.CompletionTokens == 0 {
		t.Fatalf("job %+v, stream's usage %+v", j, last.Response.Usage)
	}
}

// A background response is llmq's job: answered at once as queued, its id
// the job's; GET follows the job; cancel ends one that has not run, and
// leaves one that ended as it is; another tenant's, a synchronous job's and
// an unknown id are not found.
func TestBackgroundResponses(t *testing.T) {
	t.Parallel()
	a := start(t) // no worker: jobs stay queued until one is started
	_, key := a.Tenant("standard")
	_, other := a.Tenant("standard")
	type response struct {
		ID         string `json:"id"`
		Object     string `json:"object"`
		Status     string `json:"status"`
		Background bool   `json:"background"`
		Usage      *struct {
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	create := func() response {
		t.Helper()
		r := a.Do("POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"Say hi","max_output_tokens":20,"background":true}`)
		var out response
		r.JSON(t, &out)
		if r.Status != 200 || out.Object != "response" || out.Status != "queued" || !out.Background || !strings.HasPrefix(out.ID, "job_") || out.Usage != nil {
			t.Fatalf("background create: %d %s", r.Status, r.Body)
		}
		return out
	}
	cancelled := create()
	var got response
	a.Do("POST", "/v1/responses/"+cancelled.ID+"/cancel", key, nil).JSON(t, &got)
	if got.Status != "cancelled" {
		t.Fatalf("cancel: %+v", got)
	}
	done := create()
	a.StartWorker(worker.Options{})
	deadline := time.Now().Add(time.Minute)
	for got.Status = "queued"; got.Status == "queued" || got.Status == "in_progress"; {
		if time.Now().After(deadline) {
			t.Fatalf("background response still %s", got.Status)
		}
		time.Sleep(20 * time.Millisecond)
		got = response{}
		a.Do("GET", "/v1/responses/"+done.ID, key, nil).JSON(t, &got)
	}
	if got.Status != "completed" || got.Usage == nil || got.Usage.OutputTokens == 0 || !strings.HasPrefix(got.ID, "resp_") {
		t.Fatalf("completed background response: %+v", got)
	}
	var again response
	a.Do("POST", "/v1/responses/"+done.ID+"/cancel", key, nil).JSON(t, &again)
	if again.Status != "completed" {
		t.Fatalf("cancel of a completed response: %+v", again)
	}
	a.Do("GET", "/v1/responses/"+cancelled.ID, key, nil).JSON(t, &got)
	if got.Status != "cancelled" {
		t.Fatalf("the cancelled response reads %+v", got)
	}
	sync := a.Do("POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"Say hi","max_output_tokens":20}`)
	for _, c := range []struct{ key, id string }{{other, done.ID}, {key, sync.Header.Get("X-Llmq-Job-Id")}, {key, "resp_123"}, {key, "job_nope"}} {
		checkError(t, a.Do("GET", "/v1/responses/"+c.id, c.key, nil), http.StatusNotFound, client.CodeNotFound, "")
		checkError(t, a.Do("POST", "/v1/responses/"+c.id+"/cancel", c.key, nil), http.StatusNotFound, client.CodeNotFound, "")
	}
}

// A follow-up naming a stored response as previous_response_id reserves
// the earlier conversation's tokens too (the provider counts and bills
// them), is charged the provider's count, which is believed though it is
// above llmq's count of the follow-up's own input, and passes store and
// previous_response_id to the provider as sent.
func TestFollowUpReservesTheConversation(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("standard")
	type usage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	}
	var first struct {
		ID    string `json:"id"`
		Usage usage  `json:"usage"`
	}
	long := strings.Repeat("word ", 3000)
	r := a.Do("POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"`+long+`","max_output_tokens":50}`)
	r.JSON(t, &first)
	if r.Status != 200 || !strings.HasPrefix(first.ID, "resp_") || first.Usage.InputTokens < 3000 {
		t.Fatalf("first: %d %s", r.Status, r.Body)
	}
	r = a.Do("POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"And then?","max_output_tokens":20,"previous_response_id":"`+first.ID+`","store":false}`)
	var second struct {
		Usage usage `json:"usage"`
	}
	r.JSON(t, &second)
	if r.Status != 200 {
		t.Fatalf("follow-up: %d %s", r.Status, r.Body)
	}
	prior := first.Usage.InputTokens + first.Usage.OutputTokens
	job := a.EndedJob(r.Header.Get("X-Llmq-Job-Id"))
	if job.EstPromptTokens < prior || job.EstPromptTokens > prior+20 {
		t.Fatalf("the follow-up reserved a prompt of %d tokens; the conversation holds %d", job.EstPromptTokens, prior)
	}
	if second.Usage.InputTokens < prior || job.PromptTokens != second.Usage.InputTokens || job.UsageEstimated || job.Status != "succeeded" {
		t.Fatalf("follow-up charged %d prompt tokens (estimated %v, %s); the provider counted %d", job.PromptTokens, job.UsageEstimated, job.Status, second.Usage.InputTokens)
	}
	// store: false: nothing remembered, so a follow-up of it reserves only
	// its own input.
	r = a.Do("POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"Unstored.","max_output_tokens":20,"store":false}`)
	var unstored struct {
		ID string `json:"id"`
	}
	r.JSON(t, &unstored)
	rows, err := a.Store.StoredResponseGet(t.Context(), []string{unstored.ID, first.ID})
	if err != nil {
		t.Fatal(err)
	}
	if rows[unstored.ID] != nil {
		t.Fatalf("an unstored response was recorded: %+v", rows[unstored.ID])
	}
	if row := rows[first.ID]; row == nil || row.Tokens != prior || row.TenantID != job.TenantID {
		t.Fatalf("the first response's record %+v, want its tenant's with the %d tokens of its conversation", row, prior)
	}
}

// A stream the provider fails midway (an error chunk on chat; an error or
// response.failed event on the Responses API) was admitted and billed by
// the provider, which never says how much: the client gets what was
// relayed and an error event (llmq's own, for either of the Responses
// API's), and the job fails charged its worst case, as an answer without
// usage is. It is not sent again.
func TestStreamFailingMidwayIsCharged(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Faults: sim.Faults{StreamError: 1}, Seed: 7}})
	tenant, key := a.Tenant("standard")
	var total money.Micros
	bodies := []string{
		`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Tell a story."}],"max_tokens":200,"stream":true}`,
		`{"model":"gpt-4o-mini","input":"Tell a story.","max_output_tokens":200,"stream":true}`,
		`{"model":"gpt-4o-mini","input":"Tell another story.","max_output_tokens":300,"stream":true}`,
	}
	for i, body := range bodies {
		path := "/v1/responses"
		if i == 0 {
			path = "/v1/chat/completions"
		}
		r := a.Do("POST", path, key, body)
		events := strings.Split(strings.TrimSuffix(string(r.Body), "\n\n"), "\n\n")
		last := events[len(events)-1]
		if r.Status != 200 || len(events) < 2 || strings.Contains(string(r.Body), "[DONE]") || strings.Contains(string(r.Body), "response.completed") {
			t.Fatalf("%s: %d %s", path, r.Status, r.Body)
		}
		if i == 0 && !strings.HasPrefix(last, `data: {"error":{"message":"The server had an error`) ||
			i > 0 && !strings.HasPrefix(last, "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\"") {
			t.Fatalf("%s ended with %q", path, last)
		}
		job := a.EndedJob(r.Header.Get("X-Llmq-Job-Id"))
		if job.Status != "failed" || job.Error == nil || job.Error.Code != map[bool]client.Code{true: client.CodeProviderStreamFailed, false: client.CodeServerError}[i == 0] || !job.UsageEstimated ||
			job.Cost != job.EstCost || job.Cost == 0 || job.CompletionTokens != job.EstMaxTokens {
			t.Fatalf("%s: job %+v, error %+v", path, job, job.Error)
		}
		total += job.Cost
	}
	// The budget is settled just after the job is stored.
	testutil.Eventually(t, 10*time.Second, func() bool {
		d, err := a.Budgets.Status(t.Context(), a.Account(tenant))
		return err == nil && d.Spent == total && d.Reserved == 0
	})
	if st := a.Sim.Stats(); st.Requests != int64(len(bodies)) {
		t.Errorf("the provider was called %d times for %d streams", st.Requests, len(bodies))
	}
}

// A background response cancelled while its provider call runs: the call
// still ends and is charged once, and the cancelled job, its Responses
// object and the tenant's day all show that charge: the provider's usage,
// the ledger row's cost to the micro-dollar, spent once, nothing reserved.
func TestBackgroundResponseCancelledMidCallShowsItsCharge(t *testing.T) {
	t.Parallel()
	// The provider's calls pass through a gate that holds them until
	// released, and remembers the body of each answer.
	var (
		sim      atomic.Pointer[url.URL]
		answered atomic.Pointer[[]byte]
	)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		proxy := httputil.NewSingleHostReverseProxy(sim.Load())
		proxy.ModifyResponse = func(resp *http.Response) error {
			body, err := io.ReadAll(resp.Body)
			resp.Body = io.NopCloser(bytes.NewReader(body))
			answered.Store(&body)
			return err
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(gate.Close)
	var released sync.Once
	t.Cleanup(func() { released.Do(func() { close(release) }) })
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Workers: 1,
		Policy: strings.ReplaceAll(apptest.PolicyYAML, "{{SIM}}", gate.URL+"/v1")})
	sim.Store(testutil.Must(url.Parse(a.Sim.URL)))
	tenant, key := a.Tenant("standard")

	r := a.Do("POST", "/v1/responses", key, `{"model":"gpt-4o-mini","input":"Say hi to everyone here","max_output_tokens":40,"background":true}`)
	id := r.Header.Get("X-Llmq-Job-Id")
	if r.Status != http.StatusOK || id == "" {
		t.Fatalf("background create: %d %s", r.Status, r.Body)
	}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the provider call never came")
	}
	type response struct {
		Status string `json:"status"`
		Usage  *struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
			TotalTokens  int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	var cancelled response
	a.Do("POST", "/v1/responses/"+id+"/cancel", key, nil).JSON(t, &cancelled)
	if cancelled.Status != "cancelled" || cancelled.Usage != nil {
		t.Fatalf("cancel mid-call: %+v, want cancelled, nothing charged yet", cancelled)
	}
	released.Do(func() { close(release) })

	// The call ends, is charged, and its budget settled.
	ctx := context.Background()
	var charged *store.UsageEntry
	testutil.Eventually(t, 30*time.Second, func() bool {
		e, err := a.Store.UsageGetByJob(ctx, id)
		if err != nil {
			return false
		}
		charged = e
		d, err := a.Budgets.Status(ctx, a.Account(tenant))
		return err == nil && d.Reserved == 0 && d.Spent > 0
	})
	var provider struct {
		Usage struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
			TotalTokens  int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(*answered.Load(), &provider); err != nil || provider.Usage.OutputTokens == 0 {
		t.Fatalf("the provider's answer: %v %s", err, *answered.Load())
	}
	pu := provider.Usage
	if charged.PromptTokens != pu.InputTokens || charged.CompletionTokens != pu.OutputTokens || charged.Cost <= 0 {
		t.Fatalf("ledger row %+v; the provider's usage %+v", charged, pu)
	}

	var job client.Job
	a.Do("GET", "/v1/jobs/"+id, key, nil).JSON(t, &job)
	if job.Status != "cancelled" || job.Usage == nil || job.Usage.PromptTokens != pu.InputTokens ||
		job.Usage.CompletionTokens != pu.OutputTokens || job.Usage.TotalTokens != pu.TotalTokens ||
		job.CostUSD != charged.Cost.USD() {
		t.Fatalf("GET /v1/jobs of the cancelled job: %+v usage %+v; provider's usage %+v, ledger's cost %v", job, job.Usage, pu, charged.Cost)
	}
	var got response
	a.Do("GET", "/v1/responses/"+id, key, nil).JSON(t, &got)
	if got.Status != "cancelled" || got.Usage == nil || got.Usage.InputTokens != pu.InputTokens ||
		got.Usage.OutputTokens != pu.OutputTokens || got.Usage.TotalTokens != pu.TotalTokens {
		t.Fatalf("GET /v1/responses of the cancelled response: %+v usage %+v; provider's usage %+v", got, got.Usage, pu)
	}
	stored, err := a.Store.JobGetByID(ctx, id)
	if err != nil || stored.Cost != charged.Cost {
		t.Fatalf("the job's cost %v, its ledger row's %v (%v)", stored.Cost, charged.Cost, err)
	}
	// Spent once: in the ledger and in the budget.
	if sum, err := a.Store.UsageSumByTenantDay(ctx, tenant, charged.Day); err != nil || sum != charged.Cost {
		t.Fatalf("the tenant's day in the ledger: %v, %v; want %v", sum, err, charged.Cost)
	}
	if d, err := a.Budgets.Status(ctx, a.Account(tenant)); err != nil || d.Spent != charged.Cost || d.Reserved != 0 {
		t.Fatalf("the tenant's budget: %+v, %v; want %v spent, nothing reserved", d, err, charged.Cost)
	}
}
