package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/pacer"
)

// requeue is returned by the handler to put a job's task back in its queue
// for a while. Rate-limit waits, 429s and budget deferrals are not failures
// (asynq's retry counter does not grow, so they never use up a job's
// retries); provider faults are.
type requeue struct {
	reason  string
	delay   time.Duration
	failure bool
	cause   error
}

func (e *requeue) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s; again in %v: %v", e.reason, e.delay.Round(time.Millisecond), e.cause)
	}
	return fmt.Sprintf("%s; again in %v", e.reason, e.delay.Round(time.Millisecond))
}

func (e *requeue) Unwrap() error { return e.cause }

// Requeue returns the error a task handler returns to run its task again
// after delay without counting a failure (a webhook waiting for its slot).
func Requeue(reason string, delay time.Duration) error {
	return &requeue{reason: reason, delay: delay}
}

// IsFailure is asynq's Config.IsFailure: only provider faults count.
func IsFailure(err error) bool {
	var r *requeue
	if errors.As(err, &r) {
		return r.failure
	}
	return err != nil
}

// RetryDelay is asynq's Config.RetryDelayFunc: the handler's own delay when it
// gave one, else full-jitter exponential backoff on the failure count n.
func RetryDelay(n int, err error, _ *asynq.Task) time.Duration {
	var r *requeue
	if errors.As(err, &r) && r.delay > 0 {
		return r.delay
	}
	return pacer.FullJitter(n, time.Second, 5*time.Minute)
}
