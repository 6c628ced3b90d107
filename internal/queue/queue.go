// Package queue owns llmq's use of asynq and the order jobs run in: task
// types and payloads, priorities, the fair queue, enqueueing (idempotent by
// job id), the retry semantics of a task's handler, and queue inspection.
//
// A job's task carries only the job id (the request lives in the store, so
// a job survives the loss of Redis), and its task id is the job id. Every
// job task goes to one asynq queue, Jobs, in the order the fair queue
// releases them; webhook deliveries have their own queue, Webhooks.
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

var queueNames = []string{Jobs, Webhooks}

// Namespace prefixes every queue name, so several installations can share
// one Redis database.
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
// a terminal state.
type WebhookPayload struct {
	Kind string `json:"kind"` // "job" or "batch"
	ID   string `json:"id"`
}

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
	// Redis holds the fair queue. Defaults to nil: every job goes to
	// asynq's queues at once, in arrival order.
	Redis redis.UniversalClient
	// Keys builds the fair queue's keys. Defaults to rkeys.New("").
	Keys rkeys.Builder
}

// DefaultMaxRetry is how many failed attempts (5xx, timeouts) a job's task
// gets before asynq gives up on it; rate-limit waits and budget deferrals
// do not count.
const DefaultMaxRetry = 8

const (
	webhookMaxRetry    = 12
	enqueueConcurrency = 32 // parallel enqueues of EnqueueJobs
)

// Client enqueues llmq's tasks.
type Client struct {
	ac   *asynq.Client
	ns   Namespace
	fair *fair
}

// NewClient returns a Client over an asynq client. The caller keeps
// ownership of ac (and closes it).
func NewClient(ac *asynq.Client, opts ClientOptions) *Client {
	c := &Client{ac: ac, ns: opts.Namespace}
	if opts.Redis != nil {
		c.fair = newFair(opts.Redis, opts.Keys)
	}
	return c
}

// Namespace returns the client's queue namespace.
func (c *Client) Namespace() Namespace { return c.ns }

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

func checkPriorities(refs ...JobRef) error {
	for _, r := range refs {
		if !ValidPriority(r.Priority) {
			return fmt.Errorf("enqueue %s: unknown priority %q", r.ID, r.Priority)
		}
	}
	return nil
}

// EnqueueJob enqueues one job: into its scope's fair queue when it has one
// and runs now, else as an asynq task. Enqueueing is idempotent by job id:
// enqueued is false, and err nil, when the job already waits in the fair
// queue or its task exists. (A job waiting in the fair queue whose task
// asynq also holds is released once and dropped then.)
func (c *Client) EnqueueJob(ctx context.Context, ref JobRef) (enqueued bool, err error) {
	if err := checkPriorities(ref); err != nil {
		return false, err
	}
	if c.fairRef(ref) {
		n, err := c.fair.push(ctx, ref.Scope, []JobRef{ref})
		return n > 0, err
	}
	return c.enqueueTask(ctx, ref, ref.ID)
}

// EnqueueHandOff enqueues a task of its own for a job handed off from a
// worker that died, straight to asynq (the job had left its fair queue):
// the dead worker's task holds the job's id as its task id until asynq's
// recoverer sees its lease expire. Each hand-off gets its own task id,
// "<job id>~<handOff>".
func (c *Client) EnqueueHandOff(ctx context.Context, ref JobRef, handOff string) (enqueued bool, err error) {
	return c.enqueueTask(ctx, ref, ref.ID+"~"+handOff)
}

func (c *Client) enqueueTask(ctx context.Context, ref JobRef, taskID string) (enqueued bool, err error) {
	if err := checkPriorities(ref); err != nil {
		return false, err
	}
	payload, err := json.Marshal(jobPayload{JobID: ref.ID})
	if err != nil {
		return false, err
	}
	opts := []asynq.Option{
		asynq.TaskID(taskID),
		asynq.Queue(c.ns.Queue(Jobs)),
		asynq.MaxRetry(DefaultMaxRetry),
		// The handler bounds each provider call itself; the task timeout only
		// catches a handler that never returns.
		asynq.Timeout(30 * time.Minute),
	}
	if ref.In > 0 {
		opts = append(opts, asynq.ProcessIn(ref.In))
	}
	return c.enqueue(ctx, asynq.NewTask(TypeJob, payload), ref.ID, opts...)
}

// enqueue enqueues t; a task of the same id already there is no error.
func (c *Client) enqueue(ctx context.Context, t *asynq.Task, what string, opts ...asynq.Option) (enqueued bool, err error) {
	_, err = c.ac.EnqueueContext(ctx, t, opts...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("enqueue %s: %w", what, err)
	}
	return true, nil
}

// EnqueueJobs enqueues many jobs: those for the fair queue in a few script
// runs per scope, the others as tasks with bounded parallelism. It returns
// how many jobs were newly enqueued; on error some may have been.
func (c *Client) EnqueueJobs(ctx context.Context, refs []JobRef) (int, error) {
	if err := checkPriorities(refs...); err != nil {
		return 0, err
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
		n, err := c.fair.push(ctx, scope, byScope[scope])
		enqueued += n
		if err != nil {
			return enqueued, err
		}
	}
	added, err := c.enqueueTasks(ctx, direct)
	for _, a := range added {
		if a {
			enqueued++
		}
	}
	return enqueued, err
}

// enqueueTasks enqueues the asynq tasks of refs side by side (asynq
// enqueues one task a call, so parallel calls keep the pipe full) and says
// which it enqueued.
func (c *Client) enqueueTasks(ctx context.Context, refs []JobRef) ([]bool, error) {
	enqueued := make([]bool, len(refs))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(enqueueConcurrency)
	for i, ref := range refs {
		g.Go(func() error {
			var err error
			enqueued[i], err = c.enqueueTask(ctx, ref, ref.ID)
			return err
		})
	}
	return enqueued, g.Wait()
}

func webhookTaskID(kind, id string) string { return "webhook:" + kind + ":" + id }

// EnqueueWebhook enqueues the delivery of a webhook for a job or batch that
// reached a terminal state; enqueued is false when its task already exists.
func (c *Client) EnqueueWebhook(ctx context.Context, p WebhookPayload) (enqueued bool, err error) {
	payload, err := json.Marshal(p)
	if err != nil {
		return false, err
	}
	return c.enqueue(ctx, asynq.NewTask(TypeWebhook, payload), "webhook for "+p.Kind+" "+p.ID,
		asynq.TaskID(webhookTaskID(p.Kind, p.ID)),
		asynq.Queue(c.ns.Queue(Webhooks)),
		asynq.MaxRetry(webhookMaxRetry),
		asynq.Timeout(time.Minute),
	)
}
