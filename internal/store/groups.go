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

// statement returns one row, or none.
type statement struct {
	query string
	args  args
}

type groups struct {
	jobRows  coalesce.Batch[string, statement, *Job]
	complete coalesce.Batch[struct{}, statement, *JobCompleteResult]
}

func (db *DB) initGroups() {
	db.groups.jobRows = coalesce.Batch[string, statement, *Job]{Max: maxGroup,
		Fn: func(ctx context.Context, _ string, sts []statement) ([]*Job, []error) {
			ctx, cancel := context.WithTimeout(ctx, groupTimeout)
			defer cancel()
			return runGroup(ctx, db, sts, scanJob, false)
		}}
	db.groups.complete = coalesce.Batch[struct{}, statement, *JobCompleteResult]{Max: maxGroup,
		Fn: func(ctx context.Context, _ struct{}, sts []statement) ([]*JobCompleteResult, []error) {
			ctx, cancel := context.WithTimeout(ctx, groupTimeout)
			defer cancel()
			return runGroup(ctx, db, sts, scanComplete, true)
		}}
}

// queryJobGrouped runs query in a group of kind (alone when kind is ""); no
// row is sql.ErrNoRows.
func (db *DB) queryJobGrouped(ctx context.Context, kind, query string, a args) (*Job, error) {
	if !db.d.groupWrites || kind == "" {
		return scanJob(db.rw.queryRow(ctx, query, a...))
	}
	return db.groups.jobRows.Do(ctx, kind, statement{query: query, args: a})
}

// runGroup runs sts in one pgx batch and scans each one's row; a statement
// whose row is missing (sql.ErrNoRows, ErrNotFound) fails alone. When the
// batch fails otherwise, whether it committed is not known: every caller
// gets the error, as a lone statement's caller would, unless rerun says
// the statements may run twice.
func runGroup[R any](ctx context.Context, db *DB, sts []statement, scan func(row) (R, error), rerun bool) ([]R, []error) {
	rs, errs := make([]R, len(sts)), make([]error, len(sts))
	alone := func() ([]R, []error) {
		for i, st := range sts {
			rs[i], errs[i] = scan(db.rw.queryRow(ctx, st.query, st.args...))
		}
		return rs, errs
	}
	if len(sts) <= 1 {
		return alone()
	}
	b := &pgx.Batch{}
	for i, st := range sts {
		b.Queue(st.query, st.args...).QueryRow(func(r pgx.Row) error {
			rs[i], errs[i] = scan(r)
			if errors.Is(errs[i], sql.ErrNoRows) || errors.Is(errs[i], ErrNotFound) {
				return nil
			}
			return errs[i]
		})
	}
	err := db.d.outage(db.pool.SendBatch(ctx, b).Close())
	var refused *pgconn.PgError
	switch {
	case err == nil:
	case rerun || errors.As(err, &refused):
		// A refused statement committed none: each runs again on its own,
		// and the refused one fails alone.
		return alone()
	default:
		for i := range sts {
			errs[i] = err
		}
		clear(rs)
	}
	return rs, errs
}
