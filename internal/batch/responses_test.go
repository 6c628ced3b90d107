package batch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/batch/batchtest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
)

// responsesLine is an input line to the Responses API: a string input, or
// items with text parts and instructions, every third line.
func responsesLine(customID string, i int) string {
	if i%3 == 0 {
		return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/responses","body":{"model":"gpt-4o-mini","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Say hi to %s"}]}],"max_output_tokens":20}}`,
			customID, customID)
	}
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/responses","body":{"model":"gpt-4o-mini","input":"Say hi to %s","max_output_tokens":20}}`,
		customID, customID)
}

// TestThousandResponsesLines: a 1,000-line batch of /v1/responses lines
// completes with every line's response object and usage in the output,
// each job charged its usage at the model's price; a line of another url,
// and one the Responses API refuses, are refused alone.
func TestThousandResponsesLines(t *testing.T) {
	t.Parallel()
	a := start(t, 4, nil)
	_, key := a.Tenant("standard")
	const n = 1_000
	var in strings.Builder
	for i := range n {
		id := fmt.Sprintf("r-%d", i)
		switch i {
		case 500:
			in.WriteString(batchtest.ChatLine(id) + "\n") // the batch's endpoint is /v1/responses
		case 700:
			in.WriteString(fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/responses","body":{"model":"gpt-4o-mini","input":[{"role":"wizard","content":"x"}]}}`, id) + "\n")
		default:
			in.WriteString(responsesLine(id, i) + "\n")
		}
	}
	fileID := upload(t, a, key, []byte(in.String()))
	b := createBatch(t, a, key, fileID, map[string]any{"endpoint": llm.EndpointResponses})
	b = waitStatus(t, a, key, b.ID, "completed", 3*time.Minute)
	if want := (client.BatchRequestCounts{Total: n, Completed: n - 2, Failed: 2}); b.RequestCounts != want {
		t.Fatalf("counts = %+v, want %+v", b.RequestCounts, want)
	}
	errs := results(t, a, key, *b.ErrorFileID)
	if len(errs) != 2 || errs[0].Error.Line != 501 || errs[0].Error.Code != client.CodeInvalidURL ||
		errs[1].Error.Line != 701 || !strings.Contains(errs[1].Error.Message, "input[0].role") {
		t.Fatalf("error file = %+v", errs)
	}

	jobs := map[string]*store.Job{}
	err := a.Store.JobStreamByBatch(context.Background(), b.ID, []store.JobStatus{store.JobSucceeded}, func(j *store.Job) error {
		jobs[j.CustomID] = j
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	price := money.Price{InputPerMTok: 150_000, OutputPerMTok: 600_000} // the policy's $0.15 and $0.60
	out := results(t, a, key, *b.OutputFileID)
	if len(out) != n-2 || len(jobs) != n-2 {
		t.Fatalf("output has %d lines, %d jobs succeeded; want %d", len(out), len(jobs), n-2)
	}
	for _, r := range out {
		var resp struct {
			Object string `json:"object"`
			Status string `json:"status"`
			Output []struct {
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
			} `json:"output"`
		}
		if r.Response == nil || r.Response.StatusCode != 200 || json.Unmarshal(r.Response.Body, &resp) != nil ||
			resp.Object != "response" || len(resp.Output) == 0 || len(resp.Output[0].Content) == 0 || resp.Output[0].Content[0].Text == "" {
			t.Fatalf("output line %s = %+v", r.CustomID, r)
		}
		u, err := llm.UsageOf(r.Response.Body)
		j := jobs[r.CustomID]
		if err != nil || j == nil || u.PromptTokens == 0 || u.CompletionTokens == 0 || u.CompletionTokens > 20 {
			t.Fatalf("line %s: usage %+v (%v), job %v", r.CustomID, u, err, j)
		}
		if j.PromptTokens != u.PromptTokens || j.CompletionTokens != u.CompletionTokens || j.Cost != price.Cost(money.Tokens{Prompt: u.PromptTokens, Cached: u.CachedTokens, Completion: u.CompletionTokens}) {
			t.Fatalf("line %s: job charged %d/%d $%s, answer says %+v", r.CustomID, j.PromptTokens, j.CompletionTokens, j.Cost, u)
		}
	}
}
