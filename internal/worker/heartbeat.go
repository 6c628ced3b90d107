package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/loop"
	"github.com/llmq/llmq/internal/store"
)

// Heartbeat is a worker process's presence in the store, which the jobs it
// starts name: the reconciler hands a process's running jobs on once
// store.WorkerDeadAfter passed without a beat (asynq's own recovery takes a
// minute or more). A process whose beats fail starts no provider call once
// its last beat is half that old, so no job handed off still starts here.
type Heartbeat struct {
	id     string
	store  *store.DB
	logger *slog.Logger
	last   atomic.Int64 // unix nanoseconds of the last beat the store took
}

// NewHeartbeat returns the heartbeat of this process, named after its host,
// pid and a random part (a restarted process is a new worker).
func NewHeartbeat(db *store.DB, logger *slog.Logger) *Heartbeat {
	host, _ := os.Hostname()
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	return &Heartbeat{id: fmt.Sprintf("%s:%d:%s", host, os.Getpid(), ids.New("w")), store: db, logger: logger}
}

// ID is the worker's id in the store; "" for none.
func (hb *Heartbeat) ID() string {
	if hb == nil {
		return ""
	}
	return hb.id
}

// Beat records one beat.
func (hb *Heartbeat) Beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, store.WorkerBeatInterval)
	defer cancel()
	at := time.Now()
	if err := hb.store.WorkerBeat(ctx, hb.id); err != nil {
		return err
	}
	hb.last.Store(at.UnixNano())
	return nil
}

// Fresh reports whether the store took a beat recently enough that no
// reconciler can have taken this process for dead; none (nil) always is.
func (hb *Heartbeat) Fresh() bool {
	if hb == nil {
		return true
	}
	return time.Since(time.Unix(0, hb.last.Load())) < store.WorkerDeadAfter/2
}

// Start beats once (so the process starts only with a heartbeat) and then
// every store.WorkerBeatInterval until the returned stop is called, which
// removes the worker from the store: its jobs, if any, are handed on at
// once.
func (hb *Heartbeat) Start(ctx context.Context) (stop func(), err error) {
	if err := hb.Beat(ctx); err != nil {
		return nil, fmt.Errorf("worker heartbeat: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop.Every(ctx, store.WorkerBeatInterval, false, hb.Beat, hb.logger, "worker heartbeat: beat failed")
	}()
	return func() {
		cancel()
		<-done
		gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer gcancel()
		if err := hb.store.WorkerGone(gctx, hb.id); err != nil {
			hb.logger.Warn("worker heartbeat: remove", "err", err)
		}
	}, nil
}
