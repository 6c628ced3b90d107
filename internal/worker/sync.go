package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/pacer"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// SyncCall is a synchronous request: a job (inserted with Sync) answered on
// its connection. It runs the steps of every job — budget, permit, breaker,
// provider, settlement, ledger — but waits inside the call where a job
// would go back to its queue, until Deadline.
type SyncCall struct {
	// JobID is the job, inserted and not yet started.
	JobID string
	// Deadline is the latest moment the provider call may start; a wait or
	// a retry that would pass it ends the request with a 429.
	Deadline time.Time
	// Stream relays a streamed chat completion's events (llm.Request.Stream);
	// it must not fail when the client has gone: the call is finished and
	// charged all the same.
	Stream func(data []byte) error
	// Answer, when set, is given the provider's answer as soon as it has
	// come, before it is settled and stored, so the client does not wait for
	// the bookkeeping. Defaults to none.
	Answer func(*llm.Response)
}

// SyncRefusal is a synchronous request answered without the provider's
// answer (nothing charged).
type SyncRefusal = wire.Error

// SyncResult is how a synchronous request reached the provider: its answer,
// or the refusal that retrying could not help (ProviderError, with the
// provider's status).
type SyncResult struct {
	Response      *llm.Response
	ProviderError *llm.Error
}

// syncRetryBase is the first backoff of a synchronous request after a
// provider fault; it doubles (with full jitter) up to the deadline.
const syncRetryBase = 200 * time.Millisecond

// RunSync runs a synchronous request. It returns a *SyncRefusal when the
// request cannot be sent in time or over budget, ctx's error when the client
// left before the call started (the job is cancelled, nothing charged), or
// the provider's answer. Once the call starts, ctx no longer cancels it.
func (h *Handler) RunSync(ctx context.Context, c SyncCall) (*SyncResult, error) {
	job, started, err := h.Store.JobStart(ctx, c.JobID, "")
	if err != nil {
		h.endSync(ctx, &store.Job{ID: c.JobID}, "", err)
		return nil, fmt.Errorf("start job %s: %w", c.JobID, err)
	}
	if !started {
		return nil, &SyncRefusal{Status: http.StatusConflict, Type: wire.TypeInvalidRequest, Code: client.CodeJobFinished,
			Message: fmt.Sprintf("Job %s already %s.", job.ID, job.Status)}
	}
	r := &run{h: h, job: job, log: h.Logger.With("job", job.ID, "model", job.Model, "sync", true), left: true}
	res, err := r.sync(ctx, c)
	var refusal *SyncRefusal
	if err != nil && !errors.As(err, &refusal) {
		r.releaseAll(ctx)
		h.endSync(ctx, job, r.tier, err)
	}
	return res, err
}

// endSync ends the job of a synchronous request that stopped before the
// provider answered: cancelled when its client left (no call, no charge),
// failed when llmq could not run it, so that no sync job stays unfinished.
func (h *Handler) endSync(ctx context.Context, job *store.Job, tier string, cause error) {
	bg := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		tenant, err := job.TenantID, error(nil)
		if tenant == "" { // not started: read the row for its tenant
			var row *store.Job
			if row, err = h.Store.JobGetByID(bg, job.ID); err == nil {
				tenant = row.TenantID
			}
		}
		var j *store.Job
		changed := false
		if err == nil {
			j, changed, err = h.Store.JobCancel(bg, tenant, job.ID)
		}
		if err != nil {
			h.Logger.Warn("cancel a synchronous job whose client left", "job", job.ID, "err", err)
		} else if changed {
			h.Observer.JobFinished(j.TenantID, tier, j.Model, string(store.JobCancelled), 0, 0, 0)
		}
		return
	}
	if _, _, err := h.Store.JobFail(bg, &store.JobFailParams{ID: job.ID, Error: store.JobError{Type: wire.TypeServer, Code: client.CodeInternalError,
		Message: "llmq could not run the request."}}); err != nil {
		h.Logger.Warn("fail a synchronous job", "job", job.ID, "err", err)
	}
	h.Logger.Warn("synchronous request failed", "job", job.ID, "err", cause)
}

func (r *run) sync(ctx context.Context, c SyncCall) (*SyncResult, error) {
	h := r.h
	p := h.Policy.Current()
	m, ok := p.Model(r.job.Model)
	if !ok {
		return nil, r.refuse(ctx, &SyncRefusal{Status: http.StatusNotFound, Type: wire.TypeInvalidRequest, Code: client.CodeModelNotFound, Param: "model",
			Message: fmt.Sprintf("The model '%s' is no longer served here.", r.job.Model)})
	}
	tenant, err := h.tenants.get(ctx, h.Store, r.job.TenantID)
	if err != nil {
		return nil, fmt.Errorf("load tenant %s: %w", r.job.TenantID, err)
	}
	acct, tier, err := admission.Account(p, tenant)
	if err != nil {
		return nil, err
	}
	r.acct, r.tier = acct, tier.Name
	h.Observer.JobState(r.tier, r.job.Model, string(store.JobRunning))
	if e, err := r.plan(ctx, p, m, tier); err != nil {
		return nil, err
	} else if e != nil {
		return nil, r.refuse(ctx, &SyncRefusal{Status: http.StatusBadRequest, Type: e.Type, Code: e.Code, Param: e.Param, Message: e.Message})
	}

	if err := r.syncBudget(ctx, r.worst, c.Deadline); err != nil {
		return nil, err
	}
	r.keep = r.keepReservation(ctx)
	defer r.keep()

	faults := 0
	for {
		if err := r.syncPermit(ctx, c.Deadline); err != nil {
			return nil, err
		}
		route := r.call.Route
		name := r.call.Scope.Name
		provider, ok := h.Providers.Get(route.Provider)
		if !ok {
			return nil, fmt.Errorf("the provider '%s' of model '%s' is not configured", route.Provider, route.Model.Name)
		}
		// From here the call is the client's whether or not it stays.
		callCtx := context.WithoutCancel(ctx)
		began := time.Now()
		req := r.shape.Request(route, r.job.Request)
		req.Stream = c.Stream
		resp, err := provider.Call(callCtx, req)
		status := 200
		pe := asProviderError(err)
		if pe != nil {
			status = pe.StatusCode
		}
		h.Observer.ProviderCall(name, route.Model.Name, status, time.Since(began))
		outcome := pacer.Outcome{Response: resp, Err: err, RateLimitedBefore: r.job.RateLimited}
		if err == nil || answered2xx(pe) {
			// An answer without usage (a stream without its usage chunk,
			// or one that failed midway, too) is charged its worst case;
			// one that cannot be taken is the client's 502, never a 200.
			v := r.accept(callCtx, resp, pe)
			if v.failed == nil && c.Answer != nil {
				c.Answer(resp)
			}
			h.breakers.Record(name, pe != nil && pe.Class == llm.ClassRetryable)
			if err := r.succeeded(callCtx, resp, v, outcome); err != nil {
				r.log.Warn("store a synchronous answer; the reconciler settles it", "err", err)
			}
			if v.failed != nil {
				return &SyncResult{ProviderError: &llm.Error{Class: llm.ClassPermanent, Provider: route.Provider, StatusCode: http.StatusBadGateway,
					Type: v.failed.Type, Code: v.failed.Code, Message: v.failed.Message, Relayed: relayed(resp, pe)}}, nil
			}
			return &SyncResult{Response: resp}, nil
		}
		if time.Now().Before(c.Deadline) && r.failover(callCtx, pe) {
			r.settlePermit(callCtx, outcome)
			h.breakers.Done(name)
			continue
		}
		r.settlePermit(callCtx, outcome)
		switch pe.Class {
		case llm.ClassRateLimited:
			h.breakers.Done(name)
			n, err := h.Store.JobIncrRateLimited(callCtx, r.job.ID)
			if err != nil {
				return nil, fmt.Errorf("count 429 of %s: %w", r.job.ID, err)
			}
			r.job.RateLimited = n
			// The wait is decided here, once: what the bookkeeping took
			// since does not turn it into a refusal.
			if n < h.opts.MaxRateLimited && time.Now().Add(r.wait).Before(c.Deadline) {
				if err := sleep(ctx, r.wait); err != nil {
					return nil, err
				}
				continue
			}
		case llm.ClassRetryable:
			h.breakers.Record(name, true)
			faults++
			wait := queue.FullJitter(faults-1, syncRetryBase, 10*time.Second)
			if faults <= queue.DefaultMaxRetry && time.Now().Add(wait).Before(c.Deadline) {
				r.setStatus(callCtx, store.JobRunning, nil, true)
				if err := sleep(ctx, wait); err != nil {
					return nil, err
				}
				continue
			}
		default:
			h.breakers.Record(name, false)
		}
		// Retrying cannot help (or no time is left): the provider's answer
		// is the client's.
		r.releaseAll(callCtx)
		if err := r.fail(callCtx, providerError(pe), pe); err != nil {
			r.log.Warn("record a synchronous failure", "err", err)
		}
		return &SyncResult{ProviderError: pe}, nil
	}
}

// syncBudgetPoll is how often a synchronous request refused only by what
// running jobs hold asks the budget again: each try keeps its place among
// the day's waiters.
const syncBudgetPoll = 200 * time.Millisecond

// syncBudget reserves the request's worst case. While only what running
// jobs hold is in the way (they settle within seconds, at most what they
// hold), it waits inside the request, in the order the day's waiters
// came, until deadline; then, or when the spend itself leaves no room
// today, it refuses the request with a 429 insufficient_quota (nothing
// charged), whose Retry-After is short in the first case and the reset in
// the second.
func (r *run) syncBudget(ctx context.Context, worst money.Micros, deadline time.Time) error {
	h := r.h
	for {
		bres, dec, err := h.Budgets.Reserve(ctx, r.acct, r.job.ID, worst)
		if err != nil {
			return fmt.Errorf("reserve budget: %w", err)
		}
		if dec.SoftLimitCrossed {
			h.Observer.SoftLimitCrossed(r.acct.TenantID, r.tier)
		}
		if dec.Allowed {
			r.bres = bres
			return nil
		}
		n := dec.Denial()
		if !dec.Held {
			return r.refuse(ctx, &SyncRefusal{Status: http.StatusTooManyRequests, Type: wire.TypeInsufficientQuota, Code: client.CodeInsufficientQuota,
				RetryAfter: dec.RetryAfter,
				Message: fmt.Sprintf("The %s is exhausted: $%s spent and $%s reserved of $%s; this request may cost up to $%s. It resets at %s.",
					n.Name(), n.Spent, n.Reserved, n.Budget, worst, n.ResetsAt.UTC().Format(time.RFC3339))})
		}
		wait := syncBudgetPoll
		if time.Now().Add(wait).After(deadline) || sleep(ctx, wait) != nil {
			// Those behind it need not wait for its place to lapse.
			if err := h.Budgets.StopWaiting(context.WithoutCancel(ctx), r.acct, r.job.ID); err != nil {
				r.log.Warn("stop waiting for the budget", "err", err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return r.refuse(ctx, &SyncRefusal{Status: http.StatusTooManyRequests, Type: wire.TypeInsufficientQuota, Code: client.CodeInsufficientQuota,
				RetryAfter: dec.RetryAfter,
				Message: fmt.Sprintf("The %s is held by running jobs ($%s spent and $%s reserved of $%s; this request may cost up to $%s), "+
					"and none of it came free within the request's wait; retry shortly.", n.Name(), n.Spent, n.Reserved, n.Budget, worst)})
		}
	}
}

// syncPermit takes the call's permit on the first route that admits it
// (see router), waiting for one until deadline. While it waits, it holds
// the room it needs in the fair queue of the route it waits for, so the
// scheduler releases no async job ahead of it.
func (r *run) syncPermit(ctx context.Context, deadline time.Time) error {
	h := r.h
	began := time.Now()
	held := ""
	defer func() {
		if held != "" {
			if err := h.Queue.Unhold(context.WithoutCancel(ctx), held, r.job.ID); err != nil {
				r.log.Warn("give back a synchronous request's room", "err", err)
			}
		}
	}()
	for {
		granted, p, err := r.reservePass(ctx, r.outranked)
		if err != nil {
			return err
		}
		if granted {
			h.Observer.LimiterWait(r.job.Model, time.Since(began), false)
			return nil
		}
		if p.tooLarge != nil {
			return r.refuse(ctx, &SyncRefusal{Status: http.StatusBadRequest, Type: wire.TypeInvalidRequest, Code: client.CodeTokensExceedCapacity, Param: "max_tokens",
				Message: fmt.Sprintf("This request needs %d tokens, more than a bucket of model '%s' holds: %v", r.job.EstPromptTokens+r.job.EstMaxTokens, r.job.Model, p.tooLarge)})
		}
		if p.unavailable && r.routes.toFallbacks() {
			continue
		}
		if held == "" && h.Queue != nil && p.held != nil && time.Now().Add(p.wait).Before(deadline) {
			ttl := time.Until(deadline) + 5*time.Second
			if err := h.Queue.Hold(ctx, p.held.Scope.Name, r.job.ID, r.job.Queue, p.held.Cost.Tokens, p.held.Cost.Requests, ttl); err != nil {
				r.log.Warn("hold a synchronous request's room", "err", err)
			} else {
				held = p.held.Scope.Name
			}
		}
		if err := r.syncSleep(ctx, p.wait, deadline, ""); err != nil {
			return err
		}
	}
}

// syncSleep waits d, or refuses the request (429, nothing charged) when d
// ends past deadline; why, when set, is the refusal's message.
func (r *run) syncSleep(ctx context.Context, d time.Duration, deadline time.Time, why string) error {
	if time.Now().Add(d).After(deadline) {
		if why == "" {
			why = fmt.Sprintf("Rate limit of model '%s' reached: the request could not start within its wait.", r.job.Model)
		}
		return r.refuse(ctx, &SyncRefusal{Status: http.StatusTooManyRequests, Type: wire.TypeRateLimit, Code: client.CodeRateLimitExceeded,
			Message: why, RetryAfter: max(d, time.Second)})
	}
	return sleep(ctx, d)
}

// sleep waits d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// refuse ends a synchronous request before the provider answered it: what
// it holds goes back, and the job fails with the refusal.
func (r *run) refuse(ctx context.Context, e *SyncRefusal) error {
	bg := context.WithoutCancel(ctx)
	r.releaseAll(bg)
	if err := r.fail(bg, store.JobError{Type: e.Type, Code: e.Code, Param: e.Param, Message: e.Message}, nil); err != nil {
		r.log.Warn("record a synchronous refusal", "err", err)
	}
	return e
}

// releasePermit gives the permit back unused.
func (r *run) releasePermit(ctx context.Context) {
	if r.permit != nil {
		if err := r.h.Pacer.Release(ctx, r.permit); err != nil {
			r.log.Warn("release rate limit", "err", err)
		}
		r.permit = nil
	}
}

// syncYield is how long a job whose permit went to a waiting synchronous
// request waits before it asks again.
const syncYield = 50 * time.Millisecond

// syncHolding reports whether synchronous requests hold room in the job's
// scope: they go first (docs/ARCHITECTURE.md), and a job released before
// they came would otherwise race them for every refill (yieldPermit).
func (r *run) syncHolding(ctx context.Context, scope string) bool {
	if r.h.Queue == nil {
		return false
	}
	held, err := r.h.Queue.Holding(ctx, scope)
	return err == nil && held
}

// yieldPermit gives permit back to the synchronous requests that hold room
// in the job's scope; false when it could not (the permit stays taken).
func (r *run) yieldPermit(ctx context.Context, permit *limiter.Reservation) bool {
	if err := r.h.Pacer.Release(ctx, permit); err != nil {
		r.log.Warn("give a permit back to a synchronous request", "err", err)
		return false // keep it: it is taken
	}
	return true
}

// outranked gives permit back when a synchronous request of a higher
// priority waits for the scope: synchronous requests go in priority order.
func (r *run) outranked(ctx context.Context, scope string, res *limiter.Result) bool {
	permit := res.Reservation
	if r.h.Queue == nil {
		return false
	}
	above, err := r.h.Queue.HeldAbove(ctx, scope, r.job.Queue)
	if err != nil || !above {
		return false
	}
	if err := r.h.Pacer.Release(ctx, permit); err != nil {
		r.log.Warn("give a permit back to a synchronous request of a higher priority", "err", err)
		return false
	}
	return true
}
