// Package loop runs a process's periodic passes: the sweeps, the purge,
// the reconciler's checks and the worker's heartbeat.
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
