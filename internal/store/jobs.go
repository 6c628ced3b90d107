package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/money"
)

// JobStatus is where a job is in its life; no method moves a job out of a
// terminal one.
type JobStatus string

// Job statuses.
const (
	JobQueued    JobStatus = "queued"    // in a queue, waiting for a worker
	JobRunning   JobStatus = "running"   // a worker has it
	JobWaiting   JobStatus = "waiting"   // backing off (rate limit, retry) until NextRunAt
	JobDeferred  JobStatus = "deferred"  // over budget until NextRunAt (the budget reset)
	JobSucceeded JobStatus = "succeeded" // terminal
	JobFailed    JobStatus = "failed"    // terminal
	JobCancelled JobStatus = "cancelled" // terminal
)

// Terminal reports whether s is final.
func (s JobStatus) Terminal() bool {
	return s == JobSucceeded || s == JobFailed || s == JobCancelled
}

// Valid reports whether s is a known status.
func (s JobStatus) Valid() bool {
	return s == JobQueued || s == JobRunning || s == JobWaiting || s == JobDeferred || s.Terminal()
}

// The partial indexes' predicates, verbatim so both planners can use them.
const (
	unfinishedSQL = `status IN ('queued', 'running', 'waiting', 'deferred')`
	pendingSQL    = `status IN ('queued', 'waiting', 'deferred')`
)

// JobError is a job's error in OpenAI's shape, stored as the API writes it.
type JobError = client.ErrorObject

// Job is one LLM request and everything that happened to it.
type Job struct {
	ID       string
	TenantID string
	BatchID  string // "" when the job is not part of a batch
	LineNo   int    // the line of the batch input file; 0 outside a batch
	CustomID string
	Endpoint string          // "/v1/chat/completions" or "/v1/embeddings"
	Model    string          // as the client named it
	Request  json.RawMessage // the client's body
	Queue    string
	Status   JobStatus

	Attempts    int // provider calls made (counted when their outcome is recorded)
	RateLimited int // 429s seen; not failures, but capped

	EstPromptTokens int64
	EstMaxTokens    int64
	EstCost         money.Micros

	ResponseStatus    int             // the provider's HTTP status; 0 before any response
	ResponseBody      json.RawMessage // the provider's body
	ProviderRequestID string
	Error             *JobError

	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64
	TotalTokens      int64
	Cost             money.Micros

	WebhookURL     string
	Metadata       json.RawMessage
	IdempotencyKey string

	CreatedAt  time.Time
	StartedAt  *time.Time // first start
	FinishedAt *time.Time // when it became terminal
	UpdatedAt  time.Time
	NextRunAt  *time.Time // when a waiting or deferred job is due

	// Sync is a request answered on its connection, without an asynq task.
	Sync bool
	// UsageEstimated: the answer's usage was not believable, so usage and
	// cost are the reservation's worst case.
	UsageEstimated bool
	// Deployment (provider/upstream) answered the job, for ServedModel
	// (Model or a fallback); "" until a provider answered.
	Deployment, ServedModel string
	// Fallbacks are the job's own fallback models, in place of its model's.
	Fallbacks []string
	// BatchPartID is the job's part while it runs on the provider's Batch API.
	BatchPartID string
}

const jobColumns = `id, tenant_id, batch_id, line_no, custom_id, endpoint, model, request, queue, status,
	attempts, rate_limited, est_prompt_tokens, est_max_tokens, est_cost_micros,
	response_status, response_body, provider_request_id, error,
	prompt_tokens, completion_tokens, cached_tokens, total_tokens, cost_micros,
	webhook_url, metadata, idempotency_key, created_at, started_at, finished_at, updated_at, next_run_at, sync, usage_estimated,
	deployment, served_model, fallbacks, batch_part_id`

// jobViewColumns are jobColumns without the request body, which the API
// never renders.
var jobViewColumns = strings.Replace(jobColumns, " request,", " NULL AS request,", 1)

func scanJob(r row) (*Job, error) {
	var j Job
	var errJSON []byte
	var fallbacks string
	err := r.Scan(&j.ID, &j.TenantID, orZero[string]{&j.BatchID}, orZero[int]{&j.LineNo}, orZero[string]{&j.CustomID},
		&j.Endpoint, &j.Model, (*[]byte)(&j.Request), &j.Queue, &j.Status,
		&j.Attempts, &j.RateLimited, &j.EstPromptTokens, &j.EstMaxTokens, &j.EstCost,
		orZero[int]{&j.ResponseStatus}, (*[]byte)(&j.ResponseBody), orZero[string]{&j.ProviderRequestID}, &errJSON,
		&j.PromptTokens, &j.CompletionTokens, &j.CachedTokens, &j.TotalTokens, &j.Cost,
		orZero[string]{&j.WebhookURL}, (*[]byte)(&j.Metadata), orZero[string]{&j.IdempotencyKey},
		timeCol{&j.CreatedAt}, nullTimeCol{&j.StartedAt}, nullTimeCol{&j.FinishedAt}, timeCol{&j.UpdatedAt}, nullTimeCol{&j.NextRunAt},
		&j.Sync, &j.UsageEstimated, &j.Deployment, &j.ServedModel, &fallbacks, orZero[string]{&j.BatchPartID})
	if err != nil {
		return nil, err
	}
	if errJSON != nil {
		j.Error = new(JobError)
		if err := json.Unmarshal(errJSON, j.Error); err != nil {
			return nil, fmt.Errorf("store: job %s: error column: %w", j.ID, err)
		}
	}
	if fallbacks != "" {
		// Model names hold no spaces (config.checkModelName).
		j.Fallbacks = strings.Fields(fallbacks)
	}
	return &j, nil
}

func errorJSON(e *JobError) any {
	if e == nil {
		return nil
	}
	b, _ := json.Marshal(e) // four strings: cannot fail
	return string(withoutNUL(b))
}
