// Package store owns llmq's durable state: tenants, API keys, jobs, batches,
// files and the usage ledger, on PostgreSQL (the system of record in
// production) or SQLite (the embedded default). Each runs on its own driver:
// Postgres on pgx's pool, natively, SQLite on database/sql with
// modernc.org/sqlite, pure Go. Both run the same SQL through one querier
// (querier.go) and read each row type with one scan function. A dialect
// value (dialect.go) holds what really differs: time encoding, bulk insert,
// locks, transactions and error codes. asynq tasks carry only a job id, so
// everything needed to run, recover or report a job is here, and the schema
// is migrated on Open from the embedded migrations package.
//
// Conventions: methods are named NounVerb and take a *NounVerbParams when they
// take more than identifiers. A missing row is ErrNotFound (another tenant's
// row too, so existence never leaks), a unique key already taken is
// ErrConflict. All times are UTC with microsecond precision. Lists shown to
// tenants are newest first, as OpenAI's: ids are time-ordered, a page is the
// rows with id < After in descending id order, and hasMore tells whether an
// older page exists. Sweeps (JobListUnfinished, BatchListActive) go oldest
// first with id > After.
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
	// ErrUnavailable: the database cannot serve now (it does not answer,
	// the connection broke, it is shutting down or starting, it has no
	// connection free, SQLite's lock stayed busy): not about the call;
	// trying again once it is back succeeds. Every call's driver error is
	// classified where it leaves the driver (querier.go), so a caller that
	// also talks to Redis never mistakes one for the other.
	ErrUnavailable = errors.New("store: database unavailable")
)

// Default and largest page sizes of the list methods.
const (
	defaultListLimit = 20
	maxListLimit     = 1000
)

// DB is llmq's database. It is safe for concurrent use.
type DB struct {
	// rw takes every write and ro the reads. On Postgres both are the
	// pool. On SQLite rw is a single connection, so writers queue in Go
	// instead of failing with SQLITE_BUSY, and ro a pool of read-only
	// connections, which WAL lets read while the writer writes.
	rw, ro querier
	// pool is Postgres's, the one rw and ro run on; grouped writes and
	// COPY use it directly. locks is a pool of its own for the connections
	// advisory locks hold (lock.go). Both are nil on SQLite.
	pool, locks *pgxpool.Pool
	// writer and readers are SQLite's rw and ro; nil on Postgres.
	writer, readers *sql.DB
	d               *dialect
	log             *slog.Logger
	// groups groups the writes every job makes (groups.go).
	groups groups

	// lockScope keeps TryLock names of different databases apart: the
	// Postgres schema (advisory locks are per database, tests use a schema
	// each) or the SQLite file's absolute path.
	lockScope string

	// Tunables; tests shrink them to exercise paging with few rows.
	chunkSize   int // bytes per file chunk
	streamBatch int // jobs per query of JobStreamByBatch
	// migrateLockTimeout bounds a migration's wait for a lock.
	migrateLockTimeout time.Duration

	now func() time.Time
}

// Open connects to the database at url and returns the DB, once it has
// checked that the schema is the one this binary was built for: a
// *SchemaError otherwise (migrations pending: run `dispatcher migrate up`;
// or a newer schema than this binary knows). The scheme picks the backend:
// postgres:// or postgresql:// for PostgreSQL (a search_path parameter is
// honoured; pool_max_conns sets the pool size, default 16); sqlite://path
// or file:path for SQLite (the file and its directory are created; extra
// query parameters go to the driver, e.g. _synchronous=NORMAL). logger may
// be nil.
func Open(ctx context.Context, url string, logger *slog.Logger) (*DB, error) {
	db, err := Connect(ctx, url, logger)
	if err != nil {
		return nil, err
	}
	if err := db.checkSchema(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// OpenMigrated is Open after applying the pending migrations: for dev
// mode, tests and benchmarks, which start on a database of their own.
// Deployments migrate with `dispatcher migrate up`.
func OpenMigrated(ctx context.Context, url string, logger *slog.Logger) (*DB, error) {
	db, err := Connect(ctx, url, logger)
	if err != nil {
		return nil, err
	}
	if _, err := db.MigrateUp(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := db.checkSchema(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// Connect connects to the database at url without looking at its schema:
// for the migration commands (MigrateUp, MigrateDown, MigrationStatus).
func Connect(ctx context.Context, url string, logger *slog.Logger) (*DB, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var (
		db  *DB
		err error
	)
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
	db.now = func() time.Time { return time.Now() }
	db.initGroups()
	return db, nil
}

// Dialect returns "postgres" or "sqlite".
func (db *DB) Dialect() string { return db.d.name }

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error {
	var one int
	if err := db.rw.queryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	if db.ro != db.rw {
		if err := db.ro.queryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			return fmt.Errorf("store: ping readers: %w", err)
		}
	}
	return nil
}

// Close closes the connection pools. Locks taken with TryLock and not yet
// released are released by the database when their connection closes.
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

// nowUTC is the time written by a call: UTC, at the microsecond precision both
// backends keep, so what a method returns equals what a later read returns.
func (db *DB) nowUTC() time.Time { return db.now().UTC().Truncate(time.Microsecond) }

// normTime brings a caller's time to the stored precision and zone.
func normTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// args accumulates query arguments and hands out their placeholders, so
// queries with optional filters are built from fixed SQL fragments and values
// never enter the SQL text. Both backends accept $N placeholders.
type args []any

func (a *args) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// list returns "$i, $j, ..." for vs.
func (a *args) list(vs ...any) string {
	var b strings.Builder
	for i, v := range vs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(a.add(v))
	}
	return b.String()
}

// pageLimit applies the default and the ceiling of a list's page size.
func pageLimit(limit, def, max int) int {
	switch {
	case limit <= 0:
		return def
	case limit > max:
		return max
	}
	return limit
}

// trimPage cuts a page fetched with limit+1 rows to limit and reports whether
// there was more.
func trimPage[T any](rows []*T, limit int) ([]*T, bool) {
	if len(rows) > limit {
		return rows[:limit], true
	}
	return rows, false
}

// notFound wraps ErrNotFound with what was missing.
func notFound(what, id string) error { return fmt.Errorf("%w: %s %q", ErrNotFound, what, id) }

func required(method, field, v string) error {
	if v == "" {
		return fmt.Errorf("store: %s: %s is empty", method, field)
	}
	return nil
}
