package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// lockedWriter lets the run's lines and the workers' warnings share one
// writer (a test's buffer is not safe for concurrent writes).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// quietHandler drops asynq's warning for every task still running when a
// stack stops (the benchmark stops its stacks with their queues full), so
// the warnings that are left are worth reading.
type quietHandler struct{ slog.Handler }

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "asynq: Quitting worker") {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(as)}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name)}
}
