package store

import (
	"context"
	"fmt"
	"time"
)

// JobGetByID returns the job, or ErrNotFound.
func (db *DB) JobGetByID(ctx context.Context, id string) (*Job, error) {
	return getOne(ctx, db.ro, scanJob, "job", id, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, id)
}

// JobGetForTenant returns the tenant's job without its Request; another
// tenant's is ErrNotFound. It reads by the primary key alone: with the
// tenant in the WHERE clause, stale statistics may pick the tenant's index.
func (db *DB) JobGetForTenant(ctx context.Context, tenantID, id string) (*Job, error) {
	j, err := getOne(ctx, db.ro, scanJob, "job", id, `SELECT `+jobViewColumns+` FROM jobs WHERE id = $1`, id)
	if err == nil && j.TenantID != tenantID {
		return nil, notFound("job", id)
	}
	return j, err
}

// JobListParams select a page of a tenant's jobs.
type JobListParams struct {
	TenantID string
	Status   JobStatus // optional
	BatchID  string    // optional
	After    string    // id of the last job of the previous page; "" for the first page
	Limit    int       // default 20, at most 1000
}

// JobList returns a page of the tenant's jobs without their Request.
func (db *DB) JobList(ctx context.Context, p *JobListParams) ([]*Job, bool, error) {
	if err := required("JobList", "TenantID", p.TenantID); err != nil {
		return nil, false, err
	}
	return page(ctx, db.ro, scanJob, jobListSQL(p))
}

// jobListSQL reads jobs_tenant, jobs_tenant_status, jobs_batch or jobs_batch_status.
func jobListSQL(p *JobListParams) pageQuery {
	return tenantPage(`SELECT `+jobViewColumns+` FROM jobs`, p.After, p.Limit,
		"tenant_id", p.TenantID, "status", string(p.Status), "batch_id", p.BatchID)
}

// JobListUnfinishedParams select a page of unfinished jobs.
type JobListUnfinishedParams struct {
	// UpdatedBefore, when set, skips jobs touched since.
	UpdatedBefore time.Time
	// SkipValidating skips the jobs of batches still validating.
	SkipValidating bool
	// SkipOffloaded skips the jobs at a provider's Batch API.
	SkipOffloaded bool
	After         string // id of the last job of the previous page
	Limit         int    // default 1000, at most 10000
}

// JobListUnfinished returns a page of unfinished jobs, oldest first.
func (db *DB) JobListUnfinished(ctx context.Context, p *JobListUnfinishedParams) ([]*Job, bool, error) {
	return page(ctx, db.ro, scanJob, jobListUnfinishedSQL(db.d, p))
}

// jobListUnfinishedSQL reads jobs_unfinished.
func jobListUnfinishedSQL(d *dialect, p *JobListUnfinishedParams) pageQuery {
	var a args
	q := `SELECT ` + jobColumns + ` FROM jobs WHERE ` + unfinishedSQL
	if !p.UpdatedBefore.IsZero() {
		q += ` AND updated_at < ` + a.add(d.ts(p.UpdatedBefore))
	}
	if p.SkipValidating {
		q += ` AND (batch_id IS NULL OR NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = jobs.batch_id AND b.status = 'validating'))`
	}
	if p.SkipOffloaded {
		q += ` AND batch_part_id IS NULL`
	}
	return pageSQL(q, a, p.After, false, p.Limit)
}

// JobStreamByBatch calls fn with each job of the batch whose status is one
// of statuses (any when empty), in line order.
func (db *DB) JobStreamByBatch(ctx context.Context, batchID string, statuses []JobStatus, fn func(*Job) error) error {
	st := make([]any, len(statuses))
	for i, s := range statuses {
		st[i] = string(s)
	}
	return stream(ctx, db, "JobStreamByBatch", scanJob, func(last *Job) (string, args) {
		after := -1
		if last != nil {
			after = last.LineNo
		}
		return jobStreamSQL(batchID, after, st, db.streamBatch)
	}, fn)
}

// stream calls fn with each row of the pages next reads (after the last
// row of the one before, nil for the first) until one is short. No
// connection is held while fn runs, so fn may use the store.
func stream[T any](ctx context.Context, db *DB, what string, scan func(row) (*T, error), next func(last *T) (string, args), fn func(*T) error) error {
	var last *T
	for {
		q, a := next(last)
		rows, err := collect(ctx, db.ro, scan, q, a...)
		if err != nil {
			return fmt.Errorf("store: %s: %w", what, err)
		}
		for _, r := range rows {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(rows) < db.streamBatch {
			return nil
		}
		last = rows[len(rows)-1]
	}
}

// jobStreamSQL reads jobs_batch_line.
func jobStreamSQL(batchID string, after int, statuses []any, limit int) (string, args) {
	var a args
	q := `SELECT ` + jobColumns + ` FROM jobs WHERE batch_id = ` + a.add(batchID) + ` AND line_no > ` + a.add(after)
	if len(statuses) > 0 {
		q += ` AND status IN (` + list(&a, statuses) + `)`
	}
	return q + ` ORDER BY line_no LIMIT ` + a.add(limit), a
}

// JobCounts are a batch's jobs by status.
type JobCounts struct {
	Queued, Running, Waiting, Deferred int64
	Succeeded, Failed, Cancelled       int64
	Total                              int64
}

// Unfinished is how many jobs are not terminal.
func (c *JobCounts) Unfinished() int64 { return c.Queued + c.Running + c.Waiting + c.Deferred }

// sqlJobCountsByBatch reads jobs_batch_status, the index alone on Postgres.
const sqlJobCountsByBatch = `SELECT status, count(*) FROM jobs WHERE batch_id = $1 GROUP BY status`

// JobCountsByBatch counts the batch's jobs by status.
func (db *DB) JobCountsByBatch(ctx context.Context, batchID string) (*JobCounts, error) {
	c := &JobCounts{}
	counts := map[JobStatus]*int64{JobQueued: &c.Queued, JobRunning: &c.Running, JobWaiting: &c.Waiting,
		JobDeferred: &c.Deferred, JobSucceeded: &c.Succeeded, JobFailed: &c.Failed, JobCancelled: &c.Cancelled}
	err := db.ro.query(ctx, sqlJobCountsByBatch, []any{batchID}, func(r row) error {
		var s JobStatus
		var n int64
		err := r.Scan(&s, &n)
		if count := counts[s]; count != nil {
			*count = n
		}
		c.Total += n
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}
