package wire

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
)

// Job is a job as clients see it; its webhook delivers the same object.
func Job(j *store.Job) client.Job {
	out := client.Job{
		ID: j.ID, Object: "job", CustomID: strPtr(j.CustomID), Endpoint: j.Endpoint, Model: j.Model,
		Status: string(j.Status), Priority: j.Queue, BatchID: strPtr(j.BatchID), Attempts: j.Attempts,
		RateLimited: j.RateLimited, CreatedAt: j.CreatedAt.Unix(), StartedAt: unixPtr(j.StartedAt),
		FinishedAt: unixPtr(j.FinishedAt), NextRunAt: unixPtr(j.NextRunAt), Error: jobError(j.Error),
		CostUSD:    j.Cost.USD(),
		Estimate:   client.JobEstimate{PromptTokens: j.EstPromptTokens, MaxTokens: j.EstMaxTokens, CostUSD: j.EstCost.USD()},
		WebhookURL: strPtr(j.WebhookURL), Metadata: metadataMap(j.Metadata), Sync: j.Sync, Fallbacks: j.Fallbacks,
		Usage: JobUsage(j),
	}
	if j.Deployment != "" {
		out.ServedBy = &client.JobServedBy{Model: cmp.Or(j.ServedModel, j.Model), Deployment: j.Deployment}
	}
	if j.ResponseStatus != 0 && len(j.ResponseBody) > 0 {
		out.Response = &client.JobResponse{StatusCode: j.ResponseStatus, RequestID: j.ProviderRequestID, Body: j.ResponseBody}
	}
	return out
}

// JobUsage is the usage of the call j was charged for: a job that
// succeeded, or one that ended otherwise (cancelled or failed while its
// call ran) and was charged for it. Nil for a job never charged.
func JobUsage(j *store.Job) *client.JobUsage {
	if j.Status != store.JobSucceeded && j.Cost == 0 && j.TotalTokens == 0 {
		return nil
	}
	return &client.JobUsage{PromptTokens: j.PromptTokens, CompletionTokens: j.CompletionTokens, TotalTokens: j.TotalTokens,
		Estimated: j.UsageEstimated}
}

// jobError is a copy of a job's error, so the rendered job shares nothing
// with the stored one.
func jobError(e *store.JobError) *ErrorObject {
	if e == nil {
		return nil
	}
	c := *e
	return &c
}

// Batch is a batch as the API shows it and its webhook delivers it, with
// its request counts from its jobs c: completed succeeded; failed were
// refused at validation, failed, or cancelled or expired before they ran;
// total is every request line (known once validation ends; until then the
// lines stored so far).
func Batch(b *store.Batch, c *store.JobCounts) client.Batch {
	out := client.Batch{
		ID: b.ID, Object: "batch", Endpoint: b.Endpoint, InputFileID: b.InputFileID, CompletionWindow: b.CompletionWindow,
		Status: string(b.Status), OutputFileID: strPtr(b.OutputFileID), ErrorFileID: strPtr(b.ErrorFileID),
		CreatedAt: b.CreatedAt.Unix(), InProgressAt: unixPtr(b.InProgressAt), ExpiresAt: unixPtr(b.ExpiresAt),
		FinalizingAt: unixPtr(b.FinalizingAt), CompletedAt: unixPtr(b.CompletedAt), FailedAt: unixPtr(b.FailedAt),
		ExpiredAt: unixPtr(b.ExpiredAt), CancellingAt: unixPtr(b.CancellingAt), CancelledAt: unixPtr(b.CancelledAt),
		RequestCounts: client.BatchRequestCounts{Total: max(b.Total, c.Total), Completed: c.Succeeded, Failed: c.Failed + c.Cancelled},
		Metadata:      metadataMap(b.Metadata),
	}
	if len(b.Errors) > 0 {
		var errs client.BatchErrors
		if json.Unmarshal(b.Errors, &errs) == nil {
			out.Errors = &errs
		}
	}
	return out
}

// BatchResult is the output or error file line of a job of a batch that
// ended as final: OpenAI's {"id","custom_id","response","error"}.
func BatchResult(j *store.Job, final store.BatchStatus) client.BatchResult {
	// The request's id ("batch_req_…") is made from its job's.
	r := client.BatchResult{ID: "batch_req_" + strings.TrimPrefix(j.ID, ids.Job), CustomID: j.CustomID}
	if j.ResponseStatus != 0 {
		r.Response = &client.JobResponse{StatusCode: j.ResponseStatus, RequestID: j.ProviderRequestID, Body: j.ResponseBody}
		if len(j.ResponseBody) == 0 && j.Error != nil {
			// The provider's error body is not kept; its error is, in
			// the same shape as OpenAI's body {"error": {...}}.
			r.Response.Body = ErrorBody(*j.Error)
		}
	}
	if j.Status != store.JobSucceeded {
		r.Error = batchLineError(j, final)
	}
	return r
}

// batchLineError is why a request of the error file has no result.
func batchLineError(j *store.Job, final store.BatchStatus) *client.BatchLineError {
	e := &client.BatchLineError{Line: j.LineNo}
	switch {
	case j.Error != nil:
		e.Code, e.Message = j.Error.Code, j.Error.Message
		if e.Code == "" {
			e.Code = client.Code(j.Error.Type)
		}
	case j.Status == store.JobCancelled && final == store.BatchExpired:
		e.Code, e.Message = client.CodeBatchExpired, "This request could not be executed before the completion window expired."
	case j.Status == store.JobCancelled && final == store.BatchCancelled:
		e.Code, e.Message = client.CodeBatchCancelled, "This request was not executed: the batch was cancelled."
	case j.Status == store.JobCancelled && final == store.BatchFailed:
		e.Code, e.Message = client.CodeBatchFailed, "This request was not executed: the batch failed before it ran (see the batch's errors)."
	case j.Status == store.JobCancelled:
		e.Code, e.Message = client.CodeRequestCancelled, "This request was cancelled."
	default:
		e.Code, e.Message = client.CodeNotFinished, fmt.Sprintf("This request had not finished (%s).", j.Status)
	}
	if e.Code == "" {
		e.Code = client.CodeRequestFailed
	}
	return e
}

// File is a file in OpenAI's shape. A batch's error file has purpose
// "batch_output", as at OpenAI; llmq keeps the two apart inside.
func File(f *store.File) client.File {
	purpose := string(f.Purpose)
	if f.Purpose == store.FilePurposeBatchError {
		purpose = string(store.FilePurposeBatchOutput)
	}
	return client.File{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), Filename: f.Filename,
		Purpose: purpose, Status: "processed"}
}

// FileDeleted answers the deletion of f.
func FileDeleted(f *store.File) client.FileDeleted {
	return client.FileDeleted{ID: f.ID, Object: "file", Deleted: true}
}

// Tenant is a tenant as the admin API shows it; its webhook secret only
// withSecret (the answers about this one tenant, never lists).
func Tenant(t *store.Tenant, withSecret bool) client.Tenant {
	out := client.Tenant{ID: t.ID, Object: "tenant", Name: t.Name, Tier: t.Tier, APIExempt: t.APIExempt,
		CreatedAt: t.CreatedAt.Unix(), UpdatedAt: t.UpdatedAt.Unix()}
	if t.BudgetOverride != nil {
		v := t.BudgetOverride.USD()
		out.DailyBudgetUSD = &v
	}
	if withSecret {
		out.WebhookSecret = t.WebhookSecret
		if t.PreviousUntil != nil && t.PreviousUntil.After(time.Now()) {
			out.WebhookSecretPreviousExpiresAt = unixPtr(t.PreviousUntil)
		}
	}
	return out
}

// APIKey is a key without its plaintext (which only the answer creating it
// carries, set by the caller).
func APIKey(k *store.APIKey) client.APIKey {
	return client.APIKey{ID: k.ID, Object: "api_key", Prefix: k.Prefix, TenantID: k.TenantID, APIExempt: k.APIExempt,
		CreatedAt: k.CreatedAt.Unix(), RevokedAt: unixPtr(k.RevokedAt)}
}

// Usage is a tenant's spend today in its tier, from the budget's decision.
func Usage(tenantID, tier string, d *budget.Decision) client.Usage {
	out := client.Usage{Object: "usage", Tenant: tenantID, Tier: tier, Day: d.Day,
		SpentUSD: d.Spent.USD(), ReservedUSD: d.Reserved.USD(), SoftLimitReached: d.SoftLimitReached, ResetsAt: d.ResetsAt.Unix()}
	if !d.Unlimited {
		b, rem := d.Budget.USD(), d.Remaining.USD()
		out.BudgetUSD, out.RemainingUSD = &b, &rem
	}
	return out
}

// UsageReport is the ledger's spend per tenant and model on day.
func UsageReport(day string, rows []*store.UsageReportRow) client.UsageReport {
	out := make([]client.UsageReportRow, len(rows))
	var total money.Micros
	for i, u := range rows {
		out[i] = client.UsageReportRow{TenantID: u.TenantID, Model: u.Model, Requests: u.Requests, PromptTokens: u.PromptTokens,
			CompletionTokens: u.CompletionTokens, CostUSD: u.Cost.USD()}
		total += u.Cost
	}
	return client.UsageReport{Object: "usage_report", Day: day, Data: out, TotalCostUSD: total.USD()}
}

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

// metadataMap reads stored metadata (written from a map[string]string);
// anything else renders as null rather than failing the whole answer.
func metadataMap(raw json.RawMessage) map[string]string {
	var m map[string]string
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m
}
