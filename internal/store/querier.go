package store

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// querier runs SQL on either driver: pgx's pool or transaction on Postgres,
// database/sql's on SQLite. A driver error that means the database cannot
// serve now leaves it as ErrUnavailable (dialect.outage): a broken
// connection's error is a bare io.ErrUnexpectedEOF, as Redis's is.
type querier interface {
	// exec returns how many rows the statement changed.
	exec(ctx context.Context, query string, args ...any) (int64, error)
	// queryRow's no row is sql.ErrNoRows when scanned (pgx.ErrNoRows wraps it).
	queryRow(ctx context.Context, query string, args ...any) row
	// query calls each with the rows in order; each's error stops it.
	query(ctx context.Context, query string, args []any, each func(row) error) error
}

// row is one result row of either driver.
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
	return tag.RowsAffected(), postgresDialect.outage(err)
}

func (q pgxQuerier) queryRow(ctx context.Context, query string, args ...any) row {
	return outageRow{q.c.QueryRow(ctx, query, args...), postgresDialect}
}

func (q pgxQuerier) query(ctx context.Context, query string, args []any, each func(row) error) error {
	rows, err := q.c.Query(ctx, query, args...)
	if err != nil {
		return postgresDialect.outage(err)
	}
	defer rows.Close()
	return eachRow(rows, each, postgresDialect)
}

// outageRow is a row whose Scan's error goes through its dialect's outage.
type outageRow struct {
	r row
	d *dialect
}

func (o outageRow) Scan(dest ...any) error { return o.d.outage(o.r.Scan(dest...)) }

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
		return 0, sqliteDialect.outage(err)
	}
	n, err := res.RowsAffected()
	return n, sqliteDialect.outage(err)
}

func (q sqlQuerier) queryRow(ctx context.Context, query string, args ...any) row {
	return outageRow{q.c.QueryRowContext(ctx, query, args...), sqliteDialect}
}

func (q sqlQuerier) query(ctx context.Context, query string, args []any, each func(row) error) error {
	rows, err := q.c.QueryContext(ctx, query, args...)
	if err != nil {
		return sqliteDialect.outage(err)
	}
	defer rows.Close()
	return eachRow(rows, each, sqliteDialect)
}

// eachRow calls each with every row of rows; each's error is returned as
// it is (it may be the caller's own), the rows' own through d's outage.
func eachRow(rows interface {
	row
	Next() bool
	Err() error
}, each func(row) error, d *dialect) error {
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return d.outage(rows.Err())
}

func collect[T any](ctx context.Context, q querier, scan func(row) (T, error), query string, args ...any) ([]T, error) {
	var out []T
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

// tx runs fn in a write transaction, committing if fn returns nil; its
// error is classified.
func (db *DB) tx(ctx context.Context, fn func(q querier) error) error {
	return db.d.wrap(db.d.tx(ctx, db, fn))
}

// pgxTx and sqlTx classify the errors of their own calls; fn's queries
// classify theirs.
func pgxTx(ctx context.Context, db *DB, fn func(querier) error) error {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return db.d.outage(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // once committed, a no-op
	if err := fn(pgxQuerier{tx}); err != nil {
		return err
	}
	return db.d.outage(tx.Commit(ctx))
}

func sqlTx(ctx context.Context, db *DB, fn func(querier) error) error {
	tx, err := db.writer.BeginTx(ctx, nil)
	if err != nil {
		return db.d.outage(err)
	}
	if err := fn(sqlQuerier{tx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return db.d.outage(tx.Commit())
}
