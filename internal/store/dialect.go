package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/llmq/llmq/migrations"
)

// dialect is what differs between the databases; the SQL itself is shared:
// both accept $N placeholders, RETURNING, ON CONFLICT with partial-index
// targets and CAST(... AS BIGINT).
type dialect struct {
	name       string
	goose      goose.Dialect
	migrations fs.FS

	// sqliteTimes: timestamps are TEXT in tsLayout on SQLite (fixed width,
	// so text order is time order); Postgres takes time.Time for timestamptz.
	sqliteTimes bool

	// groupWrites: the writes every job makes go in pgx batches
	// (groups.go), and JobComplete is one statement, a data-modifying WITH.
	// SQLite has one writer and no such WITH: each call runs alone, and
	// JobComplete in a transaction.
	groupWrites bool

	// spoolUploads: FileInsert first copies a reader that is not already
	// local (an io.ReaderAt, such as a multipart temp file) to a temp file,
	// so SQLite's one writer is never held for the duration of a slow upload.
	spoolUploads bool

	// tx runs fn in a transaction of the writer.
	tx func(ctx context.Context, db *DB, fn func(querier) error) error

	// insertJobs writes JobInsertMany's rows: COPY on Postgres, multi-row
	// INSERTs in one transaction on SQLite.
	insertJobs func(ctx context.Context, db *DB, rows [][]any) error

	// tryLock takes the named lock if free: a session advisory lock on
	// Postgres, an in-process lock per database file on SQLite.
	tryLock func(ctx context.Context, db *DB, name string) (unlock func(), ok bool, err error)

	// gooseDB is the database/sql handle goose migrates through, and what
	// releases it: on Postgres one over the pool for the migration alone,
	// since goose takes nothing else.
	gooseDB func(db *DB) (*sql.DB, func() error)

	// errKind classifies a driver error as ErrConflict, ErrNotFound (a
	// foreign key naming a missing row), ErrInvalidValue (a value the
	// database cannot hold) or nil.
	errKind func(err error) error

	// isLockTimeout reports an error of a statement that gave up waiting
	// for a lock (Postgres's lock_timeout).
	isLockTimeout func(err error) bool

	// tableExists is a query of whether the table named $1 exists where
	// llmq's tables are (Postgres's current schema).
	tableExists string

	// unavailable reports a driver error that means the database cannot
	// serve now (ErrUnavailable).
	unavailable func(err error) bool
}

// tsLayout is how SQLite stores times: UTC, microseconds, fixed width.
const tsLayout = "2006-01-02T15:04:05.000000Z"

// ts encodes t for a timestamp column.
func (d *dialect) ts(t time.Time) any {
	t = normTime(t)
	if d.sqliteTimes {
		return t.Format(tsLayout)
	}
	return t
}

// tsOrNull encodes t, or NULL for a nil or zero time.
func (d *dialect) tsOrNull(t *time.Time) any {
	if t == nil || t.IsZero() {
		return nil
	}
	return d.ts(*t)
}

// wrap classifies err: constraint violations gain ErrConflict or ErrNotFound
// (keeping the driver's message, which names the constraint), refused values
// ErrInvalidValue.
func (d *dialect) wrap(err error) error {
	if err == nil {
		return nil
	}
	if kind := d.errKind(err); kind != nil && !errors.Is(err, kind) {
		return fmt.Errorf("%w: %w", kind, err)
	}
	return err
}

// outage wraps err in ErrUnavailable when it says the database cannot
// serve now. Every driver call's error goes through it (querier.go).
func (d *dialect) outage(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !d.unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// connectionLost reports an error of a driver call whose connection failed
// under it: refused, reset or closed (EOF), or no answer in time (the
// caller's deadline, a pool that had no connection to give). A caller that
// left (context.Canceled) is not an outage. Only errors from a driver call
// are asked: Redis's look the same.
func connectionLost(err error) bool {
	var ne net.Error
	return !errors.Is(err, context.Canceled) && (errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.As(err, &ne))
}

// Classify gives err the sentinel of its kind (ErrConflict, ErrNotFound,
// ErrInvalidValue), as the writing methods do. Reads return the driver's
// error as it is; a caller that answers every error, such as the HTTP API,
// classifies them once, so a value it forgot to check is the caller's
// mistake and not a failure of the database.
func (db *DB) Classify(err error) error { return db.d.wrap(err) }

// IsPermanent reports whether err, from a store method, is about the data
// itself (ErrConflict, ErrNotFound, ErrInvalidValue): trying again fails
// again. A lost connection, a timeout or a busy database is not.
func (db *DB) IsPermanent(err error) bool {
	err = db.Classify(err)
	return errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidValue)
}

// Reason is the database's own words for err — its message and code —
// without llmq's wrapping, or err's text when no database error is in it.
func Reason(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Error()
	}
	return err.Error()
}

var postgresDialect = &dialect{
	name:        "postgres",
	goose:       goose.DialectPostgres,
	migrations:  migrations.Postgres(),
	groupWrites: true,
	tx:          pgxTx,
	insertJobs:  copyJobs,
	tryLock:     pgTryLock,
	gooseDB: func(db *DB) (*sql.DB, func() error) {
		// A pool of its own, whose sessions give up on a lock they wait
		// for (lock_timeout) instead of waiting behind a long transaction
		// while every query of the table queues behind them.
		cfg := db.pool.Config().Copy()
		cfg.MaxConns = 2
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(db.migrateLockTimeout.Milliseconds(), 10)
		// An index built CONCURRENTLY on a large table takes as long as it takes.
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "0"
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			// NewWithConfig only fails on a bad config, which this one was not.
			panic("store: migration pool: " + err.Error())
		}
		s := stdlib.OpenDBFromPool(pool)
		return s, func() error { err := s.Close(); pool.Close(); return err }
	},
	isLockTimeout: func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "55P03" // lock_not_available
	},
	tableExists: `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)`,
	unavailable: func(err error) bool {
		if errors.Is(err, context.Canceled) {
			return false
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			// The server's own refusals that end by themselves: class 08,
			// connection exception; 57P01-57P03, an administrator's
			// shutdown (or pg_terminate_backend), a crash, a server still
			// starting; 53300, too many connections. Any other (a wrong
			// password, a missing database) is not for a retry to mend.
			switch pe.Code {
			case "57P01", "57P02", "57P03", "53300":
				return true
			}
			return strings.HasPrefix(pe.Code, "08")
		}
		var ce *pgconn.ConnectError
		return errors.As(err, &ce) || errors.Is(err, pgconn.ErrConnClosed) || pgconn.Timeout(err) || connectionLost(err)
	},
	errKind: func(err error) error {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			switch pe.Code {
			case "23505": // unique_violation
				return ErrConflict
			case "23503": // foreign_key_violation
				return ErrNotFound
			}
			// Class 22, data exception: invalid byte sequence (22021), NUL
			// or a lone surrogate in jsonb (22P05, 22P02), a value too
			// long or out of range; class 23, the other integrity
			// constraints (not null, check); class 54, a program limit
			// exceeded (a row or an array too large).
			switch pe.Code[:min(2, len(pe.Code))] {
			case "22", "23", "54":
				return ErrInvalidValue
			}
		}
		return nil
	},
}

var sqliteDialect = &dialect{
	name:         "sqlite",
	goose:        goose.DialectSQLite3,
	migrations:   migrations.SQLite(),
	sqliteTimes:  true,
	spoolUploads: true,
	tx:           sqlTx,
	insertJobs:   multiRowInsertJobs,
	tryLock:      processTryLock,
	gooseDB:      func(db *DB) (*sql.DB, func() error) { return db.writer, func() error { return nil } },
	// SQLite's writers wait on its busy timeout, and give up there.
	isLockTimeout: func(error) bool { return false },
	tableExists:   `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1)`,
	// The database stayed locked by another connection (another process on
	// the file) past the busy timeout, or the writer stayed taken past the
	// caller's deadline.
	unavailable: func(err error) bool {
		var se *sqlite.Error
		if errors.As(err, &se) {
			code := se.Code() & 0xff
			return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
		}
		return connectionLost(err)
	},
	errKind: func(err error) error {
		var se *sqlite.Error
		if errors.As(err, &se) {
			switch se.Code() {
			case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
				return ErrConflict
			case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
				return ErrNotFound
			case sqlite3.SQLITE_TOOBIG: // a string or blob over SQLite's limit; its TEXT takes any bytes, NUL included
				return ErrInvalidValue
			}
			switch se.Code() & 0xff {
			case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE: // not null, check; a wrong type
				return ErrInvalidValue
			}
		}
		return nil
	},
}

// openPostgres opens a pool on dsn, and one for advisory locks. Every
// parameter goes to pgxpool, search_path and pool_max_conns (default 16)
// included.
func openPostgres(ctx context.Context, dsn string) (*DB, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, errors.New("store: database URL does not parse as a URL")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("store: database URL: %w", err)
	}
	if !u.Query().Has("pool_max_conns") {
		cfg.MaxConns = 16
	}
	// No statement of llmq's runs for minutes, and none holds a transaction
	// open while it waits: bound both, so a runaway query or a stuck
	// session cannot hold its locks (and the rows every job touches) for
	// ever. The URL's own values win (…&statement_timeout=30000).
	for param, ms := range map[string]string{"statement_timeout": "60000", "idle_in_transaction_session_timeout": "60000"} {
		if _, set := cfg.ConnConfig.RuntimeParams[param]; !set {
			cfg.ConnConfig.RuntimeParams[param] = ms
		}
	}
	cfg.MaxConnIdleTime = 5 * time.Minute
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: postgres %s: %w", u.Redacted(), err)
	}
	var schema *string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect to postgres %s: %w", u.Redacted(), err)
	}
	if schema == nil {
		pool.Close()
		return nil, fmt.Errorf("store: postgres %s: no schema of the search_path exists", u.Redacted())
	}
	// Advisory locks hold their session's connection until released: they
	// get a pool of their own, so the work done under a lock (the
	// reconciler's, the sweeper's, a batch's validation) never waits for a
	// connection the locks themselves hold, however small pool_max_conns.
	lcfg := cfg.Copy()
	lcfg.MaxConns = maxLockConns
	lcfg.MaxConnIdleTime = time.Minute
	locks, err := pgxpool.NewWithConfig(ctx, lcfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: postgres %s: %w", u.Redacted(), err)
	}
	q := pgxQuerier{pool}
	return &DB{rw: q, ro: q, pool: pool, locks: locks, d: postgresDialect, lockScope: *schema}, nil
}

// maxLockConns bounds the connections advisory locks hold at once; a
// TryLock past it waits for one to be released (or its context to end).
const maxLockConns = 16

// openSQLite opens the file named by raw (sqlite://path or file:path): one
// writer connection and a pool of read-only connections, all in WAL mode with
// a busy timeout and foreign keys on. Writes take the lock at BEGIN
// (IMMEDIATE), so a transaction never fails upgrading a read lock.
func openSQLite(ctx context.Context, raw string) (*DB, error) {
	rest, ok := strings.CutPrefix(raw, "sqlite://")
	if !ok {
		rest = strings.TrimPrefix(raw, "file:")
	}
	path, query, _ := strings.Cut(rest, "?")
	if path == "" || strings.HasPrefix(path, ":memory:") || strings.Contains(query, "mode=memory") {
		return nil, fmt.Errorf("store: database URL %q: SQLite needs a file path (in-memory databases are not shared between connections)", raw)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: database URL %q: %w", raw, err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o750); err != nil {
		return nil, fmt.Errorf("store: create directory of %s: %w", abs, err)
	}
	extra, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("store: database URL %q: query: %w", raw, err)
	}
	dsn := func(readOnly bool) string {
		v := url.Values{}
		v.Set("_busy_timeout", fmt.Sprint(sqliteBusyTimeout.Milliseconds()))
		v.Set("_foreign_keys", "1")
		// FULL: a job acknowledged to a client survives a power cut too.
		v.Set("_synchronous", "FULL")
		if readOnly {
			v.Set("_query_only", "1")
		} else {
			v.Set("_journal_mode", "WAL")
			v.Set("_txlock", "immediate")
		}
		for k, vs := range extra {
			v[k] = vs
		}
		return abs + "?" + v.Encode()
	}
	w, err := sql.Open("sqlite", dsn(false))
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxIdleTime(0)
	w.SetConnMaxLifetime(0)
	// The writer connects first: it creates the file and switches it to WAL
	// before any reader opens it.
	if err := pingWriter(ctx, w); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	r, err := sql.Open("sqlite", dsn(true))
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	readers := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)
	if err := r.PingContext(ctx); err != nil {
		_ = w.Close()
		_ = r.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	return &DB{rw: sqlQuerier{w}, ro: sqlQuerier{r}, writer: w, readers: r, d: sqliteDialect, lockScope: abs}, nil
}

// sqliteBusyTimeout is how long a SQLite connection waits for another's lock.
const sqliteBusyTimeout = 10 * time.Second

// pingWriter connects the writer. Two processes creating one file switch it
// to WAL at the same time, and SQLite answers one of them SQLITE_BUSY at
// once, without waiting out the busy timeout (each holds the lock the
// other needs): that one tries again, for as long as the busy timeout.
func pingWriter(ctx context.Context, w *sql.DB) error {
	deadline := time.Now().Add(sqliteBusyTimeout)
	for {
		err := w.PingContext(ctx)
		var se *sqlite.Error
		if err == nil || !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// lockKey is the 64-bit advisory lock key of name within scope.
func lockKey(scope, name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return int64(h.Sum64())
}
