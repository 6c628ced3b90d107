// Package client is the Go client of llmq's HTTP API, and its wire types:
// the server renders its answers into these very types, so the two cannot
// drift apart. Files and batches have OpenAI's shapes. Times are Unix
// seconds; a time that has not happened yet is null (a nil pointer).
package client

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Job is a job as GET /v1/jobs/{id} shows it.
type Job struct {
	ID     string `json:"id"`
	Object string `json:"object"` // "job"
	// CustomID is the caller's own id of the job, null when it gave none.
	CustomID *string `json:"custom_id"`
	Endpoint string  `json:"endpoint"` // "/v1/chat/completions", "/v1/responses" or "/v1/embeddings"
	Model    string  `json:"model"`
	// ServedBy is the model and deployment that answered; null until one did.
	ServedBy *JobServedBy `json:"served_by"`
	// Fallbacks are the job's own fallback models, when it named some.
	Fallbacks []string `json:"fallbacks,omitempty"`
	// Status is queued, running, waiting, deferred, succeeded, failed or cancelled.
	Status string `json:"status"`
	// Priority is the queue the job runs in: critical, default, low or batch.
	Priority string `json:"priority"`
	// BatchID is the batch the job is a line of, null outside a batch.
	BatchID *string `json:"batch_id"`
	// Attempts counts provider calls; RateLimited the 429s among them.
	Attempts    int    `json:"attempts"`
	RateLimited int    `json:"rate_limited"`
	CreatedAt   int64  `json:"created_at"`
	StartedAt   *int64 `json:"started_at"`
	FinishedAt  *int64 `json:"finished_at"`
	// NextRunAt is when a waiting or deferred job is due.
	NextRunAt *int64 `json:"next_run_at"`
	// Response is the provider's answer, once there is one.
	Response *JobResponse `json:"response"`
	// Error says why a job failed.
	Error *ErrorObject `json:"error"`
	// Usage is set once the job succeeded.
	Usage      *JobUsage         `json:"usage"`
	CostUSD    float64           `json:"cost_usd"`
	Estimate   JobEstimate       `json:"estimate"`
	WebhookURL *string           `json:"webhook_url"`
	Metadata   map[string]string `json:"metadata"`
	// Sync is true for a request answered on its connection
	// (POST /v1/chat/completions or /v1/embeddings).
	Sync bool `json:"sync"`
}

// JobServedBy is where a job's answer came from.
type JobServedBy struct {
	Model      string `json:"model"`
	Deployment string `json:"deployment"`
}

// JobResponse is a provider's HTTP answer to a job: the same object as the
// "response" of a batch output line.
type JobResponse struct {
	StatusCode int    `json:"status_code"`
	RequestID  string `json:"request_id"`
	// Body is the provider's JSON body, unchanged.
	Body json.RawMessage `json:"body"`
}

// JobUsage is the tokens a job used, as the provider counted them.
type JobUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// Estimated is set when the provider said nothing believable of its
	// usage: these are llmq's worst case, and so is the cost.
	Estimated bool `json:"estimated,omitempty"`
}

// JobEstimate is what llmq reckoned a job may cost at most when it was
// admitted: the prompt by tokenizer, max_tokens, and the worst-case price.
type JobEstimate struct {
	PromptTokens int64   `json:"prompt_tokens"`
	MaxTokens    int64   `json:"max_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

// Tenant is a tenant as the admin API shows it.
type Tenant struct {
	ID     string `json:"id"`
	Object string `json:"object"` // "tenant"
	Name   string `json:"name"`
	Tier   string `json:"tier"`
	// DailyBudgetUSD is the tenant's own budget; null means the tier's.
	DailyBudgetUSD *float64 `json:"daily_budget_usd"`
	APIExempt      bool     `json:"api_exempt"`
	// WebhookSecret signs the tenant's webhooks. It is shown when the
	// tenant is created or read alone, never in lists.
	WebhookSecret string `json:"webhook_secret,omitempty"`
	// WebhookSecretPreviousExpiresAt is when the previous secret stops
	// signing beside WebhookSecret after a rotation; absent once it has.
	WebhookSecretPreviousExpiresAt *int64 `json:"webhook_secret_previous_expires_at,omitempty"`
	CreatedAt                      int64  `json:"created_at"`
	UpdatedAt                      int64  `json:"updated_at"`
}

// APIKey is a tenant's API key. Key, the plaintext, is only in the answer
// that creates it: llmq stores a hash.
type APIKey struct {
	ID       string `json:"id"`
	Object   string `json:"object"` // "api_key"
	Key      string `json:"key,omitempty"`
	Prefix   string `json:"prefix"`
	TenantID string `json:"tenant_id"`
	// APIExempt frees the key from its tier's API rate limit.
	APIExempt bool   `json:"api_exempt"`
	CreatedAt int64  `json:"created_at"`
	RevokedAt *int64 `json:"revoked_at"`
}

// Usage is a tenant's spend today (GET /v1/usage).
type Usage struct {
	Object      string  `json:"object"` // "usage"
	Tenant      string  `json:"tenant"`
	Tier        string  `json:"tier"`
	Day         string  `json:"day"` // YYYY-MM-DD in the tier's timezone
	SpentUSD    float64 `json:"spent_usd"`
	ReservedUSD float64 `json:"reserved_usd"`
	// BudgetUSD and RemainingUSD are null for an unlimited tier.
	BudgetUSD        *float64 `json:"budget_usd"`
	RemainingUSD     *float64 `json:"remaining_usd"`
	SoftLimitReached bool     `json:"soft_limit_reached"`
	ResetsAt         int64    `json:"resets_at"`
}

// UsageReport is spend per tenant and model on one day (GET /admin/v1/usage).
type UsageReport struct {
	Object       string           `json:"object"` // "usage_report"
	Day          string           `json:"day"`
	Data         []UsageReportRow `json:"data"`
	TotalCostUSD float64          `json:"total_cost_usd"`
}

// UsageReportRow is one tenant's spend on one model.
type UsageReportRow struct {
	TenantID         string  `json:"tenant_id"`
	Model            string  `json:"model"`
	Requests         int64   `json:"requests"`
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	CostUSD          float64 `json:"cost_usd"`
}

// List is OpenAI's list shape. Pages go newest first; the next page is asked
// for with ?after=<LastID> while HasMore.
type List[T any] struct {
	Object  string  `json:"object"` // "list"
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

// NewList returns the list of one page; id gives each item's id.
func NewList[T any](data []T, hasMore bool, id func(T) string) List[T] {
	if data == nil {
		data = []T{} // "data": [] rather than null, as OpenAI sends
	}
	l := List[T]{Object: "list", Data: data, HasMore: hasMore}
	if len(data) > 0 {
		first, last := id(data[0]), id(data[len(data)-1])
		l.FirstID, l.LastID = &first, &last
	}
	return l
}

// ErrorObject is OpenAI's error object. An empty Code or Param is sent as
// null, as OpenAI does, and null reads back as "". A code sent as a number
// (some OpenAI-compatible servers do) reads as its digits.
type ErrorObject struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    Code   `json:"code"`
	Param   string `json:"param"`
}

// MarshalJSON writes {"message","type","code","param"} with null for an
// empty code or param.
func (e ErrorObject) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
		Param   *string `json:"param"`
	}{e.Message, e.Type, nullable(string(e.Code)), nullable(e.Param)})
}

// UnmarshalJSON reads {"message","type","code","param"}; code may be a
// string, a number or null.
func (e *ErrorObject) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var o struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
		Param   *string         `json:"param"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	*e = ErrorObject{Message: o.Message, Type: o.Type, Code: Code(codeText(o.Code))}
	if o.Param != nil {
		e.Param = *o.Param
	}
	return nil
}

// codeText is an error code as text: "" for null or none, a number's
// integer digits, anything else as fmt prints it.
func codeText(raw json.RawMessage) string {
	var code any
	if json.Unmarshal(raw, &code) != nil || code == nil {
		return ""
	}
	if n, ok := code.(float64); ok {
		return strconv.Itoa(int(n))
	}
	return fmt.Sprint(code)
}

// Error is an error answer of the API: {"error":{"message","type","code","param"}}
// in the body, and the HTTP status beside it.
type Error struct {
	// StatusCode is the HTTP status of the answer; it is not in the body.
	StatusCode int `json:"-"`
	// RetryAfter is the answer's Retry-After header (a 429's), 0 without one.
	RetryAfter time.Duration `json:"-"`
	ErrorObject
}

// Error implements error.
func (e *Error) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("llmq: %d %s: %s", e.StatusCode, e.Code, e.Message)
	}
	return fmt.Sprintf("llmq: %d: %s", e.StatusCode, e.Message)
}

// errorBody is the body of an error answer.
type errorBody struct {
	Error ErrorObject `json:"error"`
}

// MarshalJSON writes the body of an error answer.
func (e Error) MarshalJSON() ([]byte, error) { return json.Marshal(errorBody{e.ErrorObject}) }

// UnmarshalJSON reads the body of an error answer.
func (e *Error) UnmarshalJSON(b []byte) error {
	var body errorBody
	err := json.Unmarshal(b, &body)
	if err == nil {
		e.ErrorObject = body.Error
	}
	return err
}

// File is an uploaded or generated file, in OpenAI's shape.
type File struct {
	ID        string `json:"id"`
	Object    string `json:"object"` // "file"
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	// Purpose is "batch" for an uploaded batch input, "batch_output" for a
	// batch's results and its errors.
	Purpose string `json:"purpose"`
	// Status is "processed": a file is usable as soon as it is stored.
	Status string `json:"status"`
}

// FileDeleted answers DELETE /v1/files/{id}.
type FileDeleted struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "file"
	Deleted bool   `json:"deleted"`
}

// Batch is an OpenAI-style batch.
type Batch struct {
	ID       string `json:"id"`
	Object   string `json:"object"` // "batch"
	Endpoint string `json:"endpoint"`
	// Errors says why a batch that failed validation was refused; lines
	// refused one by one are in the error file.
	Errors           *BatchErrors `json:"errors"`
	InputFileID      string       `json:"input_file_id"`
	CompletionWindow string       `json:"completion_window"`
	// Status is validating, failed, in_progress, finalizing, completed,
	// expired, cancelling or cancelled.
	Status        string             `json:"status"`
	OutputFileID  *string            `json:"output_file_id"`
	ErrorFileID   *string            `json:"error_file_id"`
	CreatedAt     int64              `json:"created_at"`
	InProgressAt  *int64             `json:"in_progress_at"`
	ExpiresAt     *int64             `json:"expires_at"`
	FinalizingAt  *int64             `json:"finalizing_at"`
	CompletedAt   *int64             `json:"completed_at"`
	FailedAt      *int64             `json:"failed_at"`
	ExpiredAt     *int64             `json:"expired_at"`
	CancellingAt  *int64             `json:"cancelling_at"`
	CancelledAt   *int64             `json:"cancelled_at"`
	RequestCounts BatchRequestCounts `json:"request_counts"`
	Metadata      map[string]string  `json:"metadata"`
}

// BatchErrors is the "errors" list of a batch.
type BatchErrors struct {
	Object string       `json:"object"` // "list"
	Data   []BatchError `json:"data"`
}

// BatchError is one reason a batch's input was refused.
type BatchError struct {
	Code    Code    `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	// Line is the 1-based line of the input file, null for the whole file.
	Line *int `json:"line"`
}

// BatchRequestCounts count a batch's requests: Completed succeeded, Failed
// did not (refused at validation, failed, or never run), of Total lines.
type BatchRequestCounts struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

// BatchRequest is one line of a batch input file.
type BatchRequest struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"` // "POST"
	URL      string          `json:"url"`    // the batch's endpoint
	Body     json.RawMessage `json:"body"`
}

// BatchResult is one line of a batch's output or error file. Response is
// null for a request that got no answer from the provider; Error is null for
// a success.
type BatchResult struct {
	ID       string          `json:"id"` // "batch_req_…"
	CustomID string          `json:"custom_id"`
	Response *JobResponse    `json:"response"`
	Error    *BatchLineError `json:"error"`
}

// BatchLineError is the error of an error file line: OpenAI's code and
// message, and the 1-based line of the input file it answers (an llmq
// addition, as in BatchError).
type BatchLineError struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
