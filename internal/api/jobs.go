package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// createJobRequest is the body of POST /v1/jobs: client.JobCreateParams as
// it arrives, with Body the bytes that came.
type createJobRequest struct {
	CustomID   string            `json:"custom_id"`
	Endpoint   string            `json:"endpoint"`
	Body       json.RawMessage   `json:"body"`
	Priority   string            `json:"priority"`
	WebhookURL string            `json:"webhook_url"`
	Metadata   map[string]string `json:"metadata"`
	// Fallbacks are the job's own fallback models, from those its tier
	// allows, in place of its model's.
	Fallbacks []string `json:"fallbacks"`
}

func (s *Server) createJob(w http.ResponseWriter, r *http.Request) error {
	var req createJobRequest
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &req); err != nil {
		return err
	}
	job, replayed, err := s.submitJob(r, &req)
	if err != nil {
		return err
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, http.StatusAccepted, wire.Job(job))
	return nil
}

// submitJob admits a job of the caller (with the request's Idempotency-Key)
// and enqueues it; replayed is set when the key named an earlier job.
func (s *Server) submitJob(r *http.Request, req *createJobRequest) (job *store.Job, replayed bool, err error) {
	idemKey, err := idempotencyKey(r)
	if err != nil {
		return nil, false, err
	}
	job, admitted, err := s.admitJob(r.Context(), callerOf(r), req, idemKey, false)
	if err != nil {
		return nil, false, err
	}
	if admitted == nil {
		return job, true, nil
	}
	// The row is committed: if Redis refuses the task now, the reconciler
	// enqueues it later, so the client still gets its job.
	if _, err := s.Queue.EnqueueJob(r.Context(), admission.JobRef(callerOf(r).policy, job, callerOf(r).tier.Share)); err != nil {
		s.Logger.Warn("enqueue failed; the reconciler will retry", "job", job.ID, "err", err)
	}
	return job, false, nil
}

// idempotencyKey reads the Idempotency-Key header.
func idempotencyKey(r *http.Request) (string, error) {
	idemKey := r.Header.Get("Idempotency-Key")
	if len(idemKey) > 255 {
		return "", wire.Invalid("Idempotency-Key", client.CodeInvalidHeader, "Idempotency-Key is longer than 255 characters.")
	}
	if !utf8.ValidString(idemKey) || strings.IndexByte(idemKey, 0) >= 0 {
		return "", wire.Invalid("Idempotency-Key", client.CodeInvalidEncoding, "Idempotency-Key must be UTF-8 text without NUL characters.")
	}
	return idemKey, nil
}

// admitJob validates, estimates and admits a job of the caller (refusing
// what can never run or what a rejecting tier's budget cannot hold now) and
// inserts the row. admitted is nil for an idempotent replay (job is the
// first one).
func (s *Server) admitJob(ctx context.Context, c *caller, req *createJobRequest, idemKey string, sync bool) (job *store.Job, admitted *admission.Request, err error) {
	in, err := s.validateJob(ctx, c, req)
	if err != nil {
		return nil, nil, err
	}
	if c.tier.OnExhausted == config.OnExhaustedReject {
		if err := s.checkBudgetNow(c.budget, in.admitted.WorstCase, sync); err != nil {
			return nil, nil, err
		}
	}
	ins := &store.JobInsertParams{TenantID: c.tenant.ID, CustomID: req.CustomID, Queue: in.queue,
		WebhookURL: req.WebhookURL, Metadata: in.metadata, IdempotencyKey: idemKey, Sync: sync}
	in.admitted.Fill(ins)
	job, created, err := s.Store.JobInsert(ctx, ins)
	if err != nil {
		return nil, nil, err
	}
	if !created {
		if !sameRequest(job, req, in.admitted.Endpoint) {
			return nil, nil, wire.Errorf(http.StatusConflict, wire.TypeInvalidRequest, client.CodeIdempotencyKeyReused, "Idempotency-Key",
				"This Idempotency-Key was used for a different request (job %s).", job.ID)
		}
		return job, nil, nil
	}
	s.Observer.JobState(c.tier.Name, job.Model, string(job.Status))
	s.Logger.Debug("job state", "job", job.ID, "tenant", job.TenantID, "model", job.Model, "status", job.Status)
	return job, in.admitted, nil
}

// validatedJob is a create-job request that can run.
type validatedJob struct {
	queue    string
	metadata json.RawMessage
	admitted *admission.Request
}

// validateJob checks the request's own fields and admits its body under
// the caller's policy snapshot and budget account.
func (s *Server) validateJob(ctx context.Context, c *caller, req *createJobRequest) (*validatedJob, error) {
	tier := c.tier
	endpoint := req.Endpoint
	v := &validatedJob{queue: tier.Priority}
	if endpoint == "" {
		endpoint = llm.EndpointChat
	}
	if !llm.KnownEndpoint(endpoint) {
		return nil, wire.Invalid("endpoint", client.CodeInvalidEndpoint, "Unknown endpoint '%.100s'; use %s.", endpoint, llm.EndpointList)
	}
	if len(req.CustomID) > 512 || !utf8.ValidString(req.CustomID) {
		return nil, wire.Invalid("custom_id", client.CodeInvalidValue, "custom_id must be valid UTF-8 of at most 512 bytes.")
	}
	if req.Priority != "" {
		// A job may ask for its tier's priority or a lower one (later in
		// queue.Priorities), never a higher one.
		rank := slices.Index(queue.Priorities, req.Priority)
		if rank < 0 {
			return nil, wire.Invalid("priority", client.CodeInvalidValue, "priority must be critical, default, low or batch, got '%s'.", req.Priority)
		}
		if rank < slices.Index(queue.Priorities, tier.Priority) {
			return nil, wire.Invalid("priority", client.CodePriorityNotAllowed,
				"The %s tier runs at priority '%s'; a job may ask for that or lower, not '%s'.", tier.Name, tier.Priority, req.Priority)
		}
		v.queue = req.Priority
	}
	if err := s.validateWebhookURL(req.WebhookURL); err != nil {
		return nil, err
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return nil, err
	}
	if req.Metadata != nil {
		v.metadata, _ = json.Marshal(req.Metadata)
	}
	if len(bytes.TrimSpace(req.Body)) == 0 || bytes.Equal(bytes.TrimSpace(req.Body), []byte("null")) {
		return nil, wire.Invalid("body", client.CodeMissingBody, "body is required: the request to send to %s.", endpoint)
	}
	admitted, err := s.Admission.Admit(ctx, c.policy, c.tier, c.acct, endpoint, req.Body)
	if err != nil {
		return nil, admissionError(err, "body")
	}
	if err := admitted.WithFallbacks(c.policy, tier, c.acct, req.Fallbacks); err != nil {
		var ae *wire.Error
		if errors.As(err, &ae) && ae.Param == "fallbacks" {
			return nil, wire.Invalid("fallbacks", ae.Code, "%s", ae.Message)
		}
		return nil, admissionError(err, "body")
	}
	v.admitted = admitted
	return v, nil
}

// admissionError turns an admission refusal into a 400 whose param is a
// path within field (e.g. "body.messages").
func admissionError(err error, field string) error {
	var ae *wire.Error
	if !errors.As(err, &ae) {
		return err
	}
	return wire.Errorf(ae.Status, wire.TypeInvalidRequest, ae.Code, ae.ParamIn(field), "%s", ae.Message)
}

// checkBudgetNow refuses, for tiers that reject when exhausted, a job that
// the day's spend leaves no room for (its worst case passes the budget with
// what was spent: budget_exhausted, Retry-After to the reset). A job only
// what running jobs hold is in the way of is refused with budget_held and a
// Retry-After of a second, since they settle within seconds; a synchronous
// request is let through instead, to wait for the room inside the request.
func (s *Server) checkBudgetNow(d *budget.Decision, worst money.Micros, sync bool) error {
	if d == nil {
		return nil
	}
	n := d.Check(worst)
	if n == nil || (n.Held && sync) {
		return nil
	}
	var e *wire.Error
	if n.Held {
		e = wire.Errorf(http.StatusTooManyRequests, wire.TypeBudget, client.CodeBudgetHeld, "",
			"The %s is held by running jobs: $%s spent and $%s reserved of $%s; this job may cost up to $%s, "+
				"which the spend leaves room for once they settle. Retry in a few seconds.",
			n.Name(), n.Spent, n.Reserved, n.Budget, worst)
	} else {
		e = wire.Errorf(http.StatusTooManyRequests, wire.TypeBudget, client.CodeBudgetExhausted, "",
			"The %s is exhausted: $%s spent and $%s reserved of $%s; this job may cost up to $%s. It resets at %s.",
			n.Name(), n.Spent, n.Reserved, n.Budget, worst, n.ResetsAt.UTC().Format(time.RFC3339))
	}
	e.RetryAfter = n.RetryAfter
	return e
}

// sameRequest reports whether an idempotent replay asks for the same job.
func sameRequest(job *store.Job, req *createJobRequest, endpoint string) bool {
	if job.CustomID != req.CustomID || job.Endpoint != endpoint {
		return false
	}
	var a, b any
	if json.Unmarshal(job.Request, &a) != nil || json.Unmarshal(req.Body, &b) != nil {
		return false
	}
	return reflect.DeepEqual(a, b)
}

// validateMetadata applies OpenAI's limits: 16 pairs, keys of at most 64
// characters, values of at most 512.
func validateMetadata(m map[string]string) error {
	if len(m) > 16 {
		return wire.Invalid("metadata", client.CodeInvalidMetadata, "metadata may have at most 16 keys, got %d.", len(m))
	}
	for k, v := range m {
		if len(k) > 64 || len(v) > 512 {
			return wire.Invalid("metadata", client.CodeInvalidMetadata, "metadata keys may have at most 64 characters and values at most 512 (key '%.64s').", k)
		}
	}
	return nil
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) error {
	job, err := callersByPath(r, ids.Job, "job", s.Store.JobGetForTenant)
	if err != nil {
		return err
	}
	return writeOK(w, wire.Job(job))
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, ids.Job, "job")
	if err != nil {
		return err
	}
	job, changed, err := s.cancelCallersJob(r, id)
	if err != nil {
		return err
	}
	if !changed && job.Status != store.JobCancelled {
		return wire.Errorf(http.StatusConflict, wire.TypeInvalidRequest, client.CodeJobFinished, "",
			"Job %s already %s and cannot be cancelled.", job.ID, job.Status)
	}
	return writeOK(w, wire.Job(job))
}

// cancelCallersJob cancels the caller's job id unless it has ended
// (changed is then false), takes it out of its fair queue and has its
// webhook called.
func (s *Server) cancelCallersJob(r *http.Request, id string) (job *store.Job, changed bool, err error) {
	job, changed, err = s.Store.JobCancel(r.Context(), callerOf(r).tenant.ID, id)
	if err != nil {
		return nil, false, missingAs(err, "job", id)
	}
	if changed {
		// Out of its fair queue at once (the count per tenant drops); a task
		// already released finds the job cancelled and does nothing.
		if ref := admission.JobRef(callerOf(r).policy, job, 0); ref.Scope != "" {
			if err := s.Queue.Dequeue(r.Context(), ref.Scope, job.ID); err != nil {
				s.Logger.Warn("take a cancelled job out of its fair queue", "job", job.ID, "err", err)
			}
		}
		s.Observer.JobState(callerOf(r).tenant.Tier, job.Model, string(job.Status))
		s.Logger.Debug("job state", "job", job.ID, "tenant", job.TenantID, "model", job.Model, "status", job.Status)
		if job.WebhookURL != "" {
			// Should this fail, the reconciler enqueues it: the job's
			// delivery has not ended.
			if _, err := s.Queue.EnqueueWebhook(r.Context(), queue.WebhookPayload{Kind: store.WebhookJob, ID: job.ID}); err != nil {
				s.Logger.Warn("enqueue webhook failed; the reconciler will retry", "job", job.ID, "err", err)
			}
		}
	}
	return job, changed, nil
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, after, err := listPage(q, 1000, ids.Job, "job")
	if err != nil {
		return err
	}
	batchID, err := queryID(q, "batch_id", ids.Batch, "batch")
	if err != nil {
		return err
	}
	p := &store.JobListParams{TenantID: callerOf(r).tenant.ID, BatchID: batchID, After: after, Limit: limit}
	if st := q.Get("status"); st != "" {
		if !store.JobStatus(st).Valid() {
			return wire.Invalid("status", client.CodeInvalidValue, "status must be one of queued, running, waiting, deferred, succeeded, failed, cancelled; got '%s'.", st)
		}
		p.Status = store.JobStatus(st)
	}
	jobs, more, err := s.Store.JobList(r.Context(), p)
	if err != nil {
		return err
	}
	return writeList(w, jobs, more, wire.Job, func(j client.Job) string { return j.ID })
}
