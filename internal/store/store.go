// Package store owns llmq's durable state on PostgreSQL (pgx) or SQLite
// (database/sql with modernc.org/sqlite): asynq tasks carry only a job id,
// so everything needed to run, recover or report a job is here.
//
// Conventions: methods are named NounVerb and take a *NounVerbParams when they
// take more than identifiers. A missing row is ErrNotFound (another tenant's
// row too, so existence never leaks), a unique key already taken is
// ErrConflict. All times are UTC with microsecond precision. Lists shown to
// tenants are newest first (ids are time-ordered), a page being the rows
// with id < After; sweeps go oldest first with id > After.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Sentinel errors, checked with errors.Is. The wrapped error names the row.
var (
	// ErrNotFound: no such row, or it belongs to another tenant.
	ErrNotFound = errors.New("store: not found")
	// ErrConflict: a unique key (id, idempotency key, batch line, key hash) is taken.
	ErrConflict = errors.New("store: conflict")
	// ErrInvalidValue: the database refused a value it cannot hold (a NUL or
	// invalid UTF-8 in text, a number out of range, a constraint other than
	// a unique key or a reference, a row too large): the caller's data, not
	// the database's failure; trying again fails again.
	ErrInvalidValue = errors.New("store: invalid value")
	// ErrUnavailable: the database cannot serve now (no answer, a broken
	// connection, shutting down or starting, no connection free, SQLite's
	// lock stayed busy); trying again once it is back succeeds.
	ErrUnavailable = errors.New("store: database unavailable")
)

const (
	defaultListLimit = 20
	maxListLimit     = 1000
)

// DB is llmq's database. It is safe for concurrent use.
type DB struct {
	// rw takes every write and ro the reads: on Postgres both the pool; on
	// SQLite one connection, so writers queue in Go instead of failing with
	// SQLITE_BUSY, and a pool of read-only ones, which WAL lets read meanwhile.
	rw, ro querier
	// Postgres's pool and the pool of its advisory locks' connections.
	pool, locks *pgxpool.Pool
	// SQLite's rw and ro.
	writer, readers *sql.DB
	d               *dialect
	log             *slog.Logger
	groups          groups

	// lockScope keeps TryLock names of different databases apart: the
	// Postgres schema or the SQLite file's path.
	lockScope string

	// Tunables; tests shrink them.
	chunkSize          int // bytes per file chunk
	streamBatch        int // rows per query of a stream
	migrateLockTimeout time.Duration

	now func() time.Time
}

// Open connects to the database at url (postgres://, postgresql://,
// sqlite://path or file:path) and checks that its schema is this binary's:
// a *SchemaError otherwise. logger may be nil.
func Open(ctx context.Context, url string, logger *slog.Logger) (*DB, error) {
	return open(ctx, url, logger, false)
}

// OpenMigrated is Open after applying the pending migrations (dev mode,
// tests, benchmarks).
func OpenMigrated(ctx context.Context, url string, logger *slog.Logger) (*DB, error) {
	return open(ctx, url, logger, true)
}

func open(ctx context.Context, url string, logger *slog.Logger, migrate bool) (*DB, error) {
	db, err := Connect(ctx, url, logger)
	if err != nil {
		return nil, err
	}
	if migrate {
		_, err = db.MigrateUp(ctx)
	}
	var have, want int64
	if err == nil {
		have, want, err = db.SchemaVersion(ctx)
	}
	if err == nil && have != want {
		err = &SchemaError{Have: have, Want: want}
	}
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// Connect connects to the database at url without looking at its schema:
// for the migration commands.
func Connect(ctx context.Context, url string, logger *slog.Logger) (*DB, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var db *DB
	var err error
	switch {
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		db, err = openPostgres(ctx, url)
	case strings.HasPrefix(url, "sqlite://"), strings.HasPrefix(url, "file:"):
		db, err = openSQLite(ctx, url)
	default:
		scheme, _, _ := strings.Cut(url, ":")
		return nil, fmt.Errorf("store: database URL scheme %q: want postgres://, postgresql://, sqlite:// or file:", scheme)
	}
	if err != nil {
		return nil, err
	}
	db.log = logger
	db.chunkSize = 1 << 20
	db.streamBatch = 500
	db.migrateLockTimeout = DefaultMigrateLockTimeout
	db.now = time.Now
	db.initGroups()
	return db, nil
}

// Dialect returns "postgres" or "sqlite".
func (db *DB) Dialect() string { return db.d.name }

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error {
	var one int
	err := failed("ping", db.rw.queryRow(ctx, "SELECT 1").Scan(&one))
	if err == nil && db.ro != db.rw {
		err = failed("ping readers", db.ro.queryRow(ctx, "SELECT 1").Scan(&one))
	}
	return err
}

// Close closes the connection pools, which releases the locks held.
func (db *DB) Close() error {
	var err error
	for _, p := range []*pgxpool.Pool{db.pool, db.locks} {
		if p != nil {
			p.Close()
		}
	}
	for _, s := range []*sql.DB{db.writer, db.readers} {
		if s != nil {
			err = errors.Join(err, s.Close())
		}
	}
	return err
}

// nowUTC is the time a call writes, at the precision both backends keep.
func (db *DB) nowUTC() time.Time { return normTime(db.now()) }

func normTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// args accumulates query arguments and hands out their $N placeholders.
type args []any

func (a *args) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// list adds vs and returns their placeholders, comma-separated.
func list[T any](a *args, vs []T) string {
	ps := make([]string, len(vs))
	for i, v := range vs {
		ps[i] = a.add(v)
	}
	return strings.Join(ps, ", ")
}

// status is a job's or a batch's status.
type status interface {
	~string
	Valid() bool
	Terminal() bool
}

// unfinished checks that ss holds known statuses that are not terminal.
func unfinished[S status](method, field string, ss []S) ([]any, error) {
	if len(ss) == 0 {
		return nil, fmt.Errorf("store: %s: %s is empty", method, field)
	}
	out := make([]any, len(ss))
	for i, s := range ss {
		if !s.Valid() || s.Terminal() {
			return nil, fmt.Errorf("store: %s: %s[%d] %q is not an unfinished status", method, field, i, s)
		}
		out[i] = string(s)
	}
	return out, nil
}

// pageQuery selects a page of up to limit rows, and one more that tells
// whether there are more.
type pageQuery struct {
	sql   string
	args  args
	limit int
}

// pageSQL ends q with the page after the id after: a tenant's list goes
// newest first, 20 rows unless asked and at most 1000; a sweep oldest
// first, 1000 rows unless asked and at most 10000.
func pageSQL(q string, a args, after string, newestFirst bool, asked int) pageQuery {
	op, order, limit, most := ` > `, ``, 1000, 10000
	if newestFirst {
		op, order, limit, most = ` < `, ` DESC`, defaultListLimit, maxListLimit
	}
	if after != "" {
		q += ` AND id` + op + a.add(after)
	}
	if asked > 0 {
		limit = min(asked, most)
	}
	return pageQuery{q + ` ORDER BY id` + order + ` LIMIT ` + a.add(limit+1), a, limit}
}

// tenantPage is a page of a tenant's list of the rows of from whose
// columns equal their values (column, value pairs; "" filters nothing).
func tenantPage(from, after string, asked int, filters ...string) pageQuery {
	var a args
	var where []string
	for i := 0; i+1 < len(filters); i += 2 {
		if filters[i+1] != "" {
			where = append(where, filters[i]+` = `+a.add(filters[i+1]))
		}
	}
	return pageSQL(from+` WHERE `+strings.Join(where, ` AND `), a, after, true, asked)
}

// page runs pq and returns its rows and whether there were more.
func page[T any](ctx context.Context, q querier, scan func(row) (*T, error), pq pageQuery) ([]*T, bool, error) {
	rows, err := collect(ctx, q, scan, pq.sql, pq.args...)
	if err != nil || len(rows) <= pq.limit {
		return rows, false, err
	}
	return rows[:pq.limit], true, nil
}

// getOne scans the one row of query, or returns ErrNotFound.
func getOne[T any](ctx context.Context, q querier, scan func(row) (*T, error), what, id, query string, a ...any) (*T, error) {
	v, err := scan(q.queryRow(ctx, query, a...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound(what, id)
	} else if err != nil {
		return nil, err
	}
	return v, nil
}

func notFound(what, id string) error { return fmt.Errorf("%w: %s %q", ErrNotFound, what, id) }

func failed(method string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("store: %s: %w", method, err)
}

func positive(method string, limit int) error {
	if limit < 1 {
		return fmt.Errorf("store: %s: limit %d, want at least 1", method, limit)
	}
	return nil
}

// required names each of fields (name, value pairs) whose value is empty.
func required(method string, fields ...string) error {
	var errs []error
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i+1] == "" {
			errs = append(errs, fmt.Errorf("store: %s: %s is empty", method, fields[i]))
		}
	}
	return errors.Join(errs...)
}
