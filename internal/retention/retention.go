// Package retention purges what the policy's retention no longer keeps:
// the request and response of jobs finished longer ago than
// retention.finished_jobs (their status, usage and cost stay), the files
// made longer ago than retention.files that no running batch uses, the
// usage ledger's rows charged longer ago than retention.ledger (folded into
// daily totals, so no dollar of spend is lost), and the records of stored
// responses past store.StoredResponseRetention. It works in small batches,
// each a short transaction of its own, with a pause between batches, so the
// API and the workers never wait behind it.
package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/loop"
	"github.com/llmq/llmq/internal/store"
)

// Store is what the purger needs of the store.
type Store interface {
	JobPurgeBodies(ctx context.Context, before time.Time, limit int) (int64, error)
	JobCountPurgeable(ctx context.Context, before time.Time) (int64, error)
	FileListPurgeable(ctx context.Context, before time.Time, limit int) ([]store.PurgeableFile, error)
	FileDelete(ctx context.Context, tenantID, id string) error
	UsageRollUp(ctx context.Context, before time.Time, limit int) (int64, error)
	UsageCountRollable(ctx context.Context, before time.Time) (int64, error)
	StoredResponsePurge(ctx context.Context, before time.Time, limit int) (int64, error)
}

// The default of Purger.Batch, the wait between two statements, and how
// often the dispatcher purges.
const (
	DefaultBatch = 500
	pause        = 20 * time.Millisecond
	Interval     = 10 * time.Minute
)

// Purger applies the retention of the current policy.
type Purger struct {
	Store Store
	// Retention returns the policy's retention (it may change on reload).
	Retention func() config.Retention
	// Now defaults to time.Now.
	Now func() time.Time
	// Batch is the rows of one statement. Defaults to DefaultBatch.
	Batch int
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Report is what one pass purged, or what it would purge (Preview).
type Report struct {
	// JobsBefore, FilesBefore and LedgerBefore are the cut-offs (zero when
	// kept for ever).
	JobsBefore, FilesBefore, LedgerBefore time.Time
	Jobs, Files, FileBytes                int64
	// LedgerRows is the ledger rows folded into daily totals.
	LedgerRows int64
	// StoredResponses is the records of stored responses purged (Purge only).
	StoredResponses int64
}

func (p *Purger) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *Purger) log() *slog.Logger { return cmp.Or(p.Logger, slog.New(slog.DiscardHandler)) }

// cutoffs is a report with the instants before which jobs, files and
// ledger rows go; zero = keep.
func (p *Purger) cutoffs() Report {
	r, now := p.Retention(), p.now()
	before := func(age time.Duration) time.Time {
		if age > 0 {
			return now.Add(-age)
		}
		return time.Time{}
	}
	return Report{JobsBefore: before(r.FinishedJobs), FilesBefore: before(r.Files), LedgerBefore: before(r.Ledger)}
}

const previewFiles = 100000

// Preview says what a pass would purge now, changing nothing.
func (p *Purger) Preview(ctx context.Context) (Report, error) {
	rep := p.cutoffs()
	var err error
	if !rep.JobsBefore.IsZero() {
		if rep.Jobs, err = p.Store.JobCountPurgeable(ctx, rep.JobsBefore); err != nil {
			return rep, err
		}
	}
	if !rep.LedgerBefore.IsZero() {
		if rep.LedgerRows, err = p.Store.UsageCountRollable(ctx, rep.LedgerBefore); err != nil {
			return rep, err
		}
	}
	if !rep.FilesBefore.IsZero() {
		fs, err := p.Store.FileListPurgeable(ctx, rep.FilesBefore, previewFiles)
		if err != nil {
			return rep, err
		}
		for _, f := range fs {
			rep.Files++
			rep.FileBytes += f.Bytes
		}
	}
	return rep, nil
}

// Purge runs one pass: every job, ledger row, stored response record and
// file past its age, a batch at a time, until none is left or ctx ends.
func (p *Purger) Purge(ctx context.Context) (Report, error) {
	rep := p.cutoffs()
	batch := cmp.Or(p.Batch, DefaultBatch)
	// inBatches runs step until it takes fewer than batch rows.
	inBatches := func(step func() (taken int, err error)) error {
		for {
			n, err := step()
			if err != nil || n < batch {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pause):
			}
		}
	}
	// counted is a step of a store call that returns how many rows it took.
	counted := func(call func(context.Context, time.Time, int) (int64, error), before time.Time, total *int64) func() (int, error) {
		return func() (int, error) {
			n, err := call(ctx, before, batch)
			*total += n
			return int(n), err
		}
	}
	if !rep.JobsBefore.IsZero() {
		if err := inBatches(counted(p.Store.JobPurgeBodies, rep.JobsBefore, &rep.Jobs)); err != nil {
			return rep, err
		}
	}
	if !rep.LedgerBefore.IsZero() {
		if err := inBatches(counted(p.Store.UsageRollUp, rep.LedgerBefore, &rep.LedgerRows)); err != nil {
			return rep, err
		}
	}
	if err := inBatches(counted(p.Store.StoredResponsePurge, p.now().Add(-store.StoredResponseRetention), &rep.StoredResponses)); err != nil {
		return rep, err
	}
	if !rep.FilesBefore.IsZero() {
		err := inBatches(func() (int, error) {
			fs, err := p.Store.FileListPurgeable(ctx, rep.FilesBefore, batch)
			if err != nil {
				return 0, err
			}
			for _, f := range fs {
				// One file a transaction: its chunks (up to 200 MiB) go with it.
				err := p.Store.FileDelete(ctx, f.TenantID, f.ID)
				if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
					return 0, fmt.Errorf("retention: delete file %s: %w", f.ID, err)
				}
				if err == nil {
					rep.Files++
					rep.FileBytes += f.Bytes
				}
			}
			return len(fs), nil
		})
		if err != nil {
			return rep, err
		}
	}
	if rep.Jobs > 0 || rep.Files > 0 || rep.LedgerRows > 0 || rep.StoredResponses > 0 {
		p.log().Info("retention: purged finished work", "jobs", rep.Jobs, "files", rep.Files, "file_bytes", rep.FileBytes,
			"ledger_rows", rep.LedgerRows, "stored_responses", rep.StoredResponses)
	}
	return rep, nil
}

// Run purges every interval until ctx ends; a failed pass is logged and
// tried again at the next.
func (p *Purger) Run(ctx context.Context, interval time.Duration) {
	purge := func(ctx context.Context) error {
		_, err := p.Purge(ctx)
		return err
	}
	loop.Every(ctx, interval, false, purge, p.log(), "retention: purge")
}
