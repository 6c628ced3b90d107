// Package worker runs llmq's jobs: it loads a job from the store, reserves
// its worst-case cost from the tenant's budget, takes a permit from the
// model's rate limiter, calls the provider, and settles all three with the
// real usage — storing the result and the job's one ledger row.
//
// Rate-limit waits, 429s and budget deferrals put the task back in its queue
// without counting a failure; provider faults are retried with backoff and
// counted; a request the provider refuses for good fails at once. A task
// delivered twice never calls the provider again once its job has finished:
// it only makes sure the finished job's charge is in its day's spend (a
// delivery that died between storing the result and settling left it out),
// settling it from the ledger row, which charges a job once.
package worker

import (
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
	// longer waits put the task back in its queue for that long (asynq's
	// delays have whole-second resolution, so short waits are better slept).
	// Defaults to 10s.
	MaxInlineWait time.Duration
	// MaxRateLimited is how many 429s a job may receive before it fails.
	// Defaults to 25.
	MaxRateLimited int
	// OutageWait is how long, from its creation, a job whose every
	// deployment (and fallback) failed its call waits for one to come back
	// without counting a failure; past it, such faults count toward its
	// retries as a single provider's do. Defaults to 15m.
	OutageWait time.Duration
	// TenantCacheTTL is how long a tenant row is reused between jobs, so a
	// change of tier or budget applies within this time. Defaults to 5s.
	TenantCacheTTL time.Duration
	// Breakers tune the per-provider circuit breakers. Defaults to
	// BreakerOptions' defaults.
	Breakers BreakerOptions
	// Now is the clock for job timestamps the handler computes. Defaults to time.Now.
	Now func() time.Time
	// Lease is the worker process's hold on the jobs it starts (a
	// worker's Server beats it). Defaults to none: the jobs a handler
	// without one starts are never handed off (synchronous requests).
	Lease *Lease
}

// validate reports, naming the field, an option that is invalid: a
// negative count or duration (zero means the default).
func (o Options) validate() error {
	if o.MaxInlineWait < 0 {
		return fmt.Errorf("worker: Options.MaxInlineWait must not be negative, got %v", o.MaxInlineWait)
	}
	if o.OutageWait < 0 {
		return fmt.Errorf("worker: Options.OutageWait must not be negative, got %v", o.OutageWait)
	}
	if o.MaxRateLimited < 0 {
		return fmt.Errorf("worker: Options.MaxRateLimited must not be negative, got %d", o.MaxRateLimited)
	}
	if o.TenantCacheTTL < 0 {
		return fmt.Errorf("worker: Options.TenantCacheTTL must not be negative, got %v", o.TenantCacheTTL)
	}
	return o.Breakers.validate()
}

func (o Options) withDefaults() Options {
	if o.MaxInlineWait == 0 {
		o.MaxInlineWait = 10 * time.Second
	}
	if o.OutageWait == 0 {
		o.OutageWait = 15 * time.Minute
	}
	if o.MaxRateLimited == 0 {
		o.MaxRateLimited = 25
	}
	if o.TenantCacheTTL == 0 {
		o.TenantCacheTTL = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Deps are what a Handler works with.
type Deps struct {
	Store  *store.DB
	Policy *config.PolicyHolder
	// Pacer takes and settles the rate-limit permit of every provider call.
	Pacer     *pacer.Pacer
	Budgets   *budget.Budgets
	Providers *Providers
	Queue     *queue.Client // for webhook deliveries, and the fair queue
	Logger    *slog.Logger
	// Observer is told what happens, for metrics. Defaults to none.
	Observer Observer
}

// Handler processes TypeJob tasks.
type Handler struct {
	Deps
	opts     Options
	tenants  tenantCache
	breakers *Breakers
}

// NewHandler returns a Handler, or an error naming an option that is
// invalid.
func NewHandler(d Deps, opts Options) (*Handler, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Observer == nil {
		d.Observer = nopObserver{}
	}
	o := opts.withDefaults()
	breakers, err := NewBreakers(o.Breakers, d.Observer, o.Now)
	if err != nil {
		return nil, err
	}
	return &Handler{Deps: d, opts: o, tenants: tenantCache{ttl: o.TenantCacheTTL, now: o.Now, m: map[string]cachedTenant{}},
		breakers: breakers}, nil
}

// BreakerState returns the state of a deployment's circuit breaker (by its
// limiter scope) in this process.
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
	h   *Handler
	job *store.Job
	log *slog.Logger
	// shape is what of the job's body bounds its bill (its output limit
	// and tool calls written in, its service tier, tools, stored
	// conversation), read once a run; stores is set when the provider
	// stores its answer (a Responses API call without store: false).
	shape  admission.Shape
	stores bool
	// worst is the budget's worst case: the most any route the job may
	// take could bill for it.
	worst  money.Micros
	call   *pacer.Call // the call on the route the permit is for
	routes *router
	scope  string // the model's fair queue; "" when the policy no longer serves it
	acct   budget.Account
	tier   string
	reject bool // the tier rejects work once its budget is spent
	bres   *budget.Reservation
	keep   func() // stops extending bres
	permit *limiter.Reservation
	wait   time.Duration // the pause after a 429
	left   bool          // the fair queue was told (leave)
	moved  bool          // the store took a move of the job (which lets go of it)
}

// leave tells the fair queue, once, that the job is past its permit.
func (r *run) leave(ctx context.Context) {
	if !r.left {
		r.left = true
		if r.scope != "" {
			r.h.leftFairQueue(ctx, r.scope, r.job.ID)
		}
	}
}

// Run processes job id once. It returns nil when the task is done with (the
// job reached a terminal state, or there is nothing to do), a *queue.Retry error
// to come back later, or another error for asynq to retry.
func (h *Handler) Run(ctx context.Context, id string) error {
	if !h.opts.Lease.Fresh() {
		// The reconciler may take this process for dead and hand its jobs
		// on: start none until a beat gets through.
		return &queue.Retry{Reason: "this worker's lease in the store is stale", Delay: store.WorkerBeatInterval}
	}
	// Loading the job marks it running, held by this worker (one round
	// trip).
	job, started, err := h.Store.JobStart(ctx, id, h.opts.Lease.ID())
	if errors.Is(err, store.ErrNotFound) {
		h.Logger.Warn("task for a job that does not exist", "job", id)
		return nil
	}
	if err != nil {
		return fmt.Errorf("load job %s: %w", id, err)
	}
	if !started && !job.Status.Terminal() {
		// Another worker, alive, runs it: this is a second delivery (a
		// task asynq recovered after a failover, or the one a hand-off
		// replaced).
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
	if !r.moved && h.opts.Lease != nil {
		// Every move of the job lets go of it; a delivery that ended
		// without one lets go here, so its next delivery may start anywhere.
		if rerr := h.Store.JobRelease(context.WithoutCancel(ctx), id, h.opts.Lease.ID()); rerr != nil {
			r.log.Warn("let go of the job", "err", rerr)
		}
	}
	return err
}

// leftFairQueue tells the fair queue of scope that job id has its permit
// (or will not wait for one here): it no longer counts as released, so the
// scheduler releases the next jobs as the limiter admits them. A failure
// only delays the next releases of its model until the scheduler's stale
// check.
func (h *Handler) leftFairQueue(ctx context.Context, scope, id string) {
	if h.Queue == nil {
		return
	}
	// A task cancelled at shutdown still has left the fair queue.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := h.Queue.Started(ctx, scope, id); err != nil {
		h.Logger.Warn("mark a job started in its fair queue", "job", id, "err", err)
	}
}

// settleFinished makes sure a finished job's charge is in its day's spend.
// A worker that died between storing the result and settling the budget
// (or whose Settle kept failing) left the reservation open, or to expire
// unsettled, and Redis's spend below the ledger: this delivery settles it
// from the job's ledger row. Settle charges a job once, so a job settled
// before costs nothing more.
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

// settleRetryDelay is how soon a job whose settlement failed comes back to
// settle again.
const settleRetryDelay = 5 * time.Second

func (r *run) do(ctx context.Context) error {
	defer r.leave(ctx)
	h := r.h
	p := h.Policy.Current()
	m, ok := p.Model(r.job.Model)
	if !ok {
		return r.fail(ctx, store.JobError{Type: wire.TypeInvalidRequest, Code: client.CodeModelNotFound, Param: "model",
			Message: fmt.Sprintf("The model '%s' is no longer served here.", r.job.Model)}, nil)
	}
	r.scope = m.Queue()
	tenant, err := h.tenants.get(ctx, h.Store, r.job.TenantID)
	if err != nil {
		return fmt.Errorf("load tenant %s: %w", r.job.TenantID, err)
	}
	acct, tier, err := admission.Account(p, tenant)
	if err != nil {
		return r.fail(ctx, store.JobError{Type: wire.TypeServer, Code: client.CodeTierNotFound, Message: err.Error()}, nil)
	}
	r.tier, r.reject = tier.Name, tier.OnExhausted == config.OnExhaustedReject
	// JobStart moved the job to running; its tier is known from here.
	r.log.Debug("job state", "status", store.JobRunning)
	h.Observer.JobState(r.tier, r.job.Model, string(store.JobRunning))
	// The estimate was made at enqueue; prices, limits and the prompt's
	// calibration come from what is in force now.
	r.acct = acct
	if refusal, err := r.plan(ctx, p, m, tier); err != nil {
		return err
	} else if refusal != nil {
		return r.fail(ctx, *refusal, nil)
	}

	// The budget first: a job it refuses takes no permit. It holds the
	// worst case on the dearest route the job may take.
	bres, dec, err := h.Budgets.Reserve(ctx, r.acct, r.job.ID, r.worst)
	if done, err := r.budgetDecided(ctx, bres, dec, err); done {
		return err
	}
	r.keep = r.keepReservation(ctx)
	defer r.keep()
	for {
		done, err := r.takePermit(ctx)
		r.leave(ctx)
		if done {
			r.releaseBudget(ctx)
			return err
		}
		again, err := r.callRoute(ctx)
		if !again {
			return err
		}
	}
}

// callRoute calls the provider on the route of the run's permit. again is
// true when the run goes on to another route (failover) instead of ending
// with err.
func (r *run) callRoute(ctx context.Context) (again bool, err error) {
	h := r.h
	route := r.call.Route
	name := r.call.Scope.Name
	provider, ok := h.Providers.Get(route.Provider)
	if !ok {
		r.releaseAll(ctx)
		return false, r.fail(ctx, store.JobError{Type: wire.TypeServer, Code: client.CodeProviderNotFound,
			Message: fmt.Sprintf("The provider '%s' of model '%s' is not configured.", route.Provider, route.Model.Name)}, nil)
	}
	began := time.Now()
	resp, err := provider.Call(ctx, r.shape.Request(route, r.job.Request))
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
		return false, r.succeeded(ctx, resp, r.accept(ctx, resp, pe), outcome)
	}
	again = r.failover(ctx, pe)
	r.settlePermit(ctx, outcome)
	switch {
	case again || ctx.Err() != nil || pe.Class == llm.ClassRateLimited:
		h.breakers.Done(name)
	default:
		h.breakers.Record(name, pe.Class == llm.ClassRetryable)
	}
	if again {
		return true, nil
	}
	if r.routes.allDown && ctx.Err() == nil && h.opts.Now().Sub(r.job.CreatedAt) < h.opts.OutageWait {
		// Every deployment the job may use failed it: it waits for one to
		// come back (their pauses let a probe through each second).
		r.releaseAll(ctx)
		delay := outageRetry + time.Duration(rand.Int64N(int64(outageRetry)))
		next := h.opts.Now().Add(delay)
		r.setStatus(ctx, store.JobWaiting, &next, false)
		return false, &queue.Retry{Reason: "every deployment of model " + r.job.Model + " is failing", Delay: delay}
	}
	return false, r.callFailed(ctx, err)
}

// outageRetry is about how soon a job whose every deployment failed comes
// back (up to twice this, spread).
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

// plan reads the job's body for its shape, with the policy p in force and
// its tenant's tier, and makes the run's routes, its first call and its
// worst case. A body that can no longer run (the policy changed, or the
// conversation it continues is gone) is the job's error (refusal); a store
// that cannot tell now is err, for the run to come back.
func (r *run) plan(ctx context.Context, p *config.Policy, m *config.Model, tier *config.Tier) (refusal *store.JobError, err error) {
	b, err := llm.Decode(r.job.Endpoint, r.job.Request)
	if err == nil {
		r.shape, _, err = admission.ShapeOf(ctx, r.h.Store, p, tier, r.job.TenantID, m, b)
	}
	fallbacks := admission.Fallbacks(m, r.job.Fallbacks)
	if err == nil {
		err = admission.Routable(p, m, fallbacks, &r.shape)
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
	r.call = r.h.Pacer.Plan(ctx, r.routes.candidates()[0], &r.shape, r.job.EstPromptTokens, r.job.EstMaxTokens)
	r.worst = admission.WorstCase(p, m, fallbacks, &r.shape, r.call.Calibration, r.job.EstPromptTokens, r.job.EstMaxTokens)
	return nil, nil
}

// budgetDecided acts on the reservation of the worst-case cost. done is
// true when the run must stop here (deferred, failed, or an error).
func (r *run) budgetDecided(ctx context.Context, res *budget.Reservation, dec *budget.Decision, err error) (done bool, _ error) {
	if err != nil {
		return true, fmt.Errorf("reserve budget: %w", err)
	}
	if dec.SoftLimitCrossed {
		// Budgets logs the crossing; the observer counts it.
		r.h.Observer.SoftLimitCrossed(r.acct.TenantID, r.tier)
	}
	if dec.Allowed {
		r.bres = res
		return false, nil
	}
	n := dec.Denial()
	if n.TooLarge {
		return true, r.fail(ctx, store.JobError{Type: wire.TypeBudget, Code: client.CodeBudgetTooSmall,
			Message: fmt.Sprintf("This job may cost up to $%s, more than the whole %s of $%s; it can never run.", r.worst, n.Name(), n.Budget)}, nil)
	}
	if dec.Held {
		// Only what running jobs hold is in the way, and they settle at
		// most what they hold: the job waits its turn (its place among the
		// day's waiters kept by coming back within budget.WaitTTL), on a
		// rejecting tier too, and is neither deferred nor failed.
		delay := budget.HeldRetryAfter + time.Duration(rand.Int64N(int64(budget.HeldRetryAfter)))
		next := r.h.opts.Now().Add(delay)
		r.setStatus(ctx, store.JobWaiting, &next, false)
		r.log.Debug("job waiting: the budget is held by running jobs", "cap", dec.DeniedBy)
		return true, &queue.Retry{Reason: "the " + dec.DeniedBy + " daily budget is held by running jobs", Delay: delay}
	}
	if r.reject {
		return true, r.fail(ctx, store.JobError{Type: wire.TypeBudget, Code: client.CodeBudgetExhausted,
			Message: fmt.Sprintf("The %s is exhausted ($%s spent and $%s reserved of $%s; this job may cost up to $%s) and the %s tier rejects work until it resets at %s.",
				n.Name(), n.Spent, n.Reserved, n.Budget, r.worst, r.tier, n.ResetsAt.UTC().Format(time.RFC3339))}, nil)
	}
	next := r.h.opts.Now().Add(dec.RetryAfter)
	r.setStatus(ctx, store.JobDeferred, &next, false)
	r.log.Debug("job deferred: over budget", "cap", dec.DeniedBy, "until", dec.ResetsAt)
	// Spread the deferred jobs over a little while after the reset.
	delay := dec.RetryAfter + time.Duration(rand.Int64N(int64(5*time.Second)))
	return true, &queue.Retry{Reason: "over the " + dec.DeniedBy + " daily budget", Delay: delay}
}

// takePermit takes one request and the estimated tokens from every bucket
// of the first route that admits the job now (see router), sleeping short
// waits and requeueing for long ones. When every deployment of the model is
// paused or failing, the job goes to its fallbacks. A permit goes back to
// the synchronous requests holding room in the scope, if any.
func (r *run) takePermit(ctx context.Context) (done bool, err error) {
	began := time.Now()
	for {
		granted, p, err := r.reservePass(ctx, r.yieldToSync)
		if err != nil {
			return true, err
		}
		if granted {
			r.h.Observer.LimiterWait(r.job.Model, time.Since(began), false)
			return false, nil
		}
		if p.tooLarge != nil {
			return true, r.fail(ctx, store.JobError{Type: wire.TypeInvalidRequest, Code: client.CodeTokensExceedCapacity, Param: "max_tokens",
				Message: fmt.Sprintf("This job needs %d tokens, more than a bucket of model '%s' holds: %v", r.job.EstPromptTokens+r.job.EstMaxTokens, r.job.Model, p.tooLarge)}, nil)
		}
		if p.unavailable && r.routes.toFallbacks() {
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

// yieldToSync gives a granted permit back when synchronous requests hold
// room in its scope: they go first (docs/ARCHITECTURE.md), and a job
// released before they came would otherwise race them for every refill.
func (r *run) yieldToSync(ctx context.Context, scope string, res *limiter.Result) bool {
	return r.syncHolding(ctx, scope) && r.yieldPermit(ctx, res.Reservation)
}

// settlePermit settles the permit of the call that ended as o (the pacer
// learns from its answer, and after a 429 pauses the scope).
func (r *run) settlePermit(ctx context.Context, o pacer.Outcome) {
	after := r.h.Pacer.Done(ctx, r.call, r.permit, o)
	r.permit, r.wait = nil, after.Wait
}

// succeeded settles a provider's 2xx answer as v judged it: it stores the
// result and the ledger row, once (an answer that cannot be taken is a
// failure, charged all the same), then settles the permit and the budget,
// then sends the webhook.
func (r *run) succeeded(ctx context.Context, resp *llm.Response, v verdict, o pacer.Outcome) error {
	u, cost := v.usage, v.cost
	p := &store.JobCompleteParams{
		ID: r.job.ID, Day: r.bres.Day, GlobalDay: r.bres.GlobalDay,
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
		CachedTokens: u.CachedTokens, TotalTokens: u.TotalTokens, Cost: cost, UsageEstimated: v.estimated, Failed: v.failed,
		Deployment: r.call.Scope.Name, ServedModel: r.call.Route.Model.Name,
	}
	if resp != nil {
		p.ResponseStatus, p.ResponseBody, p.ProviderRequestID = resp.StatusCode, resp.Body, resp.RequestID
	}
	if v.failed != nil {
		// The answer is not the client's: it stays out of the job.
		p.ResponseStatus, p.ResponseBody = http.StatusBadGateway, nil
	}
	if v.estimated && resp != nil {
		// Nothing the provider said of its usage teaches the pacer.
		quiet := *resp
		quiet.Usage = llm.Usage{}
		o.Response = &quiet
	}
	res, err := r.h.Store.JobComplete(ctx, p)
	r.moved = r.moved || err == nil
	if err != nil {
		// The result may have been stored all the same: keep the
		// reservation, so the next delivery settles it (the job finished)
		// or runs under it again (it did not).
		r.stopKeeping()
		r.settlePermit(ctx, o)
		return fmt.Errorf("store result of %s: %w", r.job.ID, err)
	}
	// The permit and the budget are settled at the same time: each is its
	// own Redis script, and neither needs the other's answer.
	var settled sync.WaitGroup
	settled.Go(func() { r.settlePermit(ctx, o) })
	settleErr := r.settle(ctx, cost, res.Charged)
	settled.Wait()
	status := store.JobSucceeded
	if v.failed != nil {
		status = store.JobFailed
		r.log.Warn("job failed, charged", "code", v.failed.Code, "err", v.failed.Message)
	}
	r.log.Debug("job "+string(status), "prompt_tokens", u.PromptTokens, "completion_tokens", u.CompletionTokens, "cost", cost,
		"usage_estimated", v.estimated)
	if res.Completed {
		r.h.Observer.JobFinished(r.acct.TenantID, r.tier, r.job.Model, string(status), u.PromptTokens, u.CompletionTokens, int64(cost))
		r.notify(ctx)
	}
	if settleErr != nil {
		// The ledger has the charge; the next delivery of the finished job
		// settles it (settleFinished), before the reservation lapses.
		r.log.Warn("settle budget; the job comes back to settle", "err", settleErr)
		return &queue.Retry{Reason: "settle the budget", Delay: settleRetryDelay, Cause: settleErr}
	}
	return nil
}

// settle charges the job's cost to its budget day, retrying a few times:
// until it lands, Redis's spend is below the ledger's. When another
// delivery of the job wrote the ledger row (charged is false), the cost
// charged is the row's, on the row's days: Settle charges a job once per
// day, whichever delivery settles first, so the days must be the ones the
// ledger counts it on (this delivery may have reserved on the next day,
// past midnight); this delivery's own reservation is then given back.
func (r *run) settle(ctx context.Context, cost money.Micros, charged bool) error {
	r.stopKeeping()
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
// while the run holds it, so that no limiter wait or provider call, however
// long, outlives it: a lapsed reservation's room could go to another job
// while this one still spends. It is a timer, not a goroutine: most jobs end
// long before the first extension is due. The returned func stops it and
// waits for an extension under way.
func (r *run) keepReservation(ctx context.Context) (stop func()) {
	res, every := r.bres, r.h.Budgets.ReservationTTL()/3
	ctx = context.WithoutCancel(ctx)
	var (
		mu      sync.Mutex
		stopped bool
		busy    sync.WaitGroup
		t       *time.Timer
	)
	extend := func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		busy.Add(1)
		mu.Unlock()
		defer busy.Done()
		held, err := r.h.Budgets.Extend(ctx, res)
		switch {
		case err != nil:
			r.log.Warn("extend budget reservation", "err", err)
		case !held:
			r.log.Warn("budget reservation lapsed while the job ran", "day", res.Day)
			return
		}
		mu.Lock()
		if !stopped {
			t.Reset(every)
		}
		mu.Unlock()
	}
	mu.Lock()
	t = time.AfterFunc(every, extend)
	mu.Unlock()
	return sync.OnceFunc(func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		busy.Wait()
	})
}

// stopKeeping stops extending the reservation (before it is settled or
// released, so no extension races the end of the hold).
func (r *run) stopKeeping() {
	if r.keep != nil {
		r.keep()
	}
}

// callFailed handles a provider error by its class.
func (r *run) callFailed(ctx context.Context, callErr error) error {
	var pe *llm.Error
	if !errors.As(callErr, &pe) {
		pe = &llm.Error{Class: llm.ClassRetryable, Message: callErr.Error(), Err: callErr}
	}
	// The permit was settled by the pacer (which paused the scope after a
	// 429); the budget reservation goes back.
	if ctx.Err() != nil { // shutting down: asynq puts the task back, not a failure
		r.releaseAll(ctx)
		r.setStatus(ctx, store.JobQueued, nil, false)
		return ctx.Err()
	}
	r.releaseAll(ctx)
	switch pe.Class {
	case llm.ClassRateLimited:
		return r.rateLimited(ctx, pe)
	case llm.ClassPermanent:
		return r.fail(ctx, providerError(pe), pe)
	default:
		return r.retry(ctx, pe)
	}
}

// rateLimited pauses the whole scope until the provider's reset and puts
// the job back without counting a failure, up to MaxRateLimited times.
func (r *run) rateLimited(ctx context.Context, pe *llm.Error) error {
	n, err := r.h.Store.JobIncrRateLimited(ctx, r.job.ID)
	if err != nil {
		return fmt.Errorf("count 429 of %s: %w", r.job.ID, err)
	}
	wait := r.wait
	r.log.Debug("provider answered 429", "count", n, "wait", wait)
	if n >= r.h.opts.MaxRateLimited {
		e := providerError(pe)
		e.Code = client.CodeRateLimitExceeded
		e.Message = fmt.Sprintf("The provider answered 429 (rate limited) %d times; giving up. Last answer: %s", n, pe.Message)
		return r.fail(ctx, e, pe)
	}
	next := r.h.opts.Now().Add(wait)
	r.setStatus(ctx, store.JobWaiting, &next, true)
	// Back after the reset; the limiter lets one probe through first.
	return &queue.Retry{Reason: "rate limited by the provider", Delay: wait}
}

// retry counts a provider fault and retries with backoff, or fails the job
// when its retries are used up.
func (r *run) retry(ctx context.Context, pe *llm.Error) error {
	maxRetry, ok := asynq.GetMaxRetry(ctx)
	if !ok {
		maxRetry = queue.DefaultMaxRetry
	}
	// asynq's count of failed deliveries starts again when the reconciler
	// revives an archived task; the job's own count of the provider's faults
	// (its attempts that were not 429s) does not, so the ceiling holds.
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

// fail marks the job failed for good and acknowledges the task.
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
	if e.Message == "" {
		e.Message = http.StatusText(pe.StatusCode)
	}
	return e
}

// setStatus records a non-terminal status, counting the attempt when a
// provider call ended this way; a failure to record it is logged, not
// fatal: the task's own state is what brings the job back.
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
	r.stopKeeping()
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

// notify enqueues the job's webhook when it has one.
func (r *run) notify(ctx context.Context) {
	if r.job.WebhookURL == "" || r.h.Queue == nil {
		return
	}
	if _, err := r.h.Queue.EnqueueWebhook(context.WithoutCancel(ctx), queue.WebhookPayload{Kind: store.WebhookJob, ID: r.job.ID}); err != nil {
		r.log.Warn("enqueue webhook", "err", err)
	}
}

// tenantCache keeps tenant rows for a few seconds: every job needs its
// tenant, and tenants change rarely.
type tenantCache struct {
	mu  sync.Mutex
	ttl time.Duration
	now func() time.Time
	m   map[string]cachedTenant
}

type cachedTenant struct {
	t  *store.Tenant
	at time.Time
}

func (c *tenantCache) get(ctx context.Context, db *store.DB, id string) (*store.Tenant, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < c.ttl {
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
