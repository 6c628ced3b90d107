// Package queue owns llmq's use of asynq and the order jobs run in: the
// task types and their payloads, the priorities, the fair queue (jobs
// waiting for their model, released fairly between tenants), enqueueing
// (idempotent by job id), the retry semantics of a task's handler, and the
// inspection of queues for dashboards and for the reconciler.
//
// A job's task carries only the job id; the request lives in the store, so
// Redis memory stays small and a job survives the loss of Redis. The task id
// is the job id, so enqueueing a job twice while its task exists is a no-op.
//
// Every job task goes to one asynq queue, Jobs: the fair queue releases a
// model's jobs in their priorities' order and proportions already, so asynq
// runs them in the order they come, and a worker takes a task in one
// dequeue. What reaches asynq without the fair queue (a retry, a deferral, a
// long wait) runs when due, in that order. Webhook deliveries have a queue
// of their own, Webhooks, served by a server of their own.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/llmq/llmq/internal/rkeys"
)

// Task types.
const (
	TypeJob     = "llmq:job"
	TypeWebhook = "llmq:webhook"
)

// The asynq queues, before the namespace.
const (
	Jobs     = "jobs"
	Webhooks = "webhooks"
)

// queueNames are every asynq queue of llmq.
var queueNames = []string{Jobs, Webhooks}

// Namespace prefixes every queue name, so several installations (or tests)
// can share one Redis database. The empty Namespace uses the bare names.
type Namespace string

// Queue returns the asynq queue name of the llmq queue name.
func (ns Namespace) Queue(name string) string {
	if ns == "" {
		return name
	}
	return string(ns) + ":" + name
}

// Queues returns every asynq queue name of ns.
func (ns Namespace) Queues() []string {
	names := make([]string, len(queueNames))
	for i, q := range queueNames {
		names[i] = ns.Queue(q)
	}
	return names
}

// WebhookPayload is the payload of a TypeWebhook task: which object reached
// a terminal state. The delivery reads the object from the store.
type WebhookPayload struct {
	Kind string `json:"kind"` // "job" or "batch"
	ID   string `json:"id"`
}

// jobPayload is the payload of a TypeJob task: a JSON object naming the job.
type jobPayload struct {
	JobID string `json:"job_id"`
}

// ParseJobPayload returns the job id of a TypeJob task.
func ParseJobPayload(t *asynq.Task) (string, error) {
	var p jobPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.JobID == "" {
		return "", fmt.Errorf("task %s: payload is not a job reference: %q", t.Type(), t.Payload())
	}
	return p.JobID, nil
}

// ParseWebhookPayload returns the payload of a TypeWebhook task.
func ParseWebhookPayload(t *asynq.Task) (*WebhookPayload, error) {
	var p WebhookPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.ID == "" || (p.Kind != "job" && p.Kind != "batch") {
		return nil, fmt.Errorf("task %s: payload is not a webhook reference: %q", t.Type(), t.Payload())
	}
	return &p, nil
}

// ClientOptions configures a Client.
type ClientOptions struct {
	// Namespace prefixes queue names. Defaults to none.
	Namespace Namespace
	// MaxRetry is how many failed attempts (5xx, timeouts) a job's task gets
	// before asynq gives up on it. Rate-limit waits and budget deferrals do not
	// count. Defaults to DefaultMaxRetry.
	MaxRetry int
	// WebhookMaxRetry is how many failed deliveries a webhook gets. Defaults to 12.
	WebhookMaxRetry int
	// EnqueueConcurrency bounds the parallel enqueues of EnqueueJobs. Defaults to 32.
	EnqueueConcurrency int
	// Redis holds the fair queue (jobs waiting for their model, released
	// fairly between tenants by the scheduler). Defaults to nil: every job
	// goes to asynq's queues at once, in arrival order.
	Redis redis.UniversalClient
	// Keys builds the fair queue's keys. Defaults to rkeys.New("").
	Keys rkeys.Builder
}

// validate reports, naming the field, an option that is invalid: a
// negative count or duration (zero means the default).
func (o ClientOptions) validate() error {
	if o.MaxRetry < 0 {
		return fmt.Errorf("queue: ClientOptions.MaxRetry must not be negative, got %d", o.MaxRetry)
	}
	if o.WebhookMaxRetry < 0 {
		return fmt.Errorf("queue: ClientOptions.WebhookMaxRetry must not be negative, got %d", o.WebhookMaxRetry)
	}
	if o.EnqueueConcurrency < 0 {
		return fmt.Errorf("queue: ClientOptions.EnqueueConcurrency must not be negative, got %d", o.EnqueueConcurrency)
	}
	return nil
}

// DefaultMaxRetry is ClientOptions.MaxRetry when unset.
const DefaultMaxRetry = 8

// Client enqueues llmq's tasks.
type Client struct {
	ac   *asynq.Client
	opts ClientOptions
	fair *fair
}

// NewClient returns a Client over an asynq client, or an error naming an
// option that is invalid. The caller keeps ownership of ac (and closes it).
func NewClient(ac *asynq.Client, opts ClientOptions) (*Client, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.MaxRetry == 0 {
		opts.MaxRetry = DefaultMaxRetry
	}
	if opts.WebhookMaxRetry == 0 {
		opts.WebhookMaxRetry = 12
	}
	if opts.EnqueueConcurrency == 0 {
		opts.EnqueueConcurrency = 32
	}
	c := &Client{ac: ac, opts: opts}
	if opts.Redis != nil {
		c.fair = newFair(opts.Redis, opts.Keys)
	}
	return c, nil
}

// Namespace returns the client's queue namespace.
func (c *Client) Namespace() Namespace { return c.opts.Namespace }

// JobRef names a job to enqueue and its priority.
type JobRef struct {
	ID       string
	Priority string        // one of Priorities
	In       time.Duration // delay before the job may run; 0 = now
	// Scope is the limiter scope of the job's model; with it, a job to run
	// now waits in the fair queue until the scheduler releases it. Empty
	// sends it to asynq at once.
	Scope string
	// TenantID, Cost (estimated tokens: prompt + max_tokens) and Share (the
	// tenant's tier's share; 0 keeps the one known, else 1) place it among
	// the tenants waiting.
	TenantID string
	Cost     int64
	Share    float64
}

// EnqueueJob enqueues one job: into its scope's fair queue when it has one
// and runs now, else as an asynq task. It reports enqueued=false, and no
// error, when the job already waits in the fair queue or its task exists
// (queued, scheduled, running or retrying): enqueueing is idempotent by job
// id. (A job waiting in the fair queue whose task asynq also holds is
// released once and dropped then.)
func (c *Client) EnqueueJob(ctx context.Context, ref JobRef) (enqueued bool, err error) {
	if !ValidPriority(ref.Priority) {
		return false, fmt.Errorf("enqueue %s: unknown priority %q", ref.ID, ref.Priority)
	}
	if c.fairRef(ref) {
		n, err := c.fair.push(ctx, ref.Scope, []JobRef{ref})
		return n > 0, err
	}
	return c.enqueueTask(ctx, ref)
}

// EnqueueHandOff enqueues a task of its own for a job handed off from a
// worker that died, straight to asynq (the job had left its fair queue):
// the dead worker's task still holds the job's id as asynq's task id until
// asynq's recoverer sees its lease expire, and runs then to find the job
// started elsewhere or finished. handOff names this hand-off (each one of a
// job gets its own task id, "<job id>~<handOff>").
func (c *Client) EnqueueHandOff(ctx context.Context, ref JobRef, handOff string) (enqueued bool, err error) {
	return c.enqueueTaskID(ctx, ref, ref.ID+"~"+handOff)
}

// enqueueTask enqueues the asynq task of a job.
func (c *Client) enqueueTask(ctx context.Context, ref JobRef) (enqueued bool, err error) {
	return c.enqueueTaskID(ctx, ref, ref.ID)
}

func (c *Client) enqueueTaskID(ctx context.Context, ref JobRef, taskID string) (enqueued bool, err error) {
	if !ValidPriority(ref.Priority) {
		return false, fmt.Errorf("enqueue %s: unknown priority %q", ref.ID, ref.Priority)
	}
	payload, err := json.Marshal(jobPayload{JobID: ref.ID})
	if err != nil {
		return false, err
	}
	opts := []asynq.Option{
		asynq.TaskID(taskID),
		asynq.Queue(c.opts.Namespace.Queue(Jobs)),
		asynq.MaxRetry(c.opts.MaxRetry),
		// The handler bounds each provider call itself; the task timeout only
		// catches a handler that never returns.
		asynq.Timeout(30 * time.Minute),
	}
	if ref.In > 0 {
		opts = append(opts, asynq.ProcessIn(ref.In))
	}
	_, err = c.ac.EnqueueContext(ctx, asynq.NewTask(TypeJob, payload), opts...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("enqueue %s: %w", ref.ID, err)
	}
	return true, nil
}

// EnqueueJobs enqueues many jobs: those for the fair queue in a few script
// runs per scope, the others as tasks with bounded parallelism (asynq
// enqueues one task per script call, so parallel calls are what keeps the
// pipe full). It returns how many jobs were newly enqueued; on error some
// may have been.
func (c *Client) EnqueueJobs(parent context.Context, refs []JobRef) (int, error) {
	for _, r := range refs {
		if !ValidPriority(r.Priority) {
			return 0, fmt.Errorf("enqueue %s: unknown priority %q", r.ID, r.Priority)
		}
	}
	enqueued := 0
	byScope := map[string][]JobRef{}
	var order []string
	direct := refs[:0:0]
	for _, r := range refs {
		if !c.fairRef(r) {
			direct = append(direct, r)
			continue
		}
		if _, ok := byScope[r.Scope]; !ok {
			order = append(order, r.Scope)
		}
		byScope[r.Scope] = append(byScope[r.Scope], r)
	}
	for _, scope := range order {
		n, err := c.fair.push(parent, scope, byScope[scope])
		enqueued += n
		if err != nil {
			return enqueued, err
		}
	}
	added, err := c.enqueueTasks(parent, direct)
	for _, a := range added {
		if a {
			enqueued++
		}
	}
	return enqueued, err
}

// enqueueTasks enqueues the asynq tasks of refs, EnqueueConcurrency at a
// time (asynq enqueues one task a call), and says which it enqueued.
func (c *Client) enqueueTasks(ctx context.Context, refs []JobRef) ([]bool, error) {
	enqueued := make([]bool, len(refs))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opts.EnqueueConcurrency)
	for i, ref := range refs {
		g.Go(func() error {
			var err error
			enqueued[i], err = c.enqueueTask(ctx, ref)
			return err
		})
	}
	return enqueued, g.Wait()
}

// webhookTaskID is the task id of the webhook delivery for the job or
// batch id.
func webhookTaskID(kind, id string) string { return "webhook:" + kind + ":" + id }

// EnqueueWebhook enqueues the delivery of a webhook for a job or batch that
// reached a terminal state. Its task id makes a second enqueue a no-op:
// enqueued is false when the delivery's task already exists.
func (c *Client) EnqueueWebhook(ctx context.Context, p WebhookPayload) (enqueued bool, err error) {
	payload, err := json.Marshal(p)
	if err != nil {
		return false, err
	}
	_, err = c.ac.EnqueueContext(ctx, asynq.NewTask(TypeWebhook, payload),
		asynq.TaskID(webhookTaskID(p.Kind, p.ID)),
		asynq.Queue(c.opts.Namespace.Queue(Webhooks)),
		asynq.MaxRetry(c.opts.WebhookMaxRetry),
		asynq.Timeout(time.Minute),
	)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("enqueue webhook for %s %s: %w", p.Kind, p.ID, err)
	}
	return true, nil
}
