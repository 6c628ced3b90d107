package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/bench/internal/cost"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/testutil"
)

// bareTaskType is the baseline's task type.
const bareTaskType = "bench:noop"

// runBare measures bare asynq: tasks enqueued as llmq enqueues a job (task
// id, a job-id payload, the same retry and timeout options) into one
// queue, and run by a server of the same concurrency and poll interval as
// llmq's worker whose handler does nothing.
func runBare(ctx context.Context, o *options, logger *slog.Logger) (*measurement, error) {
	rdb, _, rt, err := newRedis(ctx, o.RedisURL, o.RedisDB)
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	qname := "bench-" + testutil.RandomHex(4) + ":default"
	defer testutil.PurgeRedis(rdb, []string{qname}, "")

	var fin finishes
	mux := asynq.NewServeMux()
	mux.HandleFunc(bareTaskType, func(context.Context, *asynq.Task) error { return nil })
	mux.Use(fin.middleware)
	for range o.Servers {
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
			Concurrency:              o.perServer(),
			Queues:                   map[string]int{qname: 1},
			TaskCheckInterval:        pollInterval,
			DelayedTaskCheckInterval: delayedInterval,
			ShutdownTimeout:          5 * time.Second,
			Logger:                   asynqLogger{logger},
			LogLevel:                 asynq.WarnLevel,
		})
		if err := srv.Start(mux); err != nil {
			return nil, err
		}
		defer srv.Shutdown()
	}

	client := asynq.NewClientFromRedisClient(rdb)
	enqueue := func(ctx context.Context, _ int) error {
		id := ids.New(ids.Job)
		payload, err := json.Marshal(map[string]string{"job_id": id})
		if err != nil {
			return err
		}
		_, err = client.EnqueueContext(ctx, asynq.NewTask(bareTaskType, payload),
			asynq.TaskID(id), asynq.Queue(qname), asynq.MaxRetry(8), asynq.Timeout(30*time.Minute))
		return err
	}

	warm := fin.start(o.Warmup)
	if err := produce(ctx, o.Warmup, o.Producers, enqueue); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if err := warm.wait(ctx, o.Timeout); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}

	m := &measurement{jobs: o.Jobs}
	mt := &meter{rt: rt, cpu: cost.NewCPUReader(rdb, o.DatabaseURL)}
	u := mt.read(ctx)
	f := fin.start(o.Jobs)
	start := time.Now()
	if err := produce(ctx, o.Jobs, o.Producers, enqueue); err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	if err := f.wait(ctx, o.Timeout); err != nil {
		return nil, err
	}
	m.elapsed = f.at.Sub(start)
	m.busy = time.Duration(f.busy.Load())
	m.usage = mt.since(ctx, u)
	return m, nil
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
