package store

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// querier runs SQL on either driver: pgx's pool or transaction on Postgres,
// database/sql's on SQLite. Every method's SQL is the same on both.
type querier interface {
	// exec runs a statement and returns how many rows it changed.
	exec(ctx context.Context, query string, args ...any) (int64, error)
	// queryRow runs a query for one row; no row is sql.ErrNoRows when
	// scanned (pgx.ErrNoRows wraps it).
	queryRow(ctx context.Context, query string, args ...any) row
	// query runs a query and calls each with its rows in order; each's
	// error stops it and is returned.
	query(ctx context.Context, query string, args []any, each func(row) error) error
}

// row is one result row. pgx.Row, pgx.Rows, *sql.Row and *sql.Rows all are,
// so one scan function per row type serves both drivers.
type row interface{ Scan(dest ...any) error }

// pgxQuerier is a querier on a *pgxpool.Pool or a pgx.Tx.
type pgxQuerier struct {
	c interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
}

func (q pgxQuerier) exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := q.c.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (q pgxQuerier) queryRow(ctx context.Context, query string, args ...any) row {
	return q.c.QueryRow(ctx, query, args...)
}

func (q pgxQuerier) query(ctx context.Context, query string, args []any, each func(row) error) error {
	rows, err := q.c.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return eachRow(rows, each)
}

// sqlQuerier is a querier on a *sql.DB or a *sql.Tx.
type sqlQuerier struct {
	c interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
}

func (q sqlQuerier) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.c.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q sqlQuerier) queryRow(ctx context.Context, query string, args ...any) row {
	return q.c.QueryRowContext(ctx, query, args...)
}

func (q sqlQuerier) query(ctx context.Context, query string, args []any, each func(row) error) error {
	rows, err := q.c.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return eachRow(rows, each)
}

// eachRow calls each with every row of rows (pgx.Rows or *sql.Rows) in
// order; each's error stops it and is returned.
func eachRow(rows interface {
	row
	Next() bool
	Err() error
}, each func(row) error) error {
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// collect runs query and scans every row with scan.
func collect[T any](ctx context.Context, q querier, scan func(row) (*T, error), query string, args ...any) ([]*T, error) {
	var out []*T
	err := q.query(ctx, query, args, func(r row) error {
		v, err := scan(r)
		out = append(out, v)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// tx runs fn in a write transaction, committing if fn returns nil. Its
// error is classified (Classify).
func (db *DB) tx(ctx context.Context, fn func(q querier) error) error {
	return db.d.wrap(db.d.tx(ctx, db, fn))
}

func pgxTx(ctx context.Context, db *DB, fn func(querier) error) error {
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return fn(pgxQuerier{tx}) })
}

func sqlTx(ctx context.Context, db *DB, fn func(querier) error) error {
	tx, err := db.writer.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(sqlQuerier{tx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
