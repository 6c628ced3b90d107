package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	neturl "net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/testutil"
)

// wantUnavailable fails the test unless err is ErrUnavailable.
func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("%s: %v, want ErrUnavailable", what, err)
	}
}

// A database that cannot serve, in each way a running llmq meets one, is
// ErrUnavailable on every kind of call (a read, a list, a grouped write, a
// transaction, a ping), and the same DB serves again by itself once the
// database is back: Postgres unreachable (its connections cut, then every
// dial refused), Postgres ending the session (pg_terminate_backend, as at
// a shutdown), no connection of the pool free in time, and SQLite's lock
// held by another process past the busy timeout.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	t.Run("postgres unreachable", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		u, err := neturl.Parse(postgresURL(t))
		if err != nil {
			t.Fatal(err)
		}
		proxy := testutil.StartTCPProxy(t, u.Host)
		u.Host = proxy.Addr
		db := openURL(t, u.String()+"&pool_max_conns=2")
		ten := mkTenant(t, db)
		proxy.Cut()
		// The first calls meet the cut connections (an EOF), the later
		// ones a refused dial.
		for range 3 {
			_, err := db.TenantGetByID(ctx, ten.ID)
			wantUnavailable(t, "TenantGetByID", err)
			_, _, err = db.JobList(ctx, &JobListParams{TenantID: ten.ID})
			wantUnavailable(t, "JobList", err)
			_, _, err = db.JobInsert(ctx, jobParams(ten.ID))
			wantUnavailable(t, "JobInsert", err)
			_, err = db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatch, Filename: "in.jsonl",
				Content: bytes.NewReader([]byte("{}\n"))})
			wantUnavailable(t, "FileInsert", err)
			wantUnavailable(t, "Ping", db.Ping(ctx))
		}
		proxy.Restore()
		testutil.Eventually(t, 10*time.Second, func() bool { return db.Ping(ctx) == nil })
		if _, err := db.TenantGetByID(ctx, ten.ID); err != nil {
			t.Fatalf("once back: %v", err)
		}
	})
	t.Run("postgres ends the session", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := postgresURL(t)
		db := openURL(t, url+"&pool_max_conns=1")
		ten := mkTenant(t, db)
		var pid int
		if err := db.rw.queryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		admin, err := pgx.Connect(ctx, testutil.PlainDSN(url))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		var ended bool
		if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ended); err != nil || !ended {
			t.Fatalf("pg_terminate_backend: %v %v", ended, err)
		}
		_, err = db.TenantGetByID(ctx, ten.ID)
		wantUnavailable(t, "TenantGetByID on a terminated session", err)
		if _, err := db.TenantGetByID(ctx, ten.ID); err != nil {
			t.Fatalf("the next call, on a new session: %v", err)
		}
	})
	t.Run("no connection free in time", func(t *testing.T) {
		t.Parallel()
		db := openURL(t, postgresURL(t)+"&pool_max_conns=1")
		ten := mkTenant(t, db)
		tx, err := db.pool.Begin(t.Context()) // the pool's only connection
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err = db.TenantGetByID(ctx, ten.ID)
		wantUnavailable(t, "TenantGetByID with the pool taken", err)
		_ = tx.Rollback(t.Context())
		if _, err := db.TenantGetByID(t.Context(), ten.ID); err != nil {
			t.Fatalf("once the connection is free: %v", err)
		}
	})
	t.Run("sqlite locked", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := sqliteURL(t)
		db := openURL(t, url+"?_busy_timeout=50")
		ten := mkTenant(t, db)
		// Another process's write transaction holds the file's write lock.
		other, err := sql.Open("sqlite", strings.TrimPrefix(url, "sqlite://")+"?_busy_timeout=50")
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		tx, err := other.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tenants SET name = name`); err != nil {
			t.Fatal(err)
		}
		_, _, err = db.JobInsert(ctx, jobParams(ten.ID))
		wantUnavailable(t, "JobInsert while another holds the lock", err)
		_, err = db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatch, Filename: "in.jsonl",
			Content: bytes.NewReader([]byte("{}\n"))})
		wantUnavailable(t, "FileInsert while another holds the lock", err)
		if _, err := db.TenantGetByID(ctx, ten.ID); err != nil {
			t.Fatalf("a read beside the lock (WAL): %v", err)
		}
		_ = tx.Rollback()
		if _, _, err := db.JobInsert(ctx, jobParams(ten.ID)); err != nil {
			t.Fatalf("once the lock is released: %v", err)
		}
	})
}

// What is about the call, not the database, is not ErrUnavailable: a
// missing row, a taken key, a statement the server refuses, a caller that
// left, and an upload that failed to read.
func TestNotUnavailable(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openURL(t, url)
			ten := mkTenant(t, db)
			j := mkJob(t, db, jobParams(ten.ID))
			taken := jobParams(ten.ID)
			taken.ID = j.ID
			_, _, conflict := db.JobInsert(ctx, taken)
			_, missing := db.TenantGetByID(ctx, "ten_missing")
			_, refused := db.rw.exec(ctx, `SELEC 1`)
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			_, left := db.TenantGetByID(cancelled, ten.ID)
			_, upload := db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatch, Filename: "in.jsonl",
				Content: io.MultiReader(bytes.NewReader([]byte("{}\n")), resetReader{})})
			for what, err := range map[string]error{"a taken id": conflict, "a missing row": missing, "a refused statement": refused,
				"a caller that left": left, "an upload that failed to read": upload} {
				if err == nil || errors.Is(err, ErrUnavailable) {
					t.Errorf("%s: %v, want an error other than ErrUnavailable", what, err)
				}
			}
		})
	}
}

// resetReader fails as the body of a client whose connection was reset
// mid-upload does: with the error a broken database connection gives too.
type resetReader struct{}

func (resetReader) Read([]byte) (int, error) {
	return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
}
