package batch

import (
	"context"
	"fmt"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/loop"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// sweeperLock keeps to one the processes sweeping at a time.
const sweeperLock = "batch-sweeper"

// Run sweeps the unfinished batches every second until ctx ends.
// Every dispatcher runs it; a store lock lets one sweep at a time.
func (s *Service) Run(ctx context.Context) {
	loop.Every(ctx, sweepInterval, true, s.Sweep, s.Logger, "batch sweep failed")
}

// Sweep moves every unfinished batch on once (step), unless another process
// is sweeping; a batch that another process holds is left for the next.
func (s *Service) Sweep(ctx context.Context) error {
	unlock, ok, err := s.Store.TryLock(ctx, sweeperLock)
	if err != nil || !ok {
		return err
	}
	defer unlock()
	p := &store.BatchListActiveParams{Limit: 1000}
	for {
		bs, more, err := s.Store.BatchListActive(ctx, p)
		if err != nil {
			return err
		}
		for _, b := range bs {
			if err := s.step(ctx, b); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.Logger.Warn("batch step failed; the next sweep tries again", "batch", b.ID, "status", b.Status, "err", err)
			}
		}
		if !more || len(bs) == 0 {
			return nil
		}
		p.After = bs[len(bs)-1].ID
	}
}

func (s *Service) step(ctx context.Context, b *store.Batch) error {
	if b.Status == store.BatchValidating && !s.expired(b) {
		s.Start(b.ID)
		return nil
	}
	unlock, ok, err := s.Store.TryLock(ctx, lockName(b.ID))
	if err != nil || !ok {
		return err
	}
	defer unlock()
	if b, err = s.Store.BatchGetByID(ctx, b.ID); err != nil { // as it is under the lock
		return err
	}
	switch b.Status {
	case store.BatchValidating: // past its expiry, its validation not running
		if s.expired(b) {
			return s.expireValidating(ctx, b)
		}
	case store.BatchInProgress:
		if s.expired(b) {
			return s.stop(ctx, b, store.BatchExpired, b.ExpiresAt)
		}
		c, err := s.Store.JobCountsByBatch(ctx, b.ID)
		if err != nil || c.Unfinished() > 0 {
			return err
		}
		b, _, err = s.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{ID: b.ID,
			From: []store.BatchStatus{store.BatchInProgress}, To: store.BatchFinalizing})
		if err != nil || b.Status != store.BatchFinalizing {
			return err
		}
		fallthrough
	case store.BatchFinalizing: // this finalization, or one that stopped half way
		return s.finish(ctx, b, store.BatchCompleted, nil, nil)
	case store.BatchCancelling:
		return s.stop(ctx, b, store.BatchCancelled, b.CancellingAt)
	}
	return nil
}

func (s *Service) expired(b *store.Batch) bool {
	return b.ExpiresAt != nil && !s.opts.Now().Before(*b.ExpiresAt)
}

// expireValidating expires a batch whose window ended before its
// validation did: nothing of it was enqueued, so the jobs it stored are
// cancelled at once. The caller holds the batch's lock.
func (s *Service) expireValidating(ctx context.Context, b *store.Batch) error {
	total, err := s.cancelStored(ctx, b.ID)
	if err != nil {
		return err
	}
	return s.finish(ctx, b, store.BatchExpired, total, []client.BatchError{{Code: client.CodeBatchExpired,
		Message: "The completion window ended before the input file was validated; no request of the batch ran."}})
}

// stop ends a cancelled or expired batch: its pending jobs are cancelled at
// once (again at every sweep: a running job may come back to waiting after
// a 429); running ones may finish, for stopGrace after the stop (at), and
// are then cancelled too. Once none runs, the batch ends as final, with the
// results of what finished.
func (s *Service) stop(ctx context.Context, b *store.Batch, final store.BatchStatus, at *time.Time) error {
	if _, err := s.Store.JobCancelByBatch(ctx, b.ID); err != nil {
		return err
	}
	c, err := s.Store.JobCountsByBatch(ctx, b.ID)
	if err != nil {
		return err
	}
	if c.Unfinished() > 0 {
		if at == nil || s.opts.Now().Sub(*at) < stopGrace {
			return nil
		}
		s.Logger.Warn("batch jobs still running after the grace period; cancelling them", "batch", b.ID, "running", c.Running)
		err := s.Store.JobStreamByBatch(ctx, b.ID, []store.JobStatus{store.JobQueued, store.JobRunning, store.JobWaiting, store.JobDeferred},
			func(j *store.Job) error {
				_, _, err := s.Store.JobCancel(ctx, j.TenantID, j.ID)
				return err
			})
		if err != nil {
			return err
		}
	}
	return s.finish(ctx, b, final, nil, nil)
}

// finish ends a batch as final: it makes its output and error files and
// enqueues its webhook before the status moves, so a crash never loses the
// call (the delivery waits for the terminal state).
func (s *Service) finish(ctx context.Context, b *store.Batch, final store.BatchStatus, total *int64, errs []client.BatchError) error {
	outputID, errorID, err := s.writeFiles(ctx, b, final)
	if err != nil {
		return fmt.Errorf("make files: %w", err)
	}
	if b.WebhookURL != "" {
		if _, err := s.Queue.EnqueueWebhook(ctx, queue.WebhookPayload{Kind: store.WebhookBatch, ID: b.ID}); err != nil {
			return err
		}
	}
	nb, applied, err := s.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{ID: b.ID,
		From: []store.BatchStatus{b.Status}, To: final, OutputFileID: outputID, ErrorFileID: errorID,
		Total: total, Errors: errorsJSON(errs)})
	if err != nil {
		return err
	}
	if applied {
		s.Logger.Info("batch ended", "batch", b.ID, "status", final)
	} else {
		s.Logger.Warn("batch changed while it was ending; the next sweep looks again", "batch", b.ID, "status", nb.Status)
	}
	return nil
}
