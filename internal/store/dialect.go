package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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

// dialect is what differs between the databases; the SQL itself is shared.
type dialect struct {
	name       string
	goose      goose.Dialect
	migrations fs.FS

	// sqliteTimes: timestamps are TEXT in tsLayout (fixed width, so text
	// order is time order).
	sqliteTimes bool
	// groupWrites: the writes every job makes go in pgx batches (groups.go)
	// and JobComplete is one data-modifying WITH, which SQLite lacks.
	groupWrites bool
	// spoolUploads: FileInsert spools an upload to a temp file first, so
	// SQLite's one writer never waits on a slow client.
	spoolUploads bool
	// skipLocked makes a purge's subquery skip rows others hold.
	skipLocked string

	tx         func(ctx context.Context, db *DB, fn func(querier) error) error
	insertJobs func(ctx context.Context, db *DB, rows [][]any) error
	tryLock    func(ctx context.Context, db *DB, name string) (unlock func(), ok bool, err error)
	// gooseDB is the handle goose migrates through, and what releases it.
	gooseDB func(db *DB) (*sql.DB, func() error)
	// errKind is a driver error's ErrConflict, ErrNotFound (a foreign key
	// naming a missing row), ErrInvalidValue or nil.
	errKind func(err error) error
	// tableExists asks whether the table named $1 exists where llmq's are.
	tableExists string
	// unavailable reports a driver error that is ErrUnavailable.
	unavailable func(err error) bool
}

// isLockTimeout reports a Postgres statement that gave up waiting for a
// lock (lock_timeout); SQLite's writers give up on their busy timeout.
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03" // lock_not_available
}

// tsLayout is how SQLite stores times: UTC, microseconds, fixed width.
const tsLayout = "2006-01-02T15:04:05.000000Z"

func (d *dialect) ts(t time.Time) any {
	t = normTime(t)
	if d.sqliteTimes {
		return t.Format(tsLayout)
	}
	return t
}

// tsOrNull is ts, or NULL for a nil or zero time.
func (d *dialect) tsOrNull(t *time.Time) any {
	if t == nil || t.IsZero() {
		return nil
	}
	return d.ts(*t)
}

// wrap gives err the sentinel of its kind, keeping the driver's message
// (which names the constraint).
func (d *dialect) wrap(err error) error {
	if kind := d.errKind(err); kind != nil && !errors.Is(err, kind) {
		return fmt.Errorf("%w: %w", kind, err)
	}
	return err
}

func (d *dialect) outage(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !d.unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// connectionLost reports a driver call whose connection failed under it or
// got no answer in time; a caller that left (context.Canceled) is not one.
func connectionLost(err error) bool {
	var ne net.Error
	return !errors.Is(err, context.Canceled) && (errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.As(err, &ne))
}

// Classify gives err the sentinel of its kind (ErrConflict, ErrNotFound,
// ErrInvalidValue), as the writing methods do.
func (db *DB) Classify(err error) error { return db.d.wrap(err) }

// IsPermanent reports whether err, from a store method, is about the data
// itself (ErrConflict, ErrNotFound, ErrInvalidValue): trying again fails again.
func (db *DB) IsPermanent(err error) bool {
	err = db.Classify(err)
	return errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidValue)
}

var postgresDialect = &dialect{
	name:        "postgres",
	goose:       goose.DialectPostgres,
	migrations:  migrations.Postgres(),
	groupWrites: true,
	skipLocked:  " FOR UPDATE SKIP LOCKED",
	tx:          pgxTx,
	insertJobs:  copyJobs,
	tryLock:     pgTryLock,
	gooseDB: func(db *DB) (*sql.DB, func() error) {
		// A pool of its own, whose sessions give up on a lock (lock_timeout)
		// instead of waiting while every query of the table queues behind them.
		cfg := db.pool.Config().Copy()
		cfg.MaxConns = 2
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(db.migrateLockTimeout.Milliseconds(), 10)
		// An index built CONCURRENTLY on a large table takes as long as it takes.
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "0"
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			// NewWithConfig only fails on a bad config, which this is not.
			panic("store: migration pool: " + err.Error())
		}
		s := stdlib.OpenDBFromPool(pool)
		return s, func() error { err := s.Close(); pool.Close(); return err }
	},
	tableExists: `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)`,
	unavailable: func(err error) bool {
		if errors.Is(err, context.Canceled) {
			return false
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			// The refusals that end by themselves: class 08, connection
			// exception; 57P01-57P03, a shutdown, a crash, a server
			// starting; 53300, too many connections.
			return slices.Contains([]string{"57P01", "57P02", "57P03", "53300"}, pe.Code) || strings.HasPrefix(pe.Code, "08")
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
			// Class 22, data exception; 23, the other integrity
			// constraints; 54, a program limit exceeded.
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
	tableExists:  `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1)`,
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

// openPostgres opens a pool on dsn, and one for advisory locks.
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
	// Bound statements and idle transactions, so nothing holds its locks
	// for ever, unless the URL says otherwise.
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
	// Advisory locks hold their connection until released: a pool of their
	// own keeps the work under a lock from waiting for one the locks hold.
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

// maxLockConns bounds the connections advisory locks hold; a TryLock past
// it waits for one.
const maxLockConns = 16

// openSQLite opens one writer connection and a pool of read-only ones on
// raw's file. Writes take the lock at BEGIN (IMMEDIATE), so a transaction
// never fails upgrading a read lock.
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
	db := &DB{d: sqliteDialect, lockScope: abs}
	fail := func(err error) (*DB, error) {
		_ = db.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	if db.writer, err = sql.Open("sqlite", dsn(false)); err != nil {
		return fail(err)
	}
	db.writer.SetMaxOpenConns(1) // and the defaults never close it while idle
	// The writer creates the file and switches it to WAL before any reader opens it.
	if err := pingWriter(ctx, db.writer); err != nil {
		return fail(err)
	}
	if db.readers, err = sql.Open("sqlite", dsn(true)); err != nil {
		return fail(err)
	}
	readers := max(4, runtime.GOMAXPROCS(0))
	db.readers.SetMaxOpenConns(readers)
	db.readers.SetMaxIdleConns(readers)
	if err := db.readers.PingContext(ctx); err != nil {
		return fail(err)
	}
	db.rw, db.ro = sqlQuerier{db.writer}, sqlQuerier{db.readers}
	return db, nil
}

// sqliteBusyTimeout is how long a SQLite connection waits for another's lock.
const sqliteBusyTimeout = 10 * time.Second

// pingWriter connects the writer. Of two processes switching a new file to
// WAL at once, SQLite answers one SQLITE_BUSY without waiting out the busy
// timeout: that one tries again, for as long.
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
