package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Inspector reads queue state for dashboards, metrics and the reconciler.
type Inspector struct {
	in *asynq.Inspector
	ns Namespace
}

// NewInspector returns an Inspector over an asynq inspector of namespace ns.
// The caller keeps ownership of in.
func NewInspector(in *asynq.Inspector, ns Namespace) *Inspector {
	return &Inspector{in: in, ns: ns}
}

// QueueStat is the state of one queue.
type QueueStat struct {
	Name      string        `json:"name"` // without the namespace
	Size      int           `json:"size"`
	Pending   int           `json:"pending"`
	Active    int           `json:"active"`
	Scheduled int           `json:"scheduled"`
	Retry     int           `json:"retry"`
	Archived  int           `json:"archived"`
	Latency   time.Duration `json:"latency"` // age of the oldest pending task
	Paused    bool          `json:"paused"`
}

// QueueStats returns the state of every llmq queue of the namespace.
func (i *Inspector) QueueStats(ctx context.Context) ([]QueueStat, error) {
	existing, err := i.in.Queues()
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	var out []QueueStat
	for _, name := range queueNames {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q := i.ns.Queue(name)
		if !slices.Contains(existing, q) {
			out = append(out, QueueStat{Name: name})
			continue
		}
		info, err := i.in.GetQueueInfo(q)
		if err != nil {
			return nil, fmt.Errorf("queue %s: %w", q, err)
		}
		out = append(out, QueueStat{
			Name: name, Size: info.Size, Pending: info.Pending, Active: info.Active,
			Scheduled: info.Scheduled, Retry: info.Retry, Archived: info.Archived,
			Latency: info.Latency, Paused: info.Paused,
		})
	}
	return out, nil
}

// TaskState is where a job's task is in asynq.
type TaskState string

// Task states; TaskMissing means Redis holds no task for the job.
const (
	TaskMissing   TaskState = "missing"
	TaskPending   TaskState = "pending"
	TaskActive    TaskState = "active"
	TaskScheduled TaskState = "scheduled"
	TaskRetry     TaskState = "retry"
	TaskArchived  TaskState = "archived"
	TaskCompleted TaskState = "completed"
)

// JobTaskState returns the state of the task of job id.
func (i *Inspector) JobTaskState(ctx context.Context, id string) (TaskState, error) {
	return i.taskState(Jobs, id)
}

// WebhookTaskState returns the state of the task delivering the webhook of
// the job or batch (kind "job" or "batch") id.
func (i *Inspector) WebhookTaskState(ctx context.Context, kind, id string) (TaskState, error) {
	return i.taskState(Webhooks, webhookTaskID(kind, id))
}

func (i *Inspector) taskState(q, id string) (TaskState, error) {
	t, err := i.task(q, id)
	if err != nil {
		return "", err
	}
	return t.State, nil
}

// Task is what asynq holds of a job's task.
type Task struct {
	State TaskState
	// Retried is asynq's retry count; MaxRetry once archived.
	Retried  int
	MaxRetry int
	// LastErr is the error of the last failed delivery, "" when none.
	LastErr string
}

// DiedWithWorker reports whether the task's last delivery ended because its
// worker stopped: asynq's lease on the task expired.
func (t *Task) DiedWithWorker() bool {
	return strings.Contains(t.LastErr, asynq.ErrLeaseExpired.Error())
}

// JobTask returns the task of job id, with State TaskMissing when Redis
// holds none.
func (i *Inspector) JobTask(ctx context.Context, id string) (*Task, error) {
	return i.task(Jobs, id)
}

func (i *Inspector) task(q, id string) (*Task, error) {
	info, err := i.in.GetTaskInfo(i.ns.Queue(q), id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return &Task{State: TaskMissing}, nil
	case err != nil:
		return nil, fmt.Errorf("task %s: %w", id, err)
	}
	return &Task{State: TaskState(info.State.String()), Retried: info.Retried, MaxRetry: info.MaxRetry, LastErr: info.LastErr}, nil
}

// ArchivedJobIDs returns the ids of at most max jobs whose task asynq
// archived, oldest first.
func (i *Inspector) ArchivedJobIDs(ctx context.Context, max int) ([]string, error) {
	const pageSize = 100
	var ids []string
	for page := 1; len(ids) < max; page++ {
		tasks, err := i.in.ListArchivedTasks(i.ns.Queue(Jobs), asynq.Page(page), asynq.PageSize(pageSize))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return ids, nil
		}
		if err != nil {
			return ids, fmt.Errorf("archived tasks: %w", err)
		}
		for _, t := range tasks {
			if t.Type == TypeJob && len(ids) < max {
				ids = append(ids, t.ID)
			}
		}
		if len(tasks) < pageSize {
			return ids, nil
		}
	}
	return ids, nil
}

// DeleteArchivedJob removes the archived task of job id, so the job can be
// enqueued again under its id.
func (i *Inspector) DeleteArchivedJob(ctx context.Context, id string) error {
	err := i.in.DeleteTask(i.ns.Queue(Jobs), id)
	if err != nil && !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) {
		return fmt.Errorf("delete task %s: %w", id, err)
	}
	return nil
}

// DropPriorityQueues deletes the asynq queues named for the priorities,
// which older versions used, with their tasks, and reports how many it
// dropped; the reconciler enqueues their jobs again in Jobs. A queue with a
// task running stays until a later call.
func (i *Inspector) DropPriorityQueues(ctx context.Context) (int, error) {
	existing, err := i.in.Queues()
	if err != nil {
		return 0, fmt.Errorf("list queues: %w", err)
	}
	dropped := 0
	for _, q := range existing {
		for _, p := range Priorities {
			if q != i.ns.Queue(p) {
				continue
			}
			err := i.in.DeleteQueue(q, true)
			switch {
			case errors.Is(err, asynq.ErrQueueNotEmpty), errors.Is(err, asynq.ErrQueueNotFound):
				continue
			case err != nil:
				return dropped, fmt.Errorf("drop queue %s: %w", q, err)
			}
			dropped++
		}
	}
	return dropped, nil
}

// allQueuesKey is asynq's own set of queue names (base.AllQueues).
const allQueuesKey = "asynq:queues"

// RegisterQueues adds every queue of the namespace to asynq's set of
// queues, which an asynq client fills only at a queue's first enqueue: an
// idle queue, or one after Redis lost its data, is listed too.
func RegisterQueues(ctx context.Context, rdb redis.UniversalClient, ns Namespace) error {
	return rdb.SAdd(ctx, allQueuesKey, ns.Queues()).Err()
}
