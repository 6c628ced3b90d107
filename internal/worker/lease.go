package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/store"
)

// Lease is a worker process's hold on the jobs it runs: it beats in the
// store every store.WorkerBeatInterval, and the jobs the process starts
// name it. When the process dies, the dispatcher's reconciler hands its
// running jobs to other workers once store.WorkerDeadAfter has passed
// without a beat — seconds, where asynq alone takes its task lease (30s)
// and its recoverer's next pass (each minute). A process whose beats fail
// starts no more provider calls once its last beat is half that old, so
// the jobs handed off are not also still starting here.
type Lease struct {
	id     string
	store  *store.DB
	logger *slog.Logger
	last   atomic.Int64 // unix nanoseconds of the last beat the store took
}

// NewLease returns the lease of this process, named after its host and pid
// and a random part (a restarted process is a new worker).
func NewLease(db *store.DB, logger *slog.Logger) *Lease {
	host, _ := os.Hostname()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Lease{id: fmt.Sprintf("%s:%d:%s", host, os.Getpid(), ids.New("w")), store: db, logger: logger}
}

// ID is the worker's id in the store.
func (l *Lease) ID() string {
	if l == nil {
		return ""
	}
	return l.id
}

// Beat records one beat; Start's loop calls it.
func (l *Lease) Beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, store.WorkerBeatInterval)
	defer cancel()
	at := time.Now()
	if err := l.store.WorkerBeat(ctx, l.id); err != nil {
		return err
	}
	l.last.Store(at.UnixNano())
	return nil
}

// Fresh reports whether the store took a beat recently enough that no
// reconciler can have taken this process for dead: a process without a
// lease (nil) always is.
func (l *Lease) Fresh() bool {
	if l == nil {
		return true
	}
	return time.Since(time.Unix(0, l.last.Load())) < store.WorkerDeadAfter/2
}

// Start beats once (so the process starts only with a lease) and then every
// store.WorkerBeatInterval until the returned stop is called, which removes
// the worker from the store: its jobs, if any were left, are handed on at
// once.
func (l *Lease) Start(ctx context.Context) (stop func(), err error) {
	if err := l.Beat(ctx); err != nil {
		return nil, fmt.Errorf("worker lease: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(store.WorkerBeatInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := l.Beat(ctx); err != nil && ctx.Err() == nil {
					l.logger.Warn("worker lease: beat failed", "err", err)
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
		gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer gcancel()
		if err := l.store.WorkerGone(gctx, l.id); err != nil {
			l.logger.Warn("worker lease: remove", "err", err)
		}
	}, nil
}
