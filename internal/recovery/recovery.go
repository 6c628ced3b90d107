// Package recovery keeps the store and Redis in agreement so no job is ever
// lost: a reconciler re-enqueues every unfinished job whose task is missing
// from Redis (a Redis restart without persistence, a FLUSHALL, an enqueue
// that failed after the job's row was committed), and notices a loss by the
// epoch key's absence. What lived only in Redis is rebuilt or reset: tasks
// and webhook deliveries are enqueued again from the store, budget days are
// checked against the ledger, and after a loss with jobs in flight every
// model is paused for LossPause (the limiters' state is unknowable).
package recovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/loop"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Options tune a Reconciler.
type Options struct {
	// CheckInterval is how often the reconciler looks for a Redis loss and
	// for workers that stopped beating. Defaults to 2s.
	CheckInterval time.Duration
	// MinAge skips jobs changed more recently than this. Defaults to 10s.
	MinAge time.Duration
	// LossPause is how long every model is paused after a Redis loss with
	// jobs in flight. Defaults to 1m; negative disables the pause.
	LossPause time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Reconciler re-enqueues jobs whose tasks are missing.
type Reconciler struct {
	Store     *store.DB
	Redis     redis.UniversalClient
	Keys      rkeys.Builder
	Queue     *queue.Client
	Inspector *queue.Inspector
	Limiter   *limiter.TokenBucket
	Policy    *config.PolicyHolder
	Budgets   *budget.Budgets // when set, today's days are checked against the ledger
	Logger    *slog.Logger
	opts      Options
	identity  string    // the Redis masters' run ids at the last check: a change is a failover or restart
	recheckAt time.Time // when the pass after a failover runs once more
}

const (
	// failoverRecheck is how long after a failover its pass runs again.
	failoverRecheck = 15 * time.Second
	// fullInterval is how often every unfinished job is checked even when
	// Redis lost nothing.
	fullInterval = time.Minute
)

// New returns r with opts, zero options defaulted.
func New(r Reconciler, opts Options) *Reconciler {
	r.opts = Options{
		CheckInterval: cmp.Or(opts.CheckInterval, 2*time.Second),
		MinAge:        cmp.Or(opts.MinAge, 10*time.Second),
		LossPause:     cmp.Or(opts.LossPause, time.Minute),
		Now:           opts.Now,
	}
	if r.opts.Now == nil {
		r.opts.Now = time.Now
	}
	r.Logger = cmp.Or(r.Logger, slog.New(slog.DiscardHandler))
	return &r
}

// Report says what one pass did.
type Report struct {
	Scanned  int // unfinished jobs looked at
	Requeued int // jobs whose task was missing and is enqueued again
	Revived  int // jobs whose task was archived by asynq and is enqueued again
	Failed   int // jobs failed because their worker was gone at the end of their last delivery
	Webhooks int // webhook deliveries of finished jobs and batches enqueued again
	Resent   int // archived tasks of succeeded or cancelled jobs sent back to settle their charge
	Dropped  int // archived tasks of failed or deleted jobs dropped
	// BudgetDaysRaised counts the budget days raised to the ledger;
	// Recharged the ledger rows that charged them.
	BudgetDaysRaised, Recharged int
	LegacyQueues                int // per-priority asynq queues of older versions deleted with their tasks
}

// Run reconciles until ctx ends: at once, then after a Redis loss and every
// minute, one process at a time (a store lock).
func (r *Reconciler) Run(ctx context.Context) {
	var last time.Time
	check := func(ctx context.Context) error {
		if n, err := r.HandOff(ctx); err != nil && ctx.Err() == nil {
			r.Logger.Warn("reconciler: hand off the jobs of stopped workers", "err", err)
		} else if n > 0 {
			r.Logger.Info("reconciler handed off the running jobs of a stopped worker", "jobs", n)
		}
		lost, err := r.lost(ctx)
		failover := false
		if err == nil {
			failover = r.failedOver(ctx)
		}
		switch {
		case failover:
			// Once more a little later: an old master may take writes for
			// seconds after its replica's promotion, and they are lost.
			r.recheckAt = r.opts.Now().Add(failoverRecheck)
		case !r.recheckAt.IsZero() && !r.opts.Now().Before(r.recheckAt):
			failover, r.recheckAt = true, time.Time{}
		}
		if err != nil && ctx.Err() == nil {
			r.Logger.Warn("reconciler: cannot reach redis", "err", err)
		}
		if err != nil || !lost && !failover && r.opts.Now().Sub(last) < fullInterval {
			return nil
		}
		rep, ran, err := r.locked(ctx, lost, failover)
		if err != nil && ctx.Err() == nil || !ran {
			return err
		}
		last = r.opts.Now()
		if rep.LegacyQueues > 0 {
			r.Logger.Info("reconciler deleted the per-priority queues of an older version",
				"queues", rep.LegacyQueues)
		}
		if rep.Requeued+rep.Revived+rep.Failed+rep.Webhooks+rep.Resent+rep.Dropped+rep.Recharged > 0 {
			r.Logger.Info("reconciler re-enqueued jobs", "requeued", rep.Requeued, "revived", rep.Revived,
				"failed", rep.Failed, "webhooks", rep.Webhooks, "resent", rep.Resent, "dropped", rep.Dropped,
				"budget_days_raised", rep.BudgetDaysRaised, "recharged", rep.Recharged,
				"scanned", rep.Scanned)
		}
		return nil
	}
	loop.Every(ctx, r.opts.CheckInterval, true, check, r.Logger, "reconciler pass failed")
}

// HandOff gives the running jobs of worker processes not seen for
// store.WorkerDeadAfter to other workers, each with a task of its own, and
// returns how many it handed off. A job is handed off once; should its
// enqueue fail, the full pass enqueues it.
func (r *Reconciler) HandOff(ctx context.Context) (int, error) {
	n := 0
	for {
		jobs, err := r.Store.JobHandOff(ctx, handOffPage)
		if err != nil {
			return n, err
		}
		for _, j := range jobs {
			if j.Attempts-j.RateLimited > queue.DefaultMaxRetry {
				// Each of its deliveries ended with its worker dead: it may
				// be what kills them.
				if err := r.failWorkerLost(ctx, j, j.Attempts-j.RateLimited, nil, &Report{}); err != nil {
					return n, err
				}
				continue
			}
			ref := queue.JobRef{ID: j.ID, Priority: j.Queue}
			if _, err := r.Queue.EnqueueHandOff(ctx, ref, strconv.FormatInt(r.opts.Now().UnixMilli(), 36)); err != nil {
				return n, err
			}
			n++
		}
		if len(jobs) < handOffPage {
			return n, nil
		}
	}
}

const handOffPage = 500

// lost reports whether Redis lost llmq's state since the last pass.
func (r *Reconciler) lost(ctx context.Context) (bool, error) {
	n, err := r.Redis.Exists(ctx, r.Keys.Epoch()).Result()
	return n == 0, err
}

// failedOver reports whether Redis's masters changed since the last check:
// the new master may be a replica that lagged, with the epoch key all the
// same. The first check only learns them.
func (r *Reconciler) failedOver(ctx context.Context) bool {
	id, err := redisIdentity(ctx, r.Redis)
	if err != nil {
		// A Redis without INFO server, or not answering: look again next time.
		r.Logger.Debug("reconciler: redis masters' run ids", "err", err)
		return false
	}
	changed := r.identity != "" && id != r.identity
	if changed {
		r.Logger.Warn("redis master changed (a failover or restart): checking every unfinished job and the budgets against the store")
	}
	r.identity = id
	return changed
}

// redisIdentity is the run ids of rdb's masters, sorted.
func redisIdentity(ctx context.Context, rdb redis.UniversalClient) (string, error) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var ids []string
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			id, err := runID(ctx, c)
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			return err
		})
		slices.Sort(ids)
		return strings.Join(ids, ","), err
	}
	return runID(ctx, rdb)
}

func runID(ctx context.Context, c redis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v, nil
		}
	}
	return "", errors.New("redis INFO server has no run_id")
}

// locked runs one pass if no other process is running one. It checks
// today's budget days against the ledger; after a failover (or a loss) it
// looks at every unfinished job, however recent, and charges every ledger
// row a day does not count, the newest too.
func (r *Reconciler) locked(ctx context.Context, lost, failover bool) (Report, bool, error) {
	unlock, ok, err := r.Store.TryLock(ctx, "reconciler")
	if err != nil || !ok {
		return Report{}, false, err
	}
	defer unlock()
	if lost {
		// Checked again under the lock: another process may have handled it.
		if lost, err = r.lost(ctx); err != nil {
			return Report{}, false, err
		}
	}
	if lost {
		busy, _, err := r.Store.JobListUnfinished(ctx, &store.JobListUnfinishedParams{Limit: 1})
		if err != nil {
			return Report{}, false, err
		}
		if len(busy) > 0 {
			r.Logger.Warn("redis lost llmq's state: re-enqueueing unfinished jobs and pausing every model", "pause", r.opts.LossPause)
			r.pauseModels(ctx)
		}
	}
	minAge := r.opts.MinAge
	if lost || failover {
		// Redis holds no task at all: even a job created a moment ago may
		// have lost its, and enqueueing one twice is a no-op.
		minAge = 0
	}
	rep, err := r.reconcileAll(ctx, minAge)
	if err == nil && failover && !lost {
		err = r.requeueReleased(ctx, &rep)
	}
	if err == nil {
		reason := budget.RaisedPeriodic
		if lost || failover {
			reason = budget.RaisedRestored
		}
		var c budget.CheckReport
		c, err = r.CheckBudgets(ctx, reason)
		rep.BudgetDaysRaised, rep.Recharged = c.Raised, c.Rows
	}
	if err == nil && (lost || failover) {
		// A lagging replica may lack asynq's list of queues, which its
		// inspector reads ("queue not found").
		err = queue.RegisterQueues(ctx, r.Redis, r.Queue.Namespace())
	}
	if err == nil && lost {
		err = r.Redis.Set(ctx, r.Keys.Epoch(), r.opts.Now().UTC().Format(time.RFC3339), 0).Err()
	}
	return rep, true, err
}

// requeueReleased enqueues again, at once, the tasks of every job the fair
// queues released and no worker started: a failover may have lost them.
func (r *Reconciler) requeueReleased(ctx context.Context, rep *Report) error {
	scopes, err := r.Queue.Scopes(ctx)
	if err != nil {
		return err
	}
	for i := range r.Policy.Current().Models {
		scopes = append(scopes, r.Policy.Current().Models[i].Queue())
	}
	slices.Sort(scopes)
	for _, scope := range slices.Compact(scopes) {
		for {
			n, err := r.Queue.RequeueStale(ctx, scope, 0)
			if err != nil {
				return err
			}
			rep.Requeued += n
			if n < staleBatch {
				break
			}
		}
	}
	return nil
}

// staleBatch is how many released jobs one RequeueStale call takes at most.
const staleBatch = 100

// CheckBudgets compares every day of today (each tenant's budget day, in
// whichever timezone, and the global day) with the ledger, and raises each
// one behind it (budget.Check). reason is budget.RaisedPeriodic for the
// full pass, which leaves rows of the last budget.LedgerSlack to their own
// settlements, or budget.RaisedRestored after a restart or failover.
func (r *Reconciler) CheckBudgets(ctx context.Context, reason string) (budget.CheckReport, error) {
	if r.Budgets == nil {
		return budget.CheckReport{}, nil
	}
	now := r.opts.Now().UTC()
	today := now.Format(time.DateOnly)
	// A tenant's today is one of these in any timezone (UTC-12 to UTC+14);
	// the days past of some timezones cost a little, and are harmless.
	days := []string{now.AddDate(0, 0, -1).Format(time.DateOnly), today, now.AddDate(0, 0, 1).Format(time.DateOnly)}
	sums, err := r.Store.UsageSumsByDays(ctx, days)
	if err != nil {
		return budget.CheckReport{}, err
	}
	p := budget.CheckParams{Reason: reason}
	tenantDays := map[[2]string]money.Micros{}
	var global money.Micros
	for _, s := range sums {
		tenantDays[[2]string{s.TenantID, s.Day}] += s.Cost
		// Every row of today's UTC day has its tenant's day among days.
		if s.GlobalDay == today {
			global += s.Cost
		}
	}
	for k, sum := range tenantDays {
		p.Days = append(p.Days, budget.DaySpend{TenantID: k[0], Day: k[1], Ledger: sum})
	}
	p.Days = append(p.Days, budget.DaySpend{Day: today, Ledger: global})
	if reason == budget.RaisedPeriodic {
		p.InFlight = now.Add(-budget.LedgerSlack)
	}
	return r.Budgets.Check(ctx, p)
}

// pauseModels pauses every model of the policy after a loss of the
// limiter's state, so it cannot burst past the provider's limits.
func (r *Reconciler) pauseModels(ctx context.Context) {
	if r.opts.LossPause < 0 {
		return
	}
	for i := range r.Policy.Current().Models {
		for _, route := range r.Policy.Current().Models[i].Routes() {
			if err := r.Limiter.Penalize(ctx, admission.Scope(route), r.opts.LossPause); err != nil {
				r.Logger.Warn("pause a deployment after redis loss", "deployment", route.Deployment.Name(), "err", err)
			}
		}
	}
}

// RunOnce checks every unfinished job older than MinAge and enqueues the
// ones whose task is missing, a job due later to run when due.
func (r *Reconciler) RunOnce(ctx context.Context) (Report, error) {
	return r.reconcileAll(ctx, r.opts.MinAge)
}

func (r *Reconciler) reconcileAll(ctx context.Context, minAge time.Duration) (Report, error) {
	var rep Report
	var err error
	now := r.opts.Now()
	if rep.LegacyQueues, err = r.Inspector.DropPriorityQueues(ctx); err != nil {
		return rep, err
	}
	if err := r.reconcileJobs(ctx, now, minAge, &rep); err != nil {
		return rep, err
	}
	if err := r.reconcileArchive(ctx, &rep); err != nil {
		return rep, err
	}
	for _, kind := range []string{store.WebhookJob, store.WebhookBatch} {
		if err := r.reconcileWebhooks(ctx, kind, now, minAge, &rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// archiveMax bounds the archived tasks one pass looks at; the
// archive holds only what asynq gave up on, and each pass empties it.
const archiveMax = 10000

// reconcileArchive empties the job queue's archive of finished jobs'
// tasks. A succeeded or cancelled job's task is sent back, so that a worker
// settles its charge from its ledger row (charged once however often it
// settles); a failed or deleted job's is dropped.
func (r *Reconciler) reconcileArchive(ctx context.Context, rep *Report) error {
	ids, err := r.Inspector.ArchivedJobIDs(ctx, archiveMax)
	if err != nil {
		return err
	}
	for _, id := range ids {
		j, err := r.Store.JobGetByID(ctx, id)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if j != nil && !j.Status.Terminal() {
			continue
		}
		if err := r.Inspector.DeleteArchivedJob(ctx, id); err != nil {
			return err
		}
		if j == nil || j.Status == store.JobFailed {
			rep.Dropped++
			continue
		}
		if _, err := r.Queue.EnqueueJob(ctx, queue.JobRef{ID: id, Priority: j.Queue}); err != nil {
			return fmt.Errorf("send back %s to settle: %w", id, err)
		}
		rep.Resent++
		r.Logger.Debug("finished job's archived task sent back to settle its charge", "job", id, "status", j.Status)
	}
	return nil
}

// reconcileWebhooks enqueues the deliveries of finished jobs' or batches'
// webhooks that have not ended and whose task is missing.
func (r *Reconciler) reconcileWebhooks(ctx context.Context, kind string, now time.Time, minAge time.Duration, rep *Report) error {
	p := &store.WebhookListPendingParams{Kind: kind, FinishedBefore: now.Add(-minAge), Limit: 1000}
	list := func() ([]*store.WebhookRef, bool, error) { return r.Store.WebhookListPending(ctx, p) }
	id := func(ref *store.WebhookRef) string { return ref.ID }
	return loop.Pages(&p.After, list, id, func(ref *store.WebhookRef) error {
		enqueued, err := r.Queue.EnqueueWebhook(ctx, queue.WebhookPayload{Kind: ref.Kind, ID: ref.ID})
		if enqueued {
			rep.Webhooks++
			r.Logger.Debug("webhook delivery had no task; enqueued again", "webhook", ref.Kind+":"+ref.ID)
		}
		return err
	})
}

func (r *Reconciler) reconcileJobs(ctx context.Context, now time.Time, minAge time.Duration, rep *Report) error {
	// A validating batch's jobs are its validation's to enqueue; a job at a
	// provider's Batch API is its part's.
	p := &store.JobListUnfinishedParams{UpdatedBefore: now.Add(-minAge), SkipValidating: true, SkipOffloaded: true, Limit: 1000}
	list := func() ([]*store.Job, bool, error) { return r.Store.JobListUnfinished(ctx, p) }
	return loop.Pages(&p.After, list, func(j *store.Job) string { return j.ID }, func(j *store.Job) error {
		rep.Scanned++
		return r.reconcile(ctx, j, now, rep)
	})
}

// syncAbandonedAfter is how long a synchronous job may go unchanged before
// its process is taken for stopped: far longer than a wait and a call.
const syncAbandonedAfter = 15 * time.Minute

func (r *Reconciler) reconcile(ctx context.Context, j *store.Job, now time.Time, rep *Report) error {
	if j.Sync {
		// Its client waits on a connection, never on a task: a stopped
		// process leaves nobody to answer, so the job only ends.
		if now.Sub(j.UpdatedAt) < syncAbandonedAfter {
			return nil
		}
		_, applied, err := r.Store.JobFail(ctx, &store.JobFailParams{ID: j.ID, Error: store.JobError{
			Type: wire.TypeServer, Code: client.CodeSyncAbandoned,
			Message: "The synchronous request's process stopped before it answered.",
		}})
		if err == nil && applied {
			rep.Failed++
		}
		return err
	}
	ref := admission.JobRef(r.Policy.Current(), j, 0) // no share: the fair queue keeps the tenant's
	if j.NextRunAt != nil && j.NextRunAt.After(now) {
		ref.In = j.NextRunAt.Sub(now)
	}
	task, err := r.Inspector.JobTask(ctx, j.ID)
	if err != nil {
		return err
	}
	switch {
	case task.State == queue.TaskMissing:
		// No task: the job waits in its fair queue (enqueueing is then a
		// no-op), or Redis lost it.
		enqueued, err := r.Queue.EnqueueJob(ctx, ref)
		if err != nil {
			return fmt.Errorf("re-enqueue %s: %w", j.ID, err)
		}
		if enqueued {
			rep.Requeued++
			r.Logger.Debug("job had no task; enqueued again", "job", j.ID, "status", j.Status)
		}
	case task.State == queue.TaskActive && j.Status != store.JobRunning:
		// asynq has the task active but no worker started the job: a
		// failover lost its lease, which asynq's recoverer follows. A task
		// of its own runs it; should a worker hold it after all, that task
		// finds it held and ends.
		if _, err := r.Queue.EnqueueHandOff(ctx, ref, strconv.FormatInt(now.UnixMilli(), 36)); err != nil {
			return fmt.Errorf("re-enqueue %s, stuck active: %w", j.ID, err)
		}
		rep.Requeued++
	case task.State != queue.TaskArchived:
		// A task holds the id, and will run.
	case task.DiedWithWorker():
		// asynq archived it: its worker stopped while running it, on the
		// last of its deliveries at least: the job may be what kills its
		// workers, and reviving it would let it do so forever.
		return r.failWorkerLost(ctx, j, task.Retried+1, func() error { return r.Inspector.DeleteArchivedJob(ctx, j.ID) }, rep)
	default:
		// asynq archived it, its retries used up while the store could not
		// record the failure (the database was down): revive it.
		if err := r.Inspector.DeleteArchivedJob(ctx, j.ID); err != nil {
			return err
		}
		enqueued, err := r.Queue.EnqueueJob(ctx, ref)
		if err != nil {
			return fmt.Errorf("revive %s: %w", j.ID, err)
		}
		if enqueued {
			rep.Revived++
		}
	}
	return nil
}

// failWorkerLost fails a job whose last delivery ended with its worker
// gone, runs drop (when not nil), and sends the job's webhook.
func (r *Reconciler) failWorkerLost(ctx context.Context, j *store.Job, deliveries int, drop func() error, rep *Report) error {
	_, applied, err := r.Store.JobFail(ctx, &store.JobFailParams{ID: j.ID, Error: store.JobError{
		Type: wire.TypeServer, Code: client.CodeWorkerLost,
		Message: fmt.Sprintf("The job's last delivery ended with its worker gone (killed, crashed or cut off from Redis), "+
			"after %d failed deliveries; giving up, so that a job that kills its workers cannot run forever.", deliveries),
	}})
	if err != nil {
		return fmt.Errorf("fail %s: %w", j.ID, err)
	}
	if drop != nil {
		if err := drop(); err != nil {
			return err
		}
	}
	if !applied {
		return nil
	}
	rep.Failed++
	r.Logger.Warn("job failed: its worker was gone at the end of its last delivery", "job", j.ID, "failed_deliveries", deliveries)
	if j.WebhookURL != "" {
		if _, err := r.Queue.EnqueueWebhook(ctx, queue.WebhookPayload{Kind: store.WebhookJob, ID: j.ID}); err != nil {
			r.Logger.Warn("enqueue webhook", "job", j.ID, "err", err)
		}
	}
	return nil
}
