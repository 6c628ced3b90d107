package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// TestOpenAIGoSDKResponses drives POST /v1/responses with the official Go
// SDK's responses service, changing nothing but its base URL: whole (a
// string input with instructions, and items), streamed as typed events,
// in the background (Get until completed, Cancel), and a refusal as the
// SDK's error. Each answer's usage is the job's, charged at the model's
// price.
func TestOpenAIGoSDKResponses(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Workers: 1})
	_, key := a.Tenant("standard")
	c := openai.NewClient(option.WithBaseURL(a.URL+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	var raw *http.Response
	r, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model:           "gpt-4o-mini",
		Instructions:    openai.String("Be brief."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello.")},
		MaxOutputTokens: openai.Int(30),
	}, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if r.OutputText() == "" || r.Usage.InputTokens == 0 || r.Usage.OutputTokens == 0 {
		t.Fatalf("response %+v", r)
	}
	checkJobUsage(t, a, key, raw.Header.Get("X-Llmq-Job-Id"), r.Usage.InputTokens, r.Usage.OutputTokens)

	items := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("Count to five.", responses.EasyInputMessageRoleUser)}
	s := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "gpt-4o-mini", MaxOutputTokens: openai.Int(40),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: items}}, option.WithResponseInto(&raw))
	var types []string
	var text strings.Builder
	var final responses.Response
	for s.Next() {
		ev := s.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			final = ev.AsResponseCompleted().Response
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if len(types) < 5 || types[0] != "response.created" || text.Len() == 0 || final.Usage.OutputTokens == 0 {
		t.Fatalf("stream: %v, text %q, usage %+v", types, text.String(), final.Usage)
	}
	checkJobUsage(t, a, key, raw.Header.Get("X-Llmq-Job-Id"), final.Usage.InputTokens, final.Usage.OutputTokens)

	bg, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-4o-mini", Background: openai.Bool(true),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello.")}, MaxOutputTokens: openai.Int(20)})
	if err != nil {
		t.Fatal(err)
	}
	if bg.Status != "queued" && bg.Status != "in_progress" {
		t.Fatalf("background answered %q", bg.Status)
	}
	id := bg.ID
	for bg.Status == "queued" || bg.Status == "in_progress" {
		time.Sleep(50 * time.Millisecond)
		if bg, err = c.Responses.Get(ctx, id, responses.ResponseGetParams{}); err != nil {
			t.Fatal(err)
		}
	}
	if bg.Status != "completed" || bg.OutputText() == "" {
		t.Fatalf("background ended %q: %+v", bg.Status, bg)
	}
	checkJobUsage(t, a, key, id, bg.Usage.InputTokens, bg.Usage.OutputTokens)
	if again, err := c.Responses.Cancel(ctx, id); err != nil || again.Status != "completed" {
		t.Fatalf("cancel of a completed response: %v %+v", err, again)
	}

	_, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: "no-such-model",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "model" {
		t.Fatalf("bad model: %v", err)
	}
	_, err = c.Responses.Get(ctx, "resp_elsewhere", responses.ResponseGetParams{})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("unknown response: %v", err)
	}
}

// TestResponsesNodeSDKs runs test/node/responses.mjs: the official Node
// SDK's client.responses (whole, streamed, its stream helper, background
// with retrieve and cancel, refusals) and the Vercel AI SDK's default
// openai(model) call (generateText, streamText). The jobs it names were
// charged the usage the SDKs reported.
func TestResponsesNodeSDKs(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Workers: 1})
	_, key := a.Tenant("standard")
	var summary struct {
		Jobs  []string   `json:"jobs"`
		Usage [][2]int64 `json:"usage"`
	}
	nodeSummary(t, "responses.mjs", a.URL+"/v1", key, &summary)
	if len(summary.Jobs) != 2 || len(summary.Usage) != 6 {
		t.Fatalf("summary %+v", summary)
	}
	checkJobUsage(t, a, key, summary.Jobs[0], summary.Usage[0][0], summary.Usage[0][1])
	checkJobUsage(t, a, key, summary.Jobs[1], summary.Usage[3][0], summary.Usage[3][1])
}

// nodeSummary runs a Node script of test/node against llmq's baseURL with
// key (runNodeScript), logs what it printed and decodes its last line, a
// JSON summary, into v.
func nodeSummary(t *testing.T, script, baseURL, key string, v any) {
	t.Helper()
	out := runNodeScript(t, 3*time.Minute, script, baseURL, key)
	t.Logf("%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("%s's summary: %v", script, err)
	}
}

// checkJobUsage checks that job succeeded with the usage a client was
// answered, priced by its model (gpt-4o-mini in apptest's policy: $0.15 and
// $0.60 a million tokens).
func checkJobUsage(t *testing.T, a *apptest.App, key, job string, input, output int64) {
	t.Helper()
	var j struct {
		Status   string `json:"status"`
		Endpoint string `json:"endpoint"`
		Usage    struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
		CostUSD float64 `json:"cost_usd"`
	}
	a.EndedJob(job)
	resp := a.Do(http.MethodGet, "/v1/jobs/"+job, key, nil)
	if resp.Status != http.StatusOK {
		t.Fatalf("GET job %q: %d %s", job, resp.Status, resp.Body)
	}
	resp.JSON(t, &j)
	want := (float64(input)*0.15 + float64(output)*0.60) / 1e6
	if j.Status != "succeeded" || j.Endpoint != "/v1/responses" || j.Usage.PromptTokens != input || j.Usage.CompletionTokens != output ||
		j.CostUSD < want-0.000002 || j.CostUSD > want+0.000002 {
		t.Fatalf("job %s: %s; want succeeded, usage %d/%d, cost $%.6f", job, resp.Body, input, output, want)
	}
}

// TestFailingStreamsNodeSDK runs test/node/stream_error.mjs against an llmq
// whose provider fails every stream after its first content: the official
// Node SDK sees chat's error as its APIError and the Responses API's as an
// event of type error, and each stream's job (the helper's too) failed,
// charged its worst case, its usage estimated; the tenant's spend is their
// sum.
func TestFailingStreamsNodeSDK(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 3000, TPM: 300000}, DefaultMaxTokens: 1024, Faults: sim.Faults{StreamError: 1}}})
	tenant, key := a.Tenant("standard")
	var summary struct {
		Jobs []string `json:"jobs"`
	}
	if nodeSummary(t, "stream_error.mjs", a.URL+"/v1", key, &summary); len(summary.Jobs) != 3 {
		t.Fatalf("summary %+v", summary)
	}
	var list client.List[client.Job]
	a.Do(http.MethodGet, "/v1/jobs?limit=10", key, nil).JSON(t, &list)
	if len(list.Data) != 4 {
		t.Fatalf("%d jobs, want 4 (three streams and the helper's)", len(list.Data))
	}
	named := map[string]bool{}
	for _, id := range summary.Jobs {
		named[id] = true
	}
	var total money.Micros
	for _, j := range list.Data {
		delete(named, j.ID)
		job := a.EndedJob(j.ID)
		if job.Status != store.JobFailed || !job.UsageEstimated || job.Cost == 0 || job.Cost != job.EstCost {
			t.Fatalf("job %s: %s, cost $%s of a worst case of $%s, estimated %v", job.ID, job.Status, job.Cost, job.EstCost, job.UsageEstimated)
		}
		total += job.Cost
	}
	if len(named) != 0 {
		t.Fatalf("the SDK was told of jobs llmq does not list: %v", named)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		d, err := a.Budgets.Status(t.Context(), a.Account(tenant))
		return err == nil && d.Spent == total && d.Reserved == 0
	})
}
