package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/coalesce"
)

// The writes every job makes are grouped on Postgres (coalesce.Batch), one
// pgx batch each, which runs as one implicit transaction; when the server
// refuses one statement, each runs again on its own.

const maxGroup = 64

// groupTimeout bounds a group's transaction: it is everyone's, so no
// caller's context cancels it.
const groupTimeout = 30 * time.Second

// jobStatement returns one job row, or none.
type jobStatement struct {
	query string
	args  args
}

type groups struct {
	jobRows  coalesce.Batch[string, jobStatement, *Job]
	complete coalesce.Batch[struct{}, *JobCompleteParams, *JobCompleteResult]
}

func (db *DB) initGroups() {
	db.groups.jobRows = coalesce.Batch[string, jobStatement, *Job]{Max: maxGroup, Fn: db.queryJobs}
	db.groups.complete = coalesce.Batch[struct{}, *JobCompleteParams, *JobCompleteResult]{Max: maxGroup,
		Fn: func(ctx context.Context, _ struct{}, ps []*JobCompleteParams) ([]*JobCompleteResult, []error) {
			ctx, cancel := context.WithTimeout(ctx, groupTimeout)
			defer cancel()
			return db.JobCompleteMany(ctx, &JobCompleteManyParams{Jobs: ps})
		}}
}

// queryJobGrouped runs query in a group of kind (alone when kind is ""); no
// row is sql.ErrNoRows.
func (db *DB) queryJobGrouped(ctx context.Context, kind, query string, a args) (*Job, error) {
	if !db.d.groupWrites || kind == "" {
		return scanJob(db.rw.queryRow(ctx, query, a...))
	}
	return db.groups.jobRows.Do(ctx, kind, jobStatement{query: query, args: a})
}

func (db *DB) queryJobs(ctx context.Context, _ string, sts []jobStatement) ([]*Job, []error) {
	ctx, cancel := context.WithTimeout(ctx, groupTimeout)
	defer cancel()
	jobs, errs := make([]*Job, len(sts)), make([]error, len(sts))
	alone := func() ([]*Job, []error) {
		for i, st := range sts {
			jobs[i], errs[i] = scanJob(db.rw.queryRow(ctx, st.query, st.args...))
		}
		return jobs, errs
	}
	if len(sts) == 1 {
		return alone()
	}
	b := &pgx.Batch{}
	for i, st := range sts {
		b.Queue(st.query, st.args...).QueryRow(func(r pgx.Row) error {
			jobs[i], errs[i] = scanJob(r)
			if errors.Is(errs[i], sql.ErrNoRows) {
				return nil
			}
			return errs[i]
		})
	}
	err := db.d.outage(db.pool.SendBatch(ctx, b).Close())
	var refused *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &refused):
		// The server refused a statement, so it committed none: each
		// runs again on its own, and the refused one fails alone.
		return alone()
	default:
		// Whether the group committed is not known: every caller gets the
		// error, as a lone statement's caller would.
		for i := range sts {
			jobs[i], errs[i] = nil, err
		}
	}
	return jobs, errs
}
