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

// The writes every job makes (its insert, its start, its result) are
// grouped on Postgres: calls made while another of the same kind is under
// way go together in the next, one pgx batch run as one implicit
// transaction, so that they share one round trip and one commit. A lone
// call goes at once, alone. Each call returns only once its own statement
// is committed, as without the group, and its outcome is its own: when a
// group's transaction fails as a whole (one statement's error aborts it),
// each statement runs again on its own. SQLite has one writer: it runs
// every call on its own.

// maxGroup bounds the statements of one group.
const maxGroup = 64

// groupTimeout bounds a group's transaction: it is everyone's, so no
// caller's context cancels it.
const groupTimeout = 30 * time.Second

// jobStatement is a statement that returns one job row (jobColumns), or
// none.
type jobStatement struct {
	query string
	args  args
}

// groups are the DB's grouped writes.
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

// queryJobGrouped runs a statement of kind (its statements are alike, so
// they group well) that returns one job row, in a group with the
// statements of that kind made meanwhile; no row is sql.ErrNoRows.
func (db *DB) queryJobGrouped(ctx context.Context, kind, query string, a args) (*Job, error) {
	if db.d.name != "postgres" {
		return db.queryJob(ctx, db.rw, query, a...)
	}
	return db.groups.jobRows.Do(ctx, kind, jobStatement{query: query, args: a})
}

// queryJobs runs sts in one pgx batch: one round trip, one commit.
func (db *DB) queryJobs(ctx context.Context, _ string, sts []jobStatement) ([]*Job, []error) {
	ctx, cancel := context.WithTimeout(ctx, groupTimeout)
	defer cancel()
	jobs, errs := make([]*Job, len(sts)), make([]error, len(sts))
	if len(sts) == 1 {
		jobs[0], errs[0] = db.queryJob(ctx, db.rw, sts[0].query, sts[0].args...)
		return jobs, errs
	}
	err := db.withPgx(ctx, func(c *pgx.Conn) error {
		b := &pgx.Batch{}
		for _, st := range sts {
			b.Queue(st.query, st.args...)
		}
		// A batch without transaction statements runs as one implicit
		// transaction: its rows are committed together or not at all.
		br := c.SendBatch(ctx, b)
		for i := range sts {
			jobs[i], errs[i] = readJobPgx(br.Query())
			if errors.Is(errs[i], pgx.ErrNoRows) {
				errs[i] = sql.ErrNoRows
			} else if errs[i] != nil {
				_ = br.Close()
				return errs[i]
			}
		}
		return br.Close()
	})
	var refused *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &refused):
		// The server refused a statement, so it committed none: each
		// runs again on its own, and the refused one fails alone.
		for i, st := range sts {
			jobs[i], errs[i] = db.queryJob(ctx, db.rw, st.query, st.args...)
		}
	default:
		// Whether the group committed is not known (the connection
		// failed): every caller gets the error, as a lone statement's
		// caller would.
		for i := range sts {
			jobs[i], errs[i] = nil, err
		}
	}
	return jobs, errs
}
