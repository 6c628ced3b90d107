package batch

import (
	"encoding/json"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/store"
)

// Counts are a batch's request counts, from its jobs: completed succeeded;
// failed were refused at validation, failed, or cancelled or expired before
// they ran; total is every request line (known once validation ends; until
// then the lines stored so far).
func Counts(b *store.Batch, c *store.JobCounts) client.BatchRequestCounts {
	return client.BatchRequestCounts{
		Total:     max(b.Total, c.Total),
		Completed: c.Succeeded,
		Failed:    c.Failed + c.Cancelled,
	}
}

// Render is a batch as the API shows it and its webhook delivers it.
func Render(b *store.Batch, c *store.JobCounts) client.Batch {
	out := client.Batch{
		ID: b.ID, Object: "batch", Endpoint: b.Endpoint, InputFileID: b.InputFileID, CompletionWindow: b.CompletionWindow,
		Status: string(b.Status), OutputFileID: strPtr(b.OutputFileID), ErrorFileID: strPtr(b.ErrorFileID),
		CreatedAt: b.CreatedAt.Unix(), InProgressAt: unixPtr(b.InProgressAt), ExpiresAt: unixPtr(b.ExpiresAt),
		FinalizingAt: unixPtr(b.FinalizingAt), CompletedAt: unixPtr(b.CompletedAt), FailedAt: unixPtr(b.FailedAt),
		ExpiredAt: unixPtr(b.ExpiredAt), CancellingAt: unixPtr(b.CancellingAt), CancelledAt: unixPtr(b.CancelledAt),
		RequestCounts: Counts(b, c),
	}
	if len(b.Errors) > 0 {
		var errs client.BatchErrors
		if json.Unmarshal(b.Errors, &errs) == nil {
			out.Errors = &errs
		}
	}
	if len(b.Metadata) > 0 {
		_ = json.Unmarshal(b.Metadata, &out.Metadata) // written from a map[string]string
	}
	return out
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
