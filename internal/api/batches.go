package api

import (
	"errors"
	"net/http"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// BatchOptions configure the Files and Batch APIs (LLMQ_MAX_FILE_BYTES and
// LLMQ_MAX_FILE_LINES, each at least 1).
type BatchOptions struct {
	MaxFileBytes int64 // caps an uploaded file
	MaxFileLines int   // caps the lines of an uploaded file
}

// batchAPI serves the Files and Batch APIs.
type batchAPI struct {
	*Server
	batches *batch.Service
	limits  BatchOptions
}

// EnableBatches serves OpenAI's Files and Batch APIs (/v1/files,
// /v1/batches), validating and running batches with svc.
func (s *Server) EnableBatches(svc *batch.Service, opts BatchOptions) {
	a := &batchAPI{Server: s, batches: svc, limits: opts}
	t := s.tenantRoute
	s.mux.Handle("POST /v1/files", t("files.create", a.uploadFile))
	s.mux.Handle("GET /v1/files", t("files.list", a.listFiles))
	s.mux.Handle("GET /v1/files/{id}", t("files.retrieve", a.getFile))
	s.mux.Handle("GET /v1/files/{id}/content", t("files.content", a.fileContent))
	s.mux.Handle("DELETE /v1/files/{id}", t("files.delete", a.deleteFile))
	s.mux.Handle("POST /v1/batches", t("batches.create", a.createBatch))
	s.mux.Handle("GET /v1/batches", t("batches.list", a.listBatches))
	s.mux.Handle("GET /v1/batches/{id}", t("batches.retrieve", a.getBatch))
	s.mux.Handle("POST /v1/batches/{id}/cancel", t("batches.cancel", a.cancelBatch))
}

// createBatch checks what can be checked at once (the file, the endpoint,
// the window) and answers with the batch validating; its lines are checked
// in the background, as at OpenAI.
func (s *batchAPI) createBatch(w http.ResponseWriter, r *http.Request) error {
	c := callerOf(r)
	var req client.BatchCreateParams // OpenAI's fields, and webhook_url, called once when the batch ends
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &req, false); err != nil {
		return err
	}
	switch {
	case req.InputFileID == "":
		return wire.Invalid("input_file_id", client.CodeMissingRequiredParameter, "input_file_id is required: the id of a file uploaded with purpose 'batch'.")
	case req.Endpoint == "":
		return wire.Invalid("endpoint", client.CodeMissingRequiredParameter, "endpoint is required: %s.", llm.EndpointList)
	case !llm.KnownEndpoint(req.Endpoint):
		return wire.Invalid("endpoint", client.CodeInvalidValue, "endpoint must be %s, got '%.100s'.", llm.EndpointList, req.Endpoint)
	case req.CompletionWindow != batch.CompletionWindow:
		return wire.Invalid("completion_window", client.CodeInvalidValue, "completion_window must be '%s', got '%.20s'.", batch.CompletionWindow, req.CompletionWindow)
	}
	meta, err := validateMetadata(req.Metadata)
	if err != nil {
		return err
	}
	if err := s.validateWebhookURL(req.WebhookURL); err != nil {
		return err
	}
	f, err := callersByID(r, req.InputFileID, ids.File, "file", s.Store.FileGetForTenant)
	var missing *wire.Error // the 404 of an id that names no file of the caller
	if errors.As(err, &missing) {
		missing.Param = "input_file_id"
	}
	if err != nil {
		return err
	}
	switch {
	case f.Purpose != store.FilePurposeBatch:
		return wire.Invalid("input_file_id", client.CodeInvalidFilePurpose, "File %s has purpose '%s'; a batch's input has purpose 'batch'.", f.ID, wire.File(f).Purpose)
	case f.Bytes > s.limits.MaxFileBytes:
		return wire.Invalid("input_file_id", client.CodeFileTooLarge, "File %s has %d bytes, more than the limit of %d.", f.ID, f.Bytes, s.limits.MaxFileBytes)
	case f.Lines > int64(s.limits.MaxFileLines):
		return wire.Invalid("input_file_id", client.CodeTooManyLines, "File %s has %d lines, more than the limit of %d.", f.ID, f.Lines, s.limits.MaxFileLines)
	case f.Bytes == 0:
		return wire.Invalid("input_file_id", client.CodeEmptyFile, "File %s is empty.", f.ID)
	}
	b, err := s.Store.BatchInsert(r.Context(), &store.BatchInsertParams{TenantID: c.tenant.ID, InputFileID: f.ID,
		Endpoint: req.Endpoint, CompletionWindow: req.CompletionWindow, Metadata: meta,
		ExpiresAt: s.opts.Now().Add(batch.Window), WebhookURL: req.WebhookURL})
	if err != nil {
		return err
	}
	s.Logger.Info("batch created", "tenant", c.tenant.ID, "batch", b.ID, "file", f.ID, "lines", f.Lines)
	s.batches.Start(b.ID)
	return writeOK(w, wire.Batch(b, &store.JobCounts{}))
}

// writeBatch answers b with its live request counts.
func (s *batchAPI) writeBatch(w http.ResponseWriter, r *http.Request, b *store.Batch) error {
	c, err := s.Store.JobCountsByBatch(r.Context(), b.ID)
	if err != nil {
		return err
	}
	return writeOK(w, wire.Batch(b, c))
}

func (s *batchAPI) getBatch(w http.ResponseWriter, r *http.Request) error {
	b, err := callersByID(r, r.PathValue("id"), ids.Batch, "batch", s.Store.BatchGetForTenant)
	if err != nil {
		return err
	}
	return s.writeBatch(w, r, b)
}

// listBatches pages at most 100 batches, as OpenAI does: each one's counts
// are one query.
func (s *batchAPI) listBatches(w http.ResponseWriter, r *http.Request) error {
	limit, after, err := listPage(r.URL.Query(), 100, ids.Batch, "batch")
	if err != nil {
		return err
	}
	bs, more, err := s.Store.BatchList(r.Context(), &store.BatchListParams{TenantID: callerOf(r).tenant.ID, After: after, Limit: limit})
	if err != nil {
		return err
	}
	out := make([]client.Batch, len(bs))
	for i, b := range bs {
		c, err := s.Store.JobCountsByBatch(r.Context(), b.ID)
		if err != nil {
			return err
		}
		out[i] = wire.Batch(b, c)
	}
	return writeOK(w, client.NewList(out, more, func(b client.Batch) string { return b.ID }))
}

// cancelBatch moves the batch to cancelling and cancels its pending jobs at
// once; running ones finish, and the sweeper ends the batch as cancelled,
// with the results of what ran. Cancelling twice is harmless.
func (s *batchAPI) cancelBatch(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, ids.Batch, "batch")
	if err != nil {
		return err
	}
	tenantID := callerOf(r).tenant.ID
	b, changed, err := s.Store.BatchSetStatus(r.Context(), &store.BatchSetStatusParams{ID: id, TenantID: tenantID,
		From: []store.BatchStatus{store.BatchValidating, store.BatchInProgress}, To: store.BatchCancelling})
	if err != nil {
		return missingAs(err, "batch", id)
	}
	if !changed && b.Status != store.BatchCancelling && b.Status != store.BatchCancelled {
		return wire.Errorf(http.StatusConflict, wire.TypeInvalidRequest, client.CodeBatchNotCancellable, "",
			"Batch %s is %s and cannot be cancelled.", b.ID, b.Status)
	}
	if changed {
		// The sweeper repeats this until the batch is cancelled; doing it
		// now stops the pending jobs before the answer.
		n, err := s.Store.JobCancelByBatch(r.Context(), b.ID)
		if err != nil {
			s.Logger.Warn("cancel batch jobs failed; the sweeper will retry", "batch", b.ID, "err", err)
		}
		s.Logger.Info("batch cancelling", "tenant", tenantID, "batch", b.ID, "jobs_cancelled", n)
	}
	return s.writeBatch(w, r, b)
}
