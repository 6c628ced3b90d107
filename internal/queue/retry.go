package queue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"
)

// Retry is what a task's handler returns to put its task back for a while.
// Only a Failure (a provider fault) uses up one of the task's retries.
type Retry struct {
	Reason  string
	Delay   time.Duration
	Failure bool
	Cause   error
}

func (e *Retry) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%s; again in %v: %v", e.Reason, e.Delay.Round(time.Millisecond), e.Cause)
	}
	return fmt.Sprintf("%s; again in %v", e.Reason, e.Delay.Round(time.Millisecond))
}

func (e *Retry) Unwrap() error { return e.Cause }

// Requeue is a Retry that is not a failure: the task comes back after delay.
func Requeue(reason string, delay time.Duration) error {
	return &Retry{Reason: reason, Delay: delay}
}

// IsFailure is asynq's Config.IsFailure: a Retry counts only when it says
// so; any other error counts.
func IsFailure(err error) bool {
	var r *Retry
	if errors.As(err, &r) {
		return r.Failure
	}
	return err != nil
}

// RetryDelay is asynq's Config.RetryDelayFunc: the handler's own delay when
// it gave one, else full-jitter exponential backoff on the failure count n.
func RetryDelay(n int, err error, _ *asynq.Task) time.Duration {
	var r *Retry
	if errors.As(err, &r) && r.Delay > 0 {
		return r.Delay
	}
	return FullJitter(n, time.Second, 5*time.Minute)
}

// FullJitter is exponential backoff with full jitter: a uniform random
// delay in [0, min(limit, base·2ⁿ)], at least a tenth of base.
func FullJitter(n int, base, limit time.Duration) time.Duration {
	n = max(n, 0)
	ceil := limit
	if n < 30 && base<<uint(n) < limit && base<<uint(n) > 0 {
		ceil = base << uint(n)
	}
	return max(time.Duration(rand.Int64N(int64(ceil)+1)), base/10)
}
