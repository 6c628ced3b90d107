package api

import (
	"encoding/json"
	"time"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
)

// jobJSON is a job as clients see it. Times are Unix seconds, as in
// OpenAI's objects.
type jobJSON struct {
	ID          string          `json:"id"`
	Object      string          `json:"object"`
	CustomID    *string         `json:"custom_id"`
	Endpoint    string          `json:"endpoint"`
	Model       string          `json:"model"`
	Status      string          `json:"status"`
	Priority    string          `json:"priority"`
	BatchID     *string         `json:"batch_id"`
	Attempts    int             `json:"attempts"`
	RateLimited int             `json:"rate_limited"`
	CreatedAt   int64           `json:"created_at"`
	StartedAt   *int64          `json:"started_at"`
	FinishedAt  *int64          `json:"finished_at"`
	NextRunAt   *int64          `json:"next_run_at"`
	Response    *responseJSON   `json:"response"`
	Error       *store.JobError `json:"error"`
	Usage       *usageJSON      `json:"usage"`
	CostUSD     float64         `json:"cost_usd"`
	Estimate    estimateJSON    `json:"estimate"`
	WebhookURL  *string         `json:"webhook_url"`
	Metadata    json.RawMessage `json:"metadata"`
}

type responseJSON struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type usageJSON struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type estimateJSON struct {
	PromptTokens int64   `json:"prompt_tokens"`
	MaxTokens    int64   `json:"max_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

func unix(t time.Time) int64 { return t.Unix() }

func unixPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	u := t.Unix()
	return &u
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func renderJob(j *store.Job) jobJSON {
	out := jobJSON{
		ID: j.ID, Object: "job", CustomID: strPtr(j.CustomID), Endpoint: j.Endpoint, Model: j.Model,
		Status: string(j.Status), Priority: j.Queue, BatchID: strPtr(j.BatchID), Attempts: j.Attempts,
		RateLimited: j.RateLimited, CreatedAt: unix(j.CreatedAt), StartedAt: unixPtr(j.StartedAt),
		FinishedAt: unixPtr(j.FinishedAt), NextRunAt: unixPtr(j.NextRunAt), Error: j.Error,
		CostUSD:    j.Cost.USD(),
		Estimate:   estimateJSON{PromptTokens: j.EstPromptTokens, MaxTokens: j.EstMaxTokens, CostUSD: j.EstCost.USD()},
		WebhookURL: strPtr(j.WebhookURL), Metadata: j.Metadata,
	}
	if len(out.Metadata) == 0 {
		out.Metadata = json.RawMessage("null")
	}
	if j.ResponseStatus != 0 && len(j.ResponseBody) > 0 {
		out.Response = &responseJSON{StatusCode: j.ResponseStatus, RequestID: j.ProviderRequestID, Body: j.ResponseBody}
	}
	if j.Status == store.JobSucceeded {
		out.Usage = &usageJSON{PromptTokens: j.PromptTokens, CompletionTokens: j.CompletionTokens, TotalTokens: j.TotalTokens}
	}
	return out
}

// usd renders an amount of money for JSON.
func usd(m money.Micros) float64 { return m.USD() }
