package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/queue"
)

// ServerOptions configure the asynq server that runs jobs.
type ServerOptions struct {
	// Concurrency is how many jobs run at once. Defaults to 50.
	Concurrency int
	// Namespace prefixes queue names. Defaults to none.
	Namespace queue.Namespace
	// ShutdownTimeout is the grace period in-flight calls get on SIGTERM;
	// unfinished jobs then go back to their queue without counting a
	// failure. Defaults to 30s.
	ShutdownTimeout time.Duration
	// PollInterval is how often an idle server looks for new tasks and moves
	// due delayed tasks (asynq's TaskCheckInterval and
	// DelayedTaskCheckInterval; its defaults, 1s and 5s, add up to seconds of
	// latency). Defaults to 200ms.
	PollInterval time.Duration
	// Logger receives asynq's own log lines (warn and above). Defaults to discarding them.
	Logger *slog.Logger
}

// validate reports, naming the field, an option that is invalid: a
// negative count or duration (zero means the default).
func (o ServerOptions) validate() error {
	if o.Concurrency < 0 {
		return fmt.Errorf("worker: ServerOptions.Concurrency must not be negative, got %d", o.Concurrency)
	}
	if o.ShutdownTimeout < 0 {
		return fmt.Errorf("worker: ServerOptions.ShutdownTimeout must not be negative, got %v", o.ShutdownTimeout)
	}
	if o.PollInterval < 0 {
		return fmt.Errorf("worker: ServerOptions.PollInterval must not be negative, got %v", o.PollInterval)
	}
	return nil
}

// NewServer returns an asynq server over rdb configured for llmq: weighted
// queues, 429s and waits that are not failures, short polling; or an error
// naming an option that is invalid. Run it with Mux. The caller keeps
// ownership of rdb.
func NewServer(rdb redis.UniversalClient, opts ServerOptions) (*asynq.Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 50
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 30 * time.Second
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 200 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              opts.Concurrency,
		Queues:                   opts.Namespace.Weights(),
		IsFailure:                IsFailure,
		RetryDelayFunc:           RetryDelay,
		ShutdownTimeout:          opts.ShutdownTimeout,
		TaskCheckInterval:        opts.PollInterval,
		DelayedTaskCheckInterval: opts.PollInterval,
		Logger:                   asynqLogger{opts.Logger},
		LogLevel:                 asynq.WarnLevel,
	}), nil
}

// Mux routes llmq's task types to their handlers; webhooks may be nil.
func Mux(jobs, webhooks asynq.Handler) *asynq.ServeMux {
	mux := asynq.NewServeMux()
	mux.Handle(queue.TypeJob, jobs)
	if webhooks != nil {
		mux.Handle(queue.TypeWebhook, webhooks)
	}
	return mux
}

// asynqLogger sends asynq's log lines to slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) log(level slog.Level, args []any) {
	a.l.Log(context.Background(), level, "asynq: "+fmt.Sprint(args...))
}

func (a asynqLogger) Debug(args ...any) { a.log(slog.LevelDebug, args) }
func (a asynqLogger) Info(args ...any)  { a.log(slog.LevelInfo, args) }
func (a asynqLogger) Warn(args ...any)  { a.log(slog.LevelWarn, args) }
func (a asynqLogger) Error(args ...any) { a.log(slog.LevelError, args) }
func (a asynqLogger) Fatal(args ...any) {
	a.log(slog.LevelError, args)
	os.Exit(1)
}
