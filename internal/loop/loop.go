// Package loop runs the loops of background work: periodic passes (the
// sweeps, the purge, the reconciler's checks, the worker's heartbeat) and
// the walk over a listing's pages.
package loop

import (
	"context"
	"log/slog"
	"time"
)

// Every runs pass every interval until ctx ends, and once at the start too
// when atOnce. A failed pass is logged as msg (not once ctx ended); the
// next tick tries again.
func Every(ctx context.Context, interval time.Duration, atOnce bool, pass func(context.Context) error,
	log *slog.Logger, msg string) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for run := atOnce; ; run = true {
		if run {
			if err := pass(ctx); err != nil && ctx.Err() == nil {
				log.Warn(msg, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pages calls fn on every item of every page list gives, each page asked
// for with *after set to the last id of the one before.
func Pages[T any](after *string, list func() ([]T, bool, error), id func(T) string, fn func(T) error) error {
	for {
		items, more, err := list()
		if err != nil {
			return err
		}
		for _, it := range items {
			if err := fn(it); err != nil {
				return err
			}
		}
		if !more || len(items) == 0 {
			return nil
		}
		*after = id(items[len(items)-1])
	}
}
