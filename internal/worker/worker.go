// Package worker runs llmq's jobs: it reserves a job's worst-case cost from
// the tenant's budget, takes a permit from the model's rate limiter, calls
// the provider, and settles all three with the real usage, storing the
// result and the job's one ledger row. A job of the queue and a synchronous
// request run the same steps (run.do) and differ only in how they wait. A
// task delivered again after its job finished only settles its charge.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/pacer"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Options tune a Handler. The zero value is ready to use.
type Options struct {
	// MaxInlineWait is the longest limiter wait slept inside the handler;
	// longer waits put the task back in its queue. Defaults to 10s.
	MaxInlineWait time.Duration
	// MaxRateLimited is how many 429s a job may receive before it fails.
	// Defaults to 25.
	MaxRateLimited int
	// OutageWait is how long, from its creation, a job whose every route
	// failed waits for one to come back without counting a failure.
	// Defaults to 15m.
	OutageWait time.Duration
	// Breakers tune the per-deployment circuit breakers.
	Breakers BreakerOptions
	// Now is the clock of job timestamps. Defaults to time.Now.
	Now func() time.Time
	// Heartbeat names the jobs this process starts. Defaults to none: they
	// are never handed off (synchronous requests).
	Heartbeat *Heartbeat
}

func (o Options) withDefaults() Options {
	o.MaxInlineWait = cmp.Or(o.MaxInlineWait, 10*time.Second)
	o.OutageWait = cmp.Or(o.OutageWait, 15*time.Minute)
	o.MaxRateLimited = cmp.Or(o.MaxRateLimited, 25)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Deps are what a Handler works with.
type Deps struct {
	Store     *store.DB
	Policy    *config.PolicyHolder
	Pacer     *pacer.Pacer
	Budgets   *budget.Budgets
	Providers *Providers
	Queue     *queue.Client // webhook deliveries and the fair queue
	Logger    *slog.Logger
	// Observer is told what happens, for metrics. Defaults to none.
	Observer Observer
}

// Observer is told what the worker does, for metrics. Methods must be cheap
// and safe for concurrent use; labels are never job ids.
type Observer interface {
	pacer.Observer
	// ProviderCall reports one provider call on a deployment: its status
	// (0 for a network error) and how long it took.
	ProviderCall(deployment, model string, status int, d time.Duration)
	// JobFinished reports a job reaching a terminal state with its real
	// usage and cost in micro-dollars (zero when it failed).
	JobFinished(tenantID, tier, model, status string, promptTokens, completionTokens int64, costMicros int64)
	// JobState reports a non-terminal state change (waiting, deferred).
	JobState(tier, model, status string)
	// LimiterWait reports how long a job waited for its permit.
	LimiterWait(model string, d time.Duration, requeued bool)
	// BreakerState reports a deployment's circuit breaker changing state.
	BreakerState(deployment, state string)
	// Failover reports a job of model leaving deployment for another.
	Failover(model, deployment string)
	// SoftLimitCrossed reports a tenant crossing its budget's soft limit.
	SoftLimitCrossed(tenantID, tier string)
	// UsageUnbelieved reports an answer whose usage llmq did not take
	// ("missing" or "invalid").
	UsageUnbelieved(model, reason string)
}

type nopObserver struct{}

func (nopObserver) ProviderCall(string, string, int, time.Duration)                 {}
func (nopObserver) JobFinished(string, string, string, string, int64, int64, int64) {}
func (nopObserver) JobState(string, string, string)                                 {}
func (nopObserver) LimiterWait(string, time.Duration, bool)                         {}
func (nopObserver) Failover(string, string)                                         {}
func (nopObserver) Penalized(string, time.Duration)                                 {}
func (nopObserver) BreakerState(string, string)                                     {}
func (nopObserver) LimitsLearned(string, int64, int64)                              {}
func (nopObserver) UnpredictedRateLimit(string, []string)                           {}
func (nopObserver) ShortWindowRateLimit(string, []string)                           {}
func (nopObserver) SoftLimitCrossed(string, string)                                 {}
func (nopObserver) UsageUnbelieved(string, string)                                  {}

// Handler processes TypeJob tasks and synchronous requests.
type Handler struct {
	Deps
	opts     Options
	tenants  tenantCache
	breakers *Breakers
}

// NewHandler returns a Handler.
func NewHandler(d Deps, opts Options) *Handler {
	d.Logger = cmp.Or(d.Logger, slog.New(slog.DiscardHandler))
	if d.Observer == nil {
		d.Observer = nopObserver{}
	}
	o := opts.withDefaults()
	return &Handler{Deps: d, opts: o, tenants: tenantCache{now: o.Now, m: map[string]cachedTenant{}},
		breakers: NewBreakers(o.Breakers, d.Observer, o.Now)}
}

// BreakerState returns the state of a deployment's circuit breaker.
func (h *Handler) BreakerState(deployment string) string { return h.breakers.State(deployment) }

// ProcessTask implements asynq.Handler.
func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	id, err := queue.ParseJobPayload(t)
	if err != nil {
		h.Logger.Error("dropping malformed task", "err", err)
		return nil
	}
	return h.Run(ctx, id)
}

// run is one delivery of one job.
type run struct {
	h      *Handler
	job    *store.Job
	log    *slog.Logger
	sync   *SyncCall   // the synchronous request the job answers; nil when queued
	result *SyncResult // sync: how the provider answered
	faults int         // sync: provider faults retried in place
	held   string      // sync: the scope whose fair queue holds its room

	// shape is what of the body bounds its bill; stores is set when the
	// provider stores its answer.
	shape  admission.Shape
	stores bool
	call   *pacer.Call // the call on the route the permit is for
	routes *router
	worst  money.Micros // what the budget reserves: EstCost, raised if prices rose since
	scope  string       // the model's fair queue
	acct   budget.Account
	tier   string
	reject bool // the tier rejects work once its budget is spent
	bres   *budget.Reservation
	keep   func() // stops extending bres; set with it
	permit *limiter.Reservation
	wait   time.Duration // the pause after a 429
	left   bool          // the fair queue was told (leave)
	moved  bool          // the store took a move of the job (which lets go of it)
}

// leave tells the fair queue, once, that the job is past its permit.
func (r *run) leave(ctx context.Context) {
	if !r.left {
		r.left = true
		r.h.leftFairQueue(ctx, r.scope, r.job.ID)
	}
}

// Run processes job id once: nil when the task is done with, a
// *queue.Retry to come back later, or an error for asynq to retry.
func (h *Handler) Run(ctx context.Context, id string) error {
	if !h.opts.Heartbeat.Fresh() {
		// The reconciler may take this process for dead and hand its jobs
		// on: start none until a beat gets through.
		return &queue.Retry{Reason: "this worker's heartbeat in the store is stale", Delay: store.WorkerBeatInterval}
	}
	job, started, err := h.Store.JobStart(ctx, id, h.opts.Heartbeat.ID())
	if errors.Is(err, store.ErrNotFound) {
		h.Logger.Warn("task for a job that does not exist", "job", id)
		return nil
	}
	if err != nil {
		return fmt.Errorf("load job %s: %w", id, err)
	}
	if !started && !job.Status.Terminal() {
		// Another worker, alive, runs it: this is a second delivery.
		h.Logger.Debug("job runs on another worker", "job", id)
		return nil
	}
	if !started {
		if m, ok := h.Policy.Current().Model(job.Model); ok {
			h.leftFairQueue(ctx, m.Queue(), job.ID)
		}
		h.Logger.Debug("job already finished", "job", id, "status", job.Status)
		return h.settleFinished(ctx, job)
	}
	r := &run{h: h, job: job, log: h.Logger.With("job", id, "model", job.Model)}
	err = r.do(ctx)
	if !r.moved && h.opts.Heartbeat != nil {
		// A delivery that did not move the job lets go of it here.
		if rerr := h.Store.JobRelease(context.WithoutCancel(ctx), id, h.opts.Heartbeat.ID()); rerr != nil {
			r.log.Warn("let go of the job", "err", rerr)
		}
	}
	return err
}

// leftFairQueue tells the fair queue of scope that job id has its permit
// (or will not wait for one here), so the scheduler releases the next jobs.
func (h *Handler) leftFairQueue(ctx context.Context, scope, id string) {
	if h.Queue == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := h.Queue.Started(ctx, scope, id); err != nil {
		h.Logger.Warn("mark a job started in its fair queue", "job", id, "err", err)
	}
}

// settleFinished makes sure a finished job's charge is in its day's spend
// (a worker may have died before settling); Settle charges a job once.
func (h *Handler) settleFinished(ctx context.Context, job *store.Job) error {
	if job.StartedAt == nil {
		return nil // never called the provider: nothing was charged
	}
	e, err := h.Store.UsageGetByJob(ctx, job.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ledger row of %s: %w", job.ID, err)
	}
	res := &budget.Reservation{ID: job.ID, TenantID: e.TenantID, Day: e.Day, GlobalDay: e.GlobalDay}
	if err := h.Budgets.Settle(ctx, res, e.Cost, true); err != nil {
		return &queue.Retry{Reason: "settle the budget of a finished job", Delay: settleRetryDelay, Cause: err}
	}
	return nil
}

const settleRetryDelay = 5 * time.Second

// do is the run of a job, synchronous or not.
func (r *run) do(ctx context.Context) error {
	defer r.leave(ctx)
	h := r.h
	p := h.Policy.Current()
	m, ok := p.Model(r.job.Model)
	if !ok {
		return r.refuse(ctx, http.StatusNotFound, store.JobError{Type: wire.TypeInvalidRequest, Code: client.CodeModelNotFound, Param: "model",
			Message: fmt.Sprintf("The model '%s' is no longer served here.", r.job.Model)}, 0)
	}
	r.scope = m.Queue()
	tenant, err := h.tenants.get(ctx, h.Store, r.job.TenantID)
	if err != nil {
		return fmt.Errorf("load tenant %s: %w", r.job.TenantID, err)
	}
	acct, tier, err := admission.Account(p, tenant)
	if err != nil {
		return r.refuse(ctx, http.StatusInternalServerError, store.JobError{Type: wire.TypeServer, Code: client.CodeTierNotFound, Message: err.Error()}, 0)
	}
	r.acct, r.tier, r.reject = acct, tier.Name, tier.OnExhausted == config.OnExhaustedReject
	r.log.Debug("job state", "status", store.JobRunning)
	h.Observer.JobState(r.tier, r.job.Model, string(store.JobRunning))
	if refusal, err := r.plan(ctx, p, m, tier); err != nil {
		return err
	} else if refusal != nil {
		return r.refuse(ctx, http.StatusBadRequest, *refusal, 0)
	}
	// The budget first: a job it refuses takes no permit.
	if done, err := r.reserveBudget(ctx); done {
		return err
	}
	r.keep = r.keepReservation(ctx)
	defer r.keep()
	for {
		done, err := r.takePermit(ctx)
		r.leave(ctx)
		if done {
			r.releaseAll(ctx)
			return err
		}
		again, err := r.callRoute(ctx)
		if !again {
			return err
		}
	}
}

// plan reads the job's shape under the policy in force and makes its
// routes. A body that can no longer run is refusal; a store that cannot
// tell now is err.
func (r *run) plan(ctx context.Context, p *config.Policy, m *config.Model, tier *config.Tier) (refusal *store.JobError, err error) {
	b, err := llm.Decode(r.job.Endpoint, r.job.Request)
	if err == nil {
		r.shape, _, err = admission.ShapeOf(ctx, r.h.Store, p, tier, r.job.TenantID, m, b)
	}
	if err == nil {
		err = admission.Routable(p, m, admission.Fallbacks(m, r.job.Fallbacks), &r.shape)
	}
	if err != nil {
		var ae *wire.Error
		if errors.As(err, &ae) {
			return &store.JobError{Type: wire.TypeInvalidRequest, Code: ae.Code, Param: ae.Param, Message: ae.Message}, nil
		}
		return nil, fmt.Errorf("the stored responses job %s continues: %w", r.job.ID, err)
	}
	r.stores = b.StoresResponse()
	r.routes = newRouter(p, m, r.job.Fallbacks, &r.shape)
	c := r.h.Pacer.Calibration(ctx, m.Routes()[0].Deployment.Name())
	now := admission.WorstCase(p, m, admission.Fallbacks(m, r.job.Fallbacks), &r.shape, c, r.job.EstPromptTokens, r.job.EstMaxTokens)
	r.worst = max(r.job.EstCost, now)
	return nil, nil
}

// reserveBudget reserves the job's worst case (worst). done is true when
// the run stops here.
func (r *run) reserveBudget(ctx context.Context) (done bool, err error) {
	for {
		res, dec, err := r.h.Budgets.Reserve(ctx, r.acct, r.job.ID, r.worst)
		if err != nil {
			return true, fmt.Errorf("reserve budget: %w", err)
		}
		if dec.SoftLimitCrossed {
			r.h.Observer.SoftLimitCrossed(r.acct.TenantID, r.tier)
		}
		if dec.Allowed {
			r.bres = res
			return false, nil
		}
		if r.sync == nil {
			return true, r.budgetRequeue(ctx, dec)
		}
		if err := r.budgetInPlace(ctx, dec); err != nil {
			return true, err
		}
	}
}

// budgetRequeue puts back (or fails) a job the budget refused.
func (r *run) budgetRequeue(ctx context.Context, dec *budget.Decision) error {
	n, worst := dec.Denial(), r.worst
	if n.TooLarge {
		return r.fail(ctx, store.JobError{Type: wire.TypeBudget, Code: client.CodeBudgetTooSmall,
			Message: fmt.Sprintf("This job may cost up to $%s, more than the whole %s of $%s; it can never run.", worst, n.Name(), n.Budget)}, nil)
	}
	if dec.Held {
		// Only what running jobs hold is in the way: the job keeps its
		// place among the day's waiters by coming back within budget.WaitTTL.
		delay := budget.HeldRetryAfter + time.Duration(rand.Int64N(int64(budget.HeldRetryAfter)))
		next := r.h.opts.Now().Add(delay)
		r.setStatus(ctx, store.JobWaiting, &next, false)
		return &queue.Retry{Reason: "the " + dec.DeniedBy + " daily budget is held by running jobs", Delay: delay}
	}
	if r.reject {
		return r.fail(ctx, store.JobError{Type: wire.TypeBudget, Code: client.CodeBudgetExhausted,
			Message: fmt.Sprintf("The %s is exhausted ($%s spent and $%s reserved of $%s; this job may cost up to $%s) and the %s tier rejects work until it resets at %s.",
				n.Name(), n.Spent, n.Reserved, n.Budget, worst, r.tier, n.ResetsAt.UTC().Format(time.RFC3339))}, nil)
	}
	next := r.h.opts.Now().Add(dec.RetryAfter)
	r.setStatus(ctx, store.JobDeferred, &next, false)
	// Spread the deferred jobs over a little while after the reset.
	delay := dec.RetryAfter + time.Duration(rand.Int64N(int64(5*time.Second)))
	return &queue.Retry{Reason: "over the " + dec.DeniedBy + " daily budget", Delay: delay}
}

// takePermit takes the permit of the first route that admits the job now,
// going to the fallbacks when every deployment is paused or failing. A job
// gives it back to synchronous requests holding room in the scope, a
// synchronous request to one of a higher priority.
func (r *run) takePermit(ctx context.Context) (done bool, err error) {
	began := time.Now()
	if r.sync != nil {
		defer r.unhold(ctx)
	}
	for {
		granted, p, err := r.reservePass(ctx)
		if err != nil {
			return true, err
		}
		if granted {
			r.h.Observer.LimiterWait(r.job.Model, time.Since(began), false)
			return false, nil
		}
		if p.tooLarge != nil {
			what := "job"
			if r.sync != nil {
				what = "request"
			}
			return true, r.refuse(ctx, http.StatusBadRequest, store.JobError{Type: wire.TypeInvalidRequest, Code: client.CodeTokensExceedCapacity, Param: "max_tokens",
				Message: fmt.Sprintf("This %s needs %d tokens, more than a bucket of model '%s' holds: %v", what, r.job.EstPromptTokens+r.job.EstMaxTokens, r.job.Model, p.tooLarge)}, 0)
		}
		if p.unavailable && r.routes.toFallbacks() {
			continue
		}
		if r.sync != nil {
			r.hold(ctx, p)
			if err := r.sleepInPlace(ctx, p.wait); err != nil {
				return true, err
			}
			continue
		}
		if p.wait > r.h.opts.MaxInlineWait {
			next := r.h.opts.Now().Add(p.wait)
			r.h.Observer.LimiterWait(r.job.Model, time.Since(began)+p.wait, true)
			r.setStatus(ctx, store.JobWaiting, &next, false)
			return true, &queue.Retry{Reason: "waiting for the rate limit", Delay: p.wait}
		}
		if err := sleep(ctx, p.wait); err != nil {
			return true, err
		}
	}
}

// callRoute calls the provider on the route of the run's permit. again is
// true when the run asks for a permit again (failover, or a synchronous
// request's retry in place).
func (r *run) callRoute(ctx context.Context) (again bool, err error) {
	h := r.h
	route, name := r.call.Route, r.call.Scope.Name
	provider, ok := h.Providers.Get(route.Provider)
	if !ok {
		return false, r.refuse(ctx, http.StatusInternalServerError, store.JobError{Type: wire.TypeServer, Code: client.CodeProviderNotFound,
			Message: fmt.Sprintf("The provider '%s' of model '%s' is not configured.", route.Provider, route.Model.Name)}, 0)
	}
	req := r.shape.Request(route, r.job.Request)
	callCtx := ctx
	if r.sync != nil {
		// From here the call is the client's whether or not it stays.
		callCtx = context.WithoutCancel(ctx)
		req.Stream = r.sync.Stream
	}
	began := time.Now()
	resp, err := provider.Call(callCtx, req)
	status := 200
	if resp != nil {
		status = resp.StatusCode
	}
	pe := asProviderError(err)
	if pe != nil {
		status = pe.StatusCode
	}
	h.Observer.ProviderCall(name, route.Model.Name, status, time.Since(began))
	outcome := pacer.Outcome{Response: resp, Err: err, RateLimitedBefore: r.job.RateLimited}
	if err == nil || answered2xx(pe) {
		h.breakers.Record(name, false)
		return false, r.answered(callCtx, resp, pe, outcome)
	}
	again = r.inTime(0) && r.failover(callCtx, pe)
	r.settlePermit(callCtx, outcome)
	switch {
	case again || callCtx.Err() != nil || pe.Class == llm.ClassRateLimited || pe.Overloaded():
		h.breakers.Done(name)
	default:
		h.breakers.Record(name, pe.Class == llm.ClassRetryable)
	}
	if again {
		return true, nil
	}
	if r.sync != nil {
		return r.failedInPlace(ctx, pe)
	}
	if r.routes.allDown && ctx.Err() == nil && h.opts.Now().Sub(r.job.CreatedAt) < h.opts.OutageWait {
		// Every route failed: wait for one to come back.
		r.releaseAll(ctx)
		delay := outageRetry + time.Duration(rand.Int64N(int64(outageRetry)))
		next := h.opts.Now().Add(delay)
		r.setStatus(ctx, store.JobWaiting, &next, false)
		return false, &queue.Retry{Reason: "every deployment of model " + r.job.Model + " is failing", Delay: delay}
	}
	return false, r.callFailed(ctx, pe)
}

// outageRetry is about how soon a job whose every route failed comes back.
const outageRetry = 2 * time.Second

// asProviderError is err as an *llm.Error: a network failure or timeout is
// a retryable one; nil stays nil.
func asProviderError(err error) *llm.Error {
	if err == nil {
		return nil
	}
	var pe *llm.Error
	if !errors.As(err, &pe) {
		pe = &llm.Error{Class: llm.ClassRetryable, Message: err.Error(), Err: err}
	}
	return pe
}

// answered settles a provider's 2xx answer (or one llmq cannot take, pe):
// a synchronous request's client gets it first, before the bookkeeping.
func (r *run) answered(ctx context.Context, resp *llm.Response, pe *llm.Error, o pacer.Outcome) error {
	v := r.accept(ctx, resp, pe)
	if r.sync == nil {
		return r.succeeded(ctx, resp, v, o)
	}
	if v.Failed == nil && r.sync.Answer != nil {
		r.sync.Answer(resp)
	}
	if err := r.succeeded(ctx, resp, v, o); err != nil {
		r.log.Warn("store a synchronous answer; the reconciler settles it", "err", err)
	}
	r.result = &SyncResult{Response: resp}
	if v.Failed != nil {
		r.result = &SyncResult{ProviderError: &llm.Error{Class: llm.ClassPermanent, Provider: r.call.Route.Provider, StatusCode: http.StatusBadGateway,
			Type: v.Failed.Type, Code: v.Failed.Code, Message: v.Failed.Message, Relayed: relayed(resp, pe)}}
	}
	return nil
}

// accept judges a provider's 2xx answer: resp by admission.Judge, or pe
// for one llmq could not take (failed, charged the call's worst case).
// When it is a response the provider stores, it records it (and its output
// items) as the tenant's before the answer reaches anyone, since a client
// may send the follow-up the moment it has it. A record that fails is
// logged: a follow-up of it is then refused as unknown, never served as
// another's.
func (r *run) accept(ctx context.Context, resp *llm.Response, pe *llm.Error) admission.Verdict {
	worst := admission.Verdict{
		Usage: llm.Usage{PromptTokens: max(r.call.Calibration.Apply(r.call.PromptTokens), r.call.PromptTokens),
			CompletionTokens: r.call.MaxTokens},
		Cost: r.call.WorstCase,
	}
	if pe != nil {
		e := providerError(pe)
		worst.Failed = &e
		worst.Estimated = true
		worst.Usage.TotalTokens = worst.Usage.PromptTokens + worst.Usage.CompletionTokens
		return worst
	}
	v := admission.Judge(r.call.Route, &r.shape, r.call.PromptTokens, r.call.MaxTokens, worst, resp.Usage)
	switch {
	case v.Failed != nil:
		r.h.Observer.UsageUnbelieved(r.job.Model, "invalid")
	case v.Estimated:
		r.h.Observer.UsageUnbelieved(r.job.Model, "missing")
	}
	if v.Failed != nil || !r.stores {
		return v
	}
	if rows := admission.StoredRows(r.job.TenantID, r.call.Scope.Name, resp.Body, v.Usage); rows != nil {
		if err := r.h.Store.StoredResponseInsert(context.WithoutCancel(ctx), rows); err != nil {
			r.log.Warn("record a stored response; its follow-ups will be refused", "err", err)
		}
	}
	return v
}

// relayed is how many events of a stream reached the client before its
// answer was judged.
func relayed(resp *llm.Response, pe *llm.Error) int {
	if resp != nil {
		return resp.Chunks
	}
	return pe.Relayed
}

// answered2xx reports whether pe is a 2xx answer llmq cannot take, or a
// stream that failed after it relayed events: the provider bills it, so
// the job is charged, and it is not retried.
func answered2xx(pe *llm.Error) bool {
	return pe != nil && (pe.Relayed > 0 || pe.Class == llm.ClassPermanent && pe.StatusCode >= 200 && pe.StatusCode < 300)
}

func (r *run) settlePermit(ctx context.Context, o pacer.Outcome) {
	after := r.h.Pacer.Done(ctx, r.call, r.permit, o)
	r.permit, r.wait = nil, after.Wait
}

// succeeded stores the result of a 2xx answer as v judged it and its
// ledger row, settles the permit and the budget, and sends the webhook.
func (r *run) succeeded(ctx context.Context, resp *llm.Response, v admission.Verdict, o pacer.Outcome) error {
	u, cost := v.Usage, v.Cost
	p := &store.JobCompleteParams{
		ID: r.job.ID, Day: r.bres.Day, GlobalDay: r.bres.GlobalDay,
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
		CachedTokens: u.CachedTokens, TotalTokens: u.TotalTokens, Cost: cost, UsageEstimated: v.Estimated, Failed: v.Failed,
		Deployment: r.call.Scope.Name, ServedModel: r.call.Route.Model.Name,
	}
	if resp != nil {
		p.ResponseStatus, p.ResponseBody, p.ProviderRequestID = resp.StatusCode, resp.Body, resp.RequestID
	}
	if v.Failed != nil {
		// The answer is not the client's: it stays out of the job.
		p.ResponseStatus, p.ResponseBody = http.StatusBadGateway, nil
	}
	if v.Estimated && resp != nil {
		// Nothing the provider said of its usage teaches the pacer.
		quiet := *resp
		quiet.Usage = llm.Usage{}
		o.Response = &quiet
	}
	res, err := r.h.Store.JobComplete(ctx, p)
	r.moved = r.moved || err == nil
	if err != nil {
		// The result may be stored all the same: the reservation stays for
		// the next delivery.
		r.keep()
		r.settlePermit(ctx, o)
		return fmt.Errorf("store result of %s: %w", r.job.ID, err)
	}
	var settled sync.WaitGroup
	settled.Go(func() { r.settlePermit(ctx, o) })
	settleErr := r.settle(ctx, cost, res.Charged)
	settled.Wait()
	status := store.JobSucceeded
	if v.Failed != nil {
		status = store.JobFailed
		r.log.Warn("job failed, charged", "code", v.Failed.Code, "err", v.Failed.Message)
	}
	r.log.Debug("job "+string(status), "prompt_tokens", u.PromptTokens, "completion_tokens", u.CompletionTokens, "cost", cost,
		"usage_estimated", v.Estimated)
	if res.Completed {
		r.h.Observer.JobFinished(r.acct.TenantID, r.tier, r.job.Model, string(status), u.PromptTokens, u.CompletionTokens, int64(cost))
		r.notify(ctx)
	}
	if settleErr != nil {
		r.log.Warn("settle budget; the job comes back to settle", "err", settleErr)
		return &queue.Retry{Reason: "settle the budget", Delay: settleRetryDelay, Cause: settleErr}
	}
	return nil
}

// settle charges the job's cost to its budget day, retrying a few times.
// When another delivery wrote the ledger row (charged is false), it charges
// the row's cost on the row's days and gives its own reservation back.
func (r *run) settle(ctx context.Context, cost money.Micros, charged bool) error {
	r.keep()
	ctx = context.WithoutCancel(ctx)
	res := r.bres
	if !charged {
		e, err := r.h.Store.UsageGetByJob(ctx, r.job.ID)
		if err != nil {
			return fmt.Errorf("ledger row of %s: %w", r.job.ID, err)
		}
		cost = e.Cost
		if e.Day != res.Day || e.GlobalDay != res.GlobalDay {
			r.releaseBudget(ctx)
			res = &budget.Reservation{ID: r.job.ID, TenantID: e.TenantID, Day: e.Day, GlobalDay: e.GlobalDay}
		}
	}
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		if err = r.h.Budgets.Settle(ctx, res, cost, true); err == nil {
			r.bres = nil
			return nil
		}
	}
	return err
}

// keepReservation extends the budget reservation every third of its TTL
// while the run holds it. A timer, not a goroutine: most jobs end before
// the first extension. stop waits for an extension under way (it holds mu).
func (r *run) keepReservation(ctx context.Context) (stop func()) {
	res, every := r.bres, r.h.Budgets.ReservationTTL()/3
	ctx = context.WithoutCancel(ctx)
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	extend := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		held, err := r.h.Budgets.Extend(ctx, res)
		switch {
		case err != nil:
			r.log.Warn("extend budget reservation", "err", err)
		case !held:
			r.log.Warn("budget reservation lapsed while the job ran", "day", res.Day)
			return
		}
		t.Reset(every)
	}
	mu.Lock()
	t = time.AfterFunc(every, extend)
	mu.Unlock()
	return sync.OnceFunc(func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	})
}

// callFailed puts back or fails a job whose call failed with pe.
func (r *run) callFailed(ctx context.Context, pe *llm.Error) error {
	r.releaseAll(ctx)
	if ctx.Err() != nil { // shutting down: asynq puts the task back, not a failure
		r.setStatus(ctx, store.JobQueued, nil, false)
		return ctx.Err()
	}
	switch pe.Class {
	case llm.ClassRateLimited:
		return r.rateLimited(ctx, pe)
	case llm.ClassPermanent:
		return r.fail(ctx, providerError(pe), pe)
	default:
		return r.retry(ctx, pe)
	}
}

// rateLimited puts the job back after the scope's pause, up to
// MaxRateLimited times.
func (r *run) rateLimited(ctx context.Context, pe *llm.Error) error {
	n, err := r.h.Store.JobIncrRateLimited(ctx, r.job.ID)
	if err != nil {
		return fmt.Errorf("count 429 of %s: %w", r.job.ID, err)
	}
	r.log.Debug("provider answered 429", "count", n, "wait", r.wait)
	if n >= r.h.opts.MaxRateLimited {
		e := providerError(pe)
		e.Code = client.CodeRateLimitExceeded
		e.Message = fmt.Sprintf("The provider answered 429 (rate limited) %d times; giving up. Last answer: %s", n, pe.Message)
		return r.fail(ctx, e, pe)
	}
	next := r.h.opts.Now().Add(r.wait)
	r.setStatus(ctx, store.JobWaiting, &next, true)
	return &queue.Retry{Reason: "rate limited by the provider", Delay: r.wait}
}

// retry counts a provider fault and retries with backoff, or fails the job.
func (r *run) retry(ctx context.Context, pe *llm.Error) error {
	maxRetry, ok := asynq.GetMaxRetry(ctx)
	if !ok {
		maxRetry = queue.DefaultMaxRetry
	}
	// The job's own count holds when the reconciler revives a task.
	retried, _ := asynq.GetRetryCount(ctx)
	faults := max(retried, r.job.Attempts-r.job.RateLimited)
	if faults >= maxRetry {
		e := providerError(pe)
		e.Message = fmt.Sprintf("The provider call failed %d times; giving up. Last error: %s", faults+1, pe.Message)
		return r.fail(ctx, e, pe)
	}
	r.log.Warn("provider call failed; will retry", "status", pe.StatusCode, "attempt", faults+1, "err", pe.Message)
	r.setStatus(ctx, store.JobWaiting, nil, true)
	return &queue.Retry{Reason: "provider error", Failure: true, Delay: queue.FullJitter(faults, time.Second, 5*time.Minute), Cause: pe}
}

// refuse ends the run before the provider answered: what it holds goes
// back and the job fails with e; a synchronous request gets a *wire.Error.
func (r *run) refuse(ctx context.Context, status int, e store.JobError, retryAfter time.Duration) error {
	if r.sync != nil {
		ctx = context.WithoutCancel(ctx)
	}
	r.releaseAll(ctx)
	err := r.fail(ctx, e, nil)
	if r.sync == nil {
		return err
	}
	if err != nil {
		r.log.Warn("record a synchronous refusal", "err", err)
	}
	return &wire.Error{Status: status, Type: e.Type, Code: e.Code, Param: e.Param, Message: e.Message, RetryAfter: retryAfter}
}

// fail marks the job failed for good.
func (r *run) fail(ctx context.Context, e store.JobError, pe *llm.Error) error {
	p := &store.JobFailParams{ID: r.job.ID, Error: e, CountAttempt: pe != nil}
	switch {
	case pe != nil && pe.StatusCode >= 400:
		p.ResponseStatus = pe.StatusCode
	case pe != nil && pe.StatusCode > 0:
		// a 2xx answer llmq could not read or take: failed, never a success
		p.ResponseStatus = http.StatusBadGateway
	}
	_, applied, err := r.h.Store.JobFail(ctx, p)
	r.moved = r.moved || err == nil
	if err != nil {
		return fmt.Errorf("fail job %s: %w", r.job.ID, err)
	}
	r.log.Warn("job failed", "code", e.Code, "err", e.Message)
	if applied {
		r.h.Observer.JobFinished(r.job.TenantID, r.tier, r.job.Model, string(store.JobFailed), 0, 0, 0)
		r.notify(ctx)
	}
	return nil
}

// providerError is the job error of a provider's refusal, in OpenAI's shape.
func providerError(pe *llm.Error) store.JobError {
	e := store.JobError{Message: pe.Message, Type: pe.Type, Code: pe.Code, Param: pe.Param}
	if e.Type == "" {
		switch pe.Class {
		case llm.ClassRateLimited:
			e.Type = wire.TypeRateLimit
		case llm.ClassPermanent:
			e.Type = wire.TypeInvalidRequest
		default:
			e.Type = wire.TypeServer
		}
	}
	if e.Code == "" && pe.StatusCode > 0 {
		e.Code = client.Code(fmt.Sprintf("http_%d", pe.StatusCode))
	}
	e.Message = cmp.Or(e.Message, http.StatusText(pe.StatusCode))
	return e
}

// setStatus records a non-terminal status; a failure is only logged (the
// task's own state brings the job back).
func (r *run) setStatus(ctx context.Context, to store.JobStatus, next *time.Time, countAttempt bool) {
	_, _, err := r.h.Store.JobSetStatus(context.WithoutCancel(ctx), &store.JobSetStatusParams{
		ID: r.job.ID, From: []store.JobStatus{store.JobQueued, store.JobRunning, store.JobWaiting, store.JobDeferred},
		To: to, NextRunAt: next, CountAttempt: countAttempt,
	})
	r.moved = r.moved || err == nil
	if err != nil {
		r.log.Warn("record job status", "status", to, "err", err)
	}
	r.log.Debug("job state", "status", to)
	r.h.Observer.JobState(r.tier, r.job.Model, string(to))
}

func (r *run) releaseBudget(ctx context.Context) {
	if r.bres == nil {
		return
	}
	r.keep()
	if err := r.h.Budgets.Release(context.WithoutCancel(ctx), r.bres); err != nil {
		r.log.Warn("release budget", "err", err)
	}
	r.bres = nil
}

func (r *run) releaseAll(ctx context.Context) {
	if r.permit != nil {
		if err := r.h.Pacer.Release(ctx, r.permit); err != nil {
			r.log.Warn("release rate limit", "err", err)
		}
		r.permit = nil
	}
	r.releaseBudget(ctx)
}

func (r *run) notify(ctx context.Context) {
	if r.job.WebhookURL == "" || r.h.Queue == nil {
		return
	}
	if _, err := r.h.Queue.EnqueueWebhook(context.WithoutCancel(ctx), queue.WebhookPayload{Kind: store.WebhookJob, ID: r.job.ID}); err != nil {
		r.log.Warn("enqueue webhook", "err", err)
	}
}

// sleep waits d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// tenantCache keeps tenant rows for tenantTTL.
type tenantCache struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string]cachedTenant
}

const tenantTTL = 5 * time.Second

type cachedTenant struct {
	t  *store.Tenant
	at time.Time
}

func (c *tenantCache) get(ctx context.Context, db *store.DB, id string) (*store.Tenant, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < tenantTTL {
		return e.t, nil
	}
	t, err := db.TenantGetByID(ctx, id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.m) > 10_000 {
		clear(c.m)
	}
	c.m[id] = cachedTenant{t: t, at: now}
	c.mu.Unlock()
	return t, nil
}
