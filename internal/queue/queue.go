// Package queue owns llmq's use of asynq: the task types and their payloads,
// the queue names and weights, enqueueing (idempotent by job id) and the
// inspection of queues for dashboards and for the reconciler.
//
// A job's task carries only the job id; the request lives in the store, so
// Redis memory stays small and a job survives the loss of Redis. The task id
// is the job id, so enqueueing a job twice while its task exists is a no-op.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/wire"
)

// Task types.
const (
	TypeJob     = "llmq:job"
	TypeWebhook = "llmq:webhook"
)

// Queue names, before the namespace. The job queues are named for the
// priorities (package wire names them): Critical, Default and Low are the
// priorities a tier (or a job) chooses; Batch runs batch work below all
// interactive work. Webhooks carries webhook deliveries.
const (
	Critical = wire.PriorityCritical
	Default  = wire.PriorityDefault
	Low      = wire.PriorityLow
	Batch    = wire.PriorityBatch
	Webhooks = "webhooks"
)

// weights decide how often a worker's job dequeuers pick each job queue when
// all have work (asynq's weighted priority): a premium tenant's critical jobs
// are picked eight times as often as batch work, so no flood of lower work
// starves them. Webhooks have a server of their own (worker.ServerOptions);
// their weight only places their queue among the others where they are
// listed (Queues).
var weights = map[string]int{Critical: 8, Default: 4, Low: 2, Batch: 1, Webhooks: 3}

// Priorities are the queue names a job may be enqueued to.
var Priorities = []string{Critical, Default, Low, Batch}

// ValidPriority reports whether p names a job queue.
func ValidPriority(p string) bool {
	for _, q := range Priorities {
		if p == q {
			return true
		}
	}
	return false
}

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

// Name returns the llmq queue name of an asynq queue name of ns, and whether
// the asynq queue belongs to ns.
func (ns Namespace) Name(asynqQueue string) (string, bool) {
	if ns == "" {
		_, known := weights[asynqQueue]
		return asynqQueue, known
	}
	rest, ok := strings.CutPrefix(asynqQueue, string(ns)+":")
	if !ok {
		return "", false
	}
	_, known := weights[rest]
	return rest, known
}

// JobWeights returns asynq's Config.Queues for the job dequeuers of a
// worker of ns: the priorities' queues (webhooks have a server of their own).
func (ns Namespace) JobWeights() map[string]int {
	m := make(map[string]int, len(Priorities))
	for _, q := range Priorities {
		m[ns.Queue(q)] = weights[q]
	}
	return m
}

// Queues returns every asynq queue name of ns, highest weight first.
func (ns Namespace) Queues() []string {
	names := make([]string, 0, len(weights))
	for q := range weights {
		names = append(names, q)
	}
	sort.Slice(names, func(i, j int) bool {
		if weights[names[i]] != weights[names[j]] {
			return weights[names[i]] > weights[names[j]]
		}
		return names[i] < names[j]
	})
	for i, q := range names {
		names[i] = ns.Queue(q)
	}
	return names
}

// JobPayload is the payload of a TypeJob task.
type JobPayload struct {
	JobID string `json:"job_id"`
}

// WebhookPayload is the payload of a TypeWebhook task: which object reached
// a terminal state. The delivery reads the object from the store.
type WebhookPayload struct {
	Kind string `json:"kind"` // "job" or "batch"
	ID   string `json:"id"`
}

// jobPayloadHead and jobPayloadTail frame a job payload whose id needs no
// escaping in JSON: every job id llmq makes (store ids are letters, digits
// and '_'). Such payloads are written and read without encoding/json, a
// task's one decode on the worker's path; any other form is decoded by it.
const (
	jobPayloadHead = `{"job_id":"`
	jobPayloadTail = `"}`
)

// plainID reports whether id is written in JSON as it is, without escapes.
func plainID(id string) bool {
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return id != ""
}

// jobPayload returns the payload of the job's task.
func jobPayload(id string) ([]byte, error) {
	if plainID(id) {
		return []byte(jobPayloadHead + id + jobPayloadTail), nil
	}
	return json.Marshal(JobPayload{JobID: id})
}

// ParseJobPayload returns the job id of a TypeJob task.
func ParseJobPayload(t *asynq.Task) (string, error) {
	b := t.Payload()
	if len(b) > len(jobPayloadHead)+len(jobPayloadTail) && string(b[:len(jobPayloadHead)]) == jobPayloadHead &&
		string(b[len(b)-len(jobPayloadTail):]) == jobPayloadTail {
		if id := string(b[len(jobPayloadHead) : len(b)-len(jobPayloadTail)]); plainID(id) {
			return id, nil
		}
	}
	var p JobPayload
	if err := json.Unmarshal(b, &p); err != nil || p.JobID == "" {
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

// JobRef names a job to enqueue and its queue.
type JobRef struct {
	ID    string
	Queue string        // one of Priorities
	In    time.Duration // delay before the job may run; 0 = now
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
	if !ValidPriority(ref.Queue) {
		return false, fmt.Errorf("enqueue %s: unknown queue %q", ref.ID, ref.Queue)
	}
	if c.fairRef(ref) {
		n, err := c.fair.push(ctx, ref.Scope, []JobRef{ref})
		return n > 0, err
	}
	return c.enqueueTask(ctx, ref)
}

// enqueueTask enqueues the asynq task of a job.
func (c *Client) enqueueTask(ctx context.Context, ref JobRef) (enqueued bool, err error) {
	if !ValidPriority(ref.Queue) {
		return false, fmt.Errorf("enqueue %s: unknown queue %q", ref.ID, ref.Queue)
	}
	payload, err := jobPayload(ref.ID)
	if err != nil {
		return false, err
	}
	opts := []asynq.Option{
		asynq.TaskID(ref.ID),
		asynq.Queue(c.opts.Namespace.Queue(ref.Queue)),
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
		if !ValidPriority(r.Queue) {
			return 0, fmt.Errorf("enqueue %s: unknown queue %q", r.ID, r.Queue)
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
	n, err := c.enqueueTasks(parent, direct)
	return enqueued + n, err
}

// enqueueTasks enqueues the asynq tasks of refs with bounded parallelism.
func (c *Client) enqueueTasks(parent context.Context, refs []JobRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	var (
		mu       sync.Mutex
		enqueued int
		firstErr error
		wg       sync.WaitGroup
		next     = make(chan JobRef)
	)
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	workers := min(c.opts.EnqueueConcurrency, len(refs))
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ref := range next {
				ok, err := c.enqueueTask(ctx, ref)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				if ok {
					enqueued++
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for _, ref := range refs {
		select {
		case next <- ref:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr == nil {
		firstErr = parent.Err()
	}
	return enqueued, firstErr
}

// EnqueueWebhook enqueues the delivery of a webhook for a job or batch that
// reached a terminal state. Its task id makes a second enqueue a no-op:
// enqueued is false when the delivery's task already exists.
func (c *Client) EnqueueWebhook(ctx context.Context, p WebhookPayload) (enqueued bool, err error) {
	payload, err := json.Marshal(p)
	if err != nil {
		return false, err
	}
	_, err = c.ac.EnqueueContext(ctx, asynq.NewTask(TypeWebhook, payload),
		asynq.TaskID("webhook:"+p.Kind+":"+p.ID),
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
