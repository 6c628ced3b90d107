package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
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
	"github.com/llmq/llmq/internal/netguard"
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
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &req, false); err != nil {
		return err
	}
	job, err := s.submitJob(w, r, &req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, wire.Job(job))
}

// submitJob admits a job of the caller (with the request's Idempotency-Key)
// and enqueues it; the answer says Idempotent-Replayed when the key named
// an earlier job.
func (s *Server) submitJob(w http.ResponseWriter, r *http.Request, req *createJobRequest) (*store.Job, error) {
	idemKey, err := idempotencyKey(r)
	if err != nil {
		return nil, err
	}
	job, admitted, err := s.admitJob(r.Context(), callerOf(r), req, idemKey, false)
	if err != nil {
		return nil, err
	}
	if admitted == nil {
		w.Header().Set("Idempotent-Replayed", "true")
		return job, nil
	}
	// The row is committed: if Redis refuses the task now, the reconciler
	// enqueues it later, so the client still gets its job.
	if _, err := s.Queue.EnqueueJob(r.Context(), admission.JobRef(callerOf(r).policy, job, callerOf(r).tier.Share)); err != nil {
		s.Logger.Warn("enqueue failed; the reconciler will retry", "job", job.ID, "err", err)
	}
	return job, nil
}

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
	ins := &store.JobInsertParams{TenantID: c.tenant.ID, CustomID: req.CustomID, Queue: c.tier.Priority,
		WebhookURL: req.WebhookURL, IdempotencyKey: idemKey, Sync: sync}
	if admitted, err = s.validateJob(ctx, c, req, ins); err != nil {
		return nil, nil, err
	}
	if c.tier.OnExhausted == config.OnExhaustedReject {
		if err := s.checkBudgetNow(c.budget, admitted.WorstCase, sync); err != nil {
			return nil, nil, err
		}
	}
	admitted.Fill(ins)
	job, created, err := s.Store.JobInsert(ctx, ins)
	if err != nil {
		return nil, nil, err
	}
	if !created {
		if !sameRequest(job, req, admitted.Endpoint) {
			return nil, nil, wire.Errorf(http.StatusConflict, wire.TypeInvalidRequest, client.CodeIdempotencyKeyReused, "Idempotency-Key",
				"This Idempotency-Key was used for a different request (job %s).", job.ID)
		}
		return job, nil, nil
	}
	s.Observer.JobState(c.tier.Name, job.Model, string(job.Status))
	s.Logger.Debug("job state", "job", job.ID, "tenant", job.TenantID, "model", job.Model, "status", job.Status)
	return job, admitted, nil
}

// validateJob checks the request's own fields, setting ins's queue and
// metadata, and admits its body under the caller's policy snapshot and
// budget account.
func (s *Server) validateJob(ctx context.Context, c *caller, req *createJobRequest, ins *store.JobInsertParams) (*admission.Request, error) {
	tier := c.tier
	endpoint := cmp.Or(req.Endpoint, llm.EndpointChat)
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
		ins.Queue = req.Priority
	}
	if err := s.validateWebhookURL(req.WebhookURL); err != nil {
		return nil, err
	}
	var err error
	if ins.Metadata, err = validateMetadata(req.Metadata); err != nil {
		return nil, err
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
	return admitted, nil
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

// validateMetadata applies OpenAI's limits (16 pairs, keys of at most 64
// characters, values of at most 512) and returns m as stored: nil when
// there is none.
func validateMetadata(m map[string]string) (json.RawMessage, error) {
	if len(m) > 16 {
		return nil, wire.Invalid("metadata", client.CodeInvalidMetadata, "metadata may have at most 16 keys, got %d.", len(m))
	}
	for k, v := range m {
		if len(k) > 64 || len(v) > 512 {
			return nil, wire.Invalid("metadata", client.CodeInvalidMetadata, "metadata keys may have at most 64 characters and values at most 512 (key '%.64s').", k)
		}
	}
	if m == nil {
		return nil, nil
	}
	return json.Marshal(m)
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) error {
	job, err := callersByID(r, r.PathValue("id"), ids.Job, "job", s.Store.JobGetForTenant)
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

// validateWebhookURL refuses a URL llmq could never deliver to, or whose
// host is localhost or an internal address written out in any form
// (netguard.Literal), unless WebhookAllowPrivate. A name is resolved, and
// each of its addresses checked, only when the webhook is sent.
func (s *Server) validateWebhookURL(raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(raw) > 2048 {
		return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url must be an absolute http(s) URL of at most 2048 characters.")
	}
	if u.User != nil {
		return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url must not carry credentials.")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url's port must be within 1 and 65535, got '%.10s'.", p)
		}
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	a, literal := netguard.Literal(host)
	local := host == "localhost" || strings.HasSuffix(host, ".localhost")
	switch {
	case literal && netguard.Blocked(a) && !s.opts.WebhookAllowPrivate:
		return wire.Invalid("webhook_url", client.CodeWebhookURLInternal,
			"webhook_url's host %s is a loopback, private, link-local or otherwise internal address; webhooks go to public addresses only.", a)
	case local && !literal && !s.opts.WebhookAllowPrivate:
		return wire.Invalid("webhook_url", client.CodeWebhookURLInternal,
			"webhook_url's host %s is this machine; webhooks go to public addresses only.", host)
	case literal || local:
		return nil
	}
	// A name whose last label is a number is no DNS name, and no
	// address either (1.2.3.4.5, 0x7g): a resolver might read it as one.
	labels := strings.Split(host, ".")
	if last := labels[len(labels)-1]; last == "" || strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url's host '%.100s' is neither a DNS name nor an IP address.", host)
	}
	return nil
}
