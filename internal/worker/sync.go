package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// SyncCall is a synchronous request: a job (inserted with Sync) answered on
// its connection, which waits in place until Deadline.
type SyncCall struct {
	// JobID is the job, inserted and not yet started.
	JobID string
	// Deadline is the latest moment the provider call may start; a wait or
	// a retry that would pass it ends the request with a 429.
	Deadline time.Time
	// Stream relays a stream's events; it must not fail when the client
	// has gone.
	Stream func(data []byte) error
	// Answer, when set, gets the provider's answer before it is settled.
	Answer func(*llm.Response)
}

// SyncResult is how a synchronous request reached the provider: its answer,
// or the refusal that retrying could not help (ProviderError, with the
// provider's status).
type SyncResult struct {
	Response      *llm.Response
	ProviderError *llm.Error
}

const (
	// syncRetryBase is a synchronous request's first backoff after a fault.
	syncRetryBase = 200 * time.Millisecond
	// syncBudgetPoll is how often a synchronous request refused only by
	// what running jobs hold asks the budget again.
	syncBudgetPoll = 200 * time.Millisecond
	// syncYield is how long a job whose permit went to a waiting
	// synchronous request waits before it asks again.
	syncYield = 50 * time.Millisecond
)

// RunSync runs a synchronous request: a *wire.Error (nothing charged) when
// it cannot be sent in time or within budget, ctx's error when the client
// left before the call (the job is cancelled), else the provider's answer.
// Once the call starts, ctx no longer cancels it.
func (h *Handler) RunSync(ctx context.Context, c SyncCall) (*SyncResult, error) {
	job, started, err := h.Store.JobStart(ctx, c.JobID, "")
	if err != nil {
		h.endSync(ctx, &store.Job{ID: c.JobID}, "", err)
		return nil, fmt.Errorf("start job %s: %w", c.JobID, err)
	}
	if !started {
		return nil, &wire.Error{Status: http.StatusConflict, Type: wire.TypeInvalidRequest, Code: client.CodeJobFinished,
			Message: fmt.Sprintf("Job %s already %s.", job.ID, job.Status)}
	}
	r := &run{h: h, job: job, log: h.Logger.With("job", job.ID, "model", job.Model, "sync", true), sync: &c, left: true}
	if err := r.do(ctx); err != nil {
		var refusal *wire.Error
		if !errors.As(err, &refusal) {
			r.releaseAll(ctx)
			h.endSync(ctx, job, r.tier, err)
		}
		return nil, err
	}
	return r.result, nil
}

// endSync cancels the job of a synchronous request whose client left
// before the call, or fails it when llmq could not run it.
func (h *Handler) endSync(ctx context.Context, job *store.Job, tier string, cause error) {
	bg := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		id, err := job.ID, error(nil)
		if job.TenantID == "" { // not started: read the row for its tenant
			job, err = h.Store.JobGetByID(bg, id)
		}
		changed := false
		if err == nil {
			job, changed, err = h.Store.JobCancel(bg, job.TenantID, id)
		}
		if err != nil {
			h.Logger.Warn("cancel a synchronous job whose client left", "job", id, "err", err)
		} else if changed {
			h.Observer.JobFinished(job.TenantID, tier, job.Model, string(store.JobCancelled), 0, 0, 0)
		}
		return
	}
	if _, _, err := h.Store.JobFail(bg, &store.JobFailParams{ID: job.ID, Error: store.JobError{Type: wire.TypeServer, Code: client.CodeInternalError,
		Message: "llmq could not run the request."}}); err != nil {
		h.Logger.Warn("fail a synchronous job", "job", job.ID, "err", err)
	}
	h.Logger.Warn("synchronous request failed", "job", job.ID, "err", cause)
}

// inTime reports whether a wait of d ends before a synchronous request's
// deadline; a job may always wait.
func (r *run) inTime(d time.Duration) bool {
	return r.sync == nil || time.Now().Add(d).Before(r.sync.Deadline)
}

// budgetInPlace waits, in the day's waiters' order, while only what
// running jobs hold is in the way of a synchronous request; past its
// deadline, or when the spend leaves no room today, it refuses it (429).
func (r *run) budgetInPlace(ctx context.Context, dec *budget.Decision) error {
	n, worst := dec.Denial(), r.worst
	refusal := store.JobError{Type: "insufficient_quota", Code: client.CodeInsufficientQuota}
	if !dec.Held {
		refusal.Message = fmt.Sprintf("The %s is exhausted: $%s spent and $%s reserved of $%s; this request may cost up to $%s. It resets at %s.",
			n.Name(), n.Spent, n.Reserved, n.Budget, worst, n.ResetsAt.UTC().Format(time.RFC3339))
		return r.refuse(ctx, http.StatusTooManyRequests, refusal, dec.RetryAfter)
	}
	if r.inTime(syncBudgetPoll) && sleep(ctx, syncBudgetPoll) == nil {
		return nil
	}
	// Those behind it need not wait for its place to lapse.
	if err := r.h.Budgets.StopWaiting(context.WithoutCancel(ctx), r.acct, r.job.ID); err != nil {
		r.log.Warn("stop waiting for the budget", "err", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	refusal.Message = fmt.Sprintf("The %s is held by running jobs ($%s spent and $%s reserved of $%s; this request may cost up to $%s), "+
		"and none of it came free within the request's wait; retry shortly.", n.Name(), n.Spent, n.Reserved, n.Budget, worst)
	return r.refuse(ctx, http.StatusTooManyRequests, refusal, dec.RetryAfter)
}

// hold holds the room a waiting synchronous request needs in the fair
// queue of the route it waits for, so no job is released ahead of it.
func (r *run) hold(ctx context.Context, p pass) {
	if r.held != "" || r.h.Queue == nil || p.held == nil || !r.inTime(p.wait) {
		return
	}
	ttl := time.Until(r.sync.Deadline) + 5*time.Second
	if err := r.h.Pacer.Hold(ctx, p.held.Scope.Name, r.job.ID, r.job.Queue, p.held.Cost.Tokens, p.held.Cost.Requests, ttl); err != nil {
		r.log.Warn("hold a synchronous request's room", "err", err)
		return
	}
	r.held = p.held.Scope.Name
}

func (r *run) unhold(ctx context.Context) {
	if r.held == "" {
		return
	}
	if err := r.h.Pacer.Unhold(context.WithoutCancel(ctx), r.held, r.job.ID); err != nil {
		r.log.Warn("give back a synchronous request's room", "err", err)
	}
	r.held = ""
}

// sleepInPlace waits d for the rate limit, or refuses the synchronous
// request (429) when d ends past its deadline.
func (r *run) sleepInPlace(ctx context.Context, d time.Duration) error {
	if time.Now().Add(d).After(r.sync.Deadline) {
		return r.refuse(ctx, http.StatusTooManyRequests, store.JobError{Type: wire.TypeRateLimit, Code: client.CodeRateLimitExceeded,
			Message: fmt.Sprintf("Rate limit of model '%s' reached: the request could not start within its wait.", r.job.Model)}, max(d, time.Second))
	}
	return sleep(ctx, d)
}

// failedInPlace retries a synchronous request whose call failed with pe
// after a 429's pause or a fault's backoff, within its deadline; else the
// provider's answer is the client's and the job fails with it.
func (r *run) failedInPlace(ctx context.Context, pe *llm.Error) (again bool, err error) {
	bg := context.WithoutCancel(ctx)
	var wait time.Duration
	retry := false
	switch pe.Class {
	case llm.ClassRateLimited:
		n, err := r.h.Store.JobIncrRateLimited(bg, r.job.ID)
		if err != nil {
			return false, fmt.Errorf("count 429 of %s: %w", r.job.ID, err)
		}
		r.job.RateLimited = n
		wait, retry = r.wait, n < r.h.opts.MaxRateLimited
	case llm.ClassRetryable:
		r.faults++
		wait, retry = queue.FullJitter(r.faults-1, syncRetryBase, 10*time.Second), r.faults <= queue.DefaultMaxRetry
	}
	if retry && r.inTime(wait) {
		if pe.Class == llm.ClassRetryable {
			r.setStatus(bg, store.JobRunning, nil, true)
		}
		if err := sleep(ctx, wait); err != nil {
			return false, err
		}
		return true, nil
	}
	r.releaseAll(bg)
	if err := r.fail(bg, providerError(pe), pe); err != nil {
		r.log.Warn("record a synchronous failure", "err", err)
	}
	r.result = &SyncResult{ProviderError: pe}
	return false, nil
}

// yield gives a granted permit back when a synchronous request that goes
// first holds room in scope: any, for a job; one of a higher priority, for
// a synchronous request.
func (r *run) yield(ctx context.Context, scope string, res *limiter.Result) bool {
	if r.h.Queue == nil {
		return false
	}
	var first bool
	var err error
	if r.sync == nil {
		first, err = r.h.Pacer.Holding(ctx, scope)
	} else {
		first, err = r.h.Pacer.HeldAbove(ctx, scope, r.job.Queue)
	}
	if err != nil || !first {
		return false
	}
	if err := r.h.Pacer.Release(ctx, res.Reservation); err != nil {
		r.log.Warn("give a permit back to a synchronous request", "err", err)
		return false // keep it: it is taken
	}
	return true
}
