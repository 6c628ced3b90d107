// Package retention purges what the policy's retention no longer keeps:
// the request and response of jobs finished longer ago than
// retention.finished_jobs (their status, usage and cost stay), and the
// files made longer ago than retention.files that no running batch uses.
// It works in small batches, each a short transaction of its own that
// locks only the rows it changes and skips rows others hold, with a pause
// between batches, so the API and the workers never wait behind it.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
)

// Store is what the purger needs of the store.
type Store interface {
	JobPurgeBodies(ctx context.Context, before time.Time, limit int) (int64, error)
	JobCountPurgeable(ctx context.Context, before time.Time) (int64, error)
	FileListPurgeable(ctx context.Context, before time.Time, limit int) ([]store.PurgeableFile, error)
	FileDelete(ctx context.Context, tenantID, id string) error
}

// Defaults of Purger's tunables, and how often the dispatcher purges.
const (
	DefaultBatch = 500
	DefaultPause = 20 * time.Millisecond
	Interval     = 10 * time.Minute
)

// Purger applies the retention of the current policy.
type Purger struct {
	Store Store
	// Retention returns the policy's retention (it may change on reload).
	Retention func() config.Retention
	// Now defaults to time.Now.
	Now func() time.Time
	// Batch is the rows of one statement (default DefaultBatch); Pause the
	// wait between two (default DefaultPause).
	Batch int
	Pause time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Report is what one pass purged, or what it would purge (Preview).
type Report struct {
	// JobsBefore and FilesBefore are the cut-offs (zero when kept for ever).
	JobsBefore, FilesBefore time.Time
	Jobs                    int64
	Files                   int64
	FileBytes               int64
}

func (p *Purger) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *Purger) log() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// cutoffs are the instants before which jobs and files go; zero = keep.
func (p *Purger) cutoffs() (jobs, files time.Time) {
	r, now := p.Retention(), p.now()
	if r.FinishedJobs > 0 {
		jobs = now.Add(-r.FinishedJobs)
	}
	if r.Files > 0 {
		files = now.Add(-r.Files)
	}
	return jobs, files
}

// previewFiles is the most files a Preview counts.
const previewFiles = 100000

// Preview says what a pass would purge now, changing nothing.
func (p *Purger) Preview(ctx context.Context) (Report, error) {
	var rep Report
	rep.JobsBefore, rep.FilesBefore = p.cutoffs()
	var err error
	if !rep.JobsBefore.IsZero() {
		if rep.Jobs, err = p.Store.JobCountPurgeable(ctx, rep.JobsBefore); err != nil {
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

// Purge runs one pass: every job and file past its age, a batch at a time,
// until none is left or ctx ends.
func (p *Purger) Purge(ctx context.Context) (Report, error) {
	var rep Report
	rep.JobsBefore, rep.FilesBefore = p.cutoffs()
	batch, pause := p.Batch, p.Pause
	if batch <= 0 {
		batch = DefaultBatch
	}
	if pause <= 0 {
		pause = DefaultPause
	}
	wait := func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
			return nil
		}
	}
	if !rep.JobsBefore.IsZero() {
		for {
			n, err := p.Store.JobPurgeBodies(ctx, rep.JobsBefore, batch)
			rep.Jobs += n
			if err != nil {
				return rep, err
			}
			if n < int64(batch) {
				break
			}
			if err := wait(); err != nil {
				return rep, err
			}
		}
	}
	if !rep.FilesBefore.IsZero() {
		for {
			fs, err := p.Store.FileListPurgeable(ctx, rep.FilesBefore, batch)
			if err != nil {
				return rep, err
			}
			for _, f := range fs {
				// One file a transaction: its chunks (up to 200 MiB) go with it.
				err := p.Store.FileDelete(ctx, f.TenantID, f.ID)
				if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
					return rep, fmt.Errorf("retention: delete file %s: %w", f.ID, err)
				}
				if err == nil {
					rep.Files++
					rep.FileBytes += f.Bytes
				}
			}
			if len(fs) < batch {
				break
			}
			if err := wait(); err != nil {
				return rep, err
			}
		}
	}
	if rep.Jobs > 0 || rep.Files > 0 {
		p.log().Info("retention: purged finished work", "jobs", rep.Jobs, "files", rep.Files, "file_bytes", rep.FileBytes)
	}
	return rep, nil
}

// Run purges every interval until ctx ends; a failed pass is logged and
// tried again at the next.
func (p *Purger) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := p.Purge(ctx); err != nil && ctx.Err() == nil {
			p.log().Warn("retention: purge", "err", err)
		}
	}
}
