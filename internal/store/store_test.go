package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openURL opens url for the test and closes it when the test ends.
func openURL(tb testing.TB, url string) *DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := OpenMigrated(ctx, url, nil)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

func postgresURL(tb testing.TB) string { return testutil.Postgres(tb) }

func sqliteURL(tb testing.TB) string {
	return "sqlite://" + filepath.Join(tb.TempDir(), "data", "llmq.db")
}

// TestPostgres runs the conformance suite on Postgres, a schema per test.
func TestPostgres(t *testing.T) {
	t.Parallel()
	runConformance(t, func(t *testing.T) *DB { return openURL(t, postgresURL(t)) })
}

// TestSQLite runs the conformance suite on SQLite, a file per test.
func TestSQLite(t *testing.T) {
	t.Parallel()
	runConformance(t, func(t *testing.T) *DB { return openURL(t, sqliteURL(t)) })
}

func TestOpenReopensAndMigratesOnce(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := openURL(t, url)
			if a.Dialect() != name {
				t.Fatalf("Dialect() = %q, want %q", a.Dialect(), name)
			}
			ten, err := a.TenantInsert(t.Context(), &TenantInsertParams{Name: "a", Tier: "standard"})
			if err != nil {
				t.Fatal(err)
			}
			// A second DB on the same database: migrations are already
			// applied, the data is shared, and locks exclude across DBs.
			b := openURL(t, url)
			if err := b.Ping(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, err := b.TenantGetByID(t.Context(), ten.ID); err != nil {
				t.Fatalf("second DB does not see the first's tenant: %v", err)
			}
			unlock, ok, err := a.TryLock(t.Context(), "reconciler")
			if err != nil || !ok {
				t.Fatalf("TryLock = %v, %v", ok, err)
			}
			if _, ok, err := b.TryLock(t.Context(), "reconciler"); err != nil || ok {
				t.Fatalf("TryLock on a second DB while held = %v, %v; want false", ok, err)
			}
			unlock()
			unlock2, ok, err := b.TryLock(t.Context(), "reconciler")
			if err != nil || !ok {
				t.Fatalf("TryLock after unlock = %v, %v", ok, err)
			}
			unlock2()
		})
	}
}

// Processes starting together migrate one at a time: every Open succeeds.
func TestOpenConcurrently(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			errs := make(chan error, 4)
			for i := 0; i < cap(errs); i++ {
				go func() {
					db, err := OpenMigrated(t.Context(), url, nil)
					if err == nil {
						err = db.Close()
					}
					errs <- err
				}()
			}
			for i := 0; i < cap(errs); i++ {
				if err := <-errs; err != nil {
					t.Errorf("concurrent Open: %v", err)
				}
			}
		})
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"mysql://localhost/x",
		"sqlite://",
		"file::memory:",
		"sqlite://:memory:",
		"postgres://127.0.0.1:5432/test?pool_max_conns=zero",
	} {
		db, err := OpenMigrated(t.Context(), url, nil)
		if err == nil {
			_ = db.Close()
			t.Errorf("Open(%q) succeeded", url)
		}
	}
	// A password never appears in an error.
	_, err := OpenMigrated(t.Context(), "postgres://u:hunter2@127.0.0.1:1/x?connect_timeout=1", nil)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("Open with a bad address: err = %v", err)
	}
}

func TestOpenSQLiteCreatesDirectoryWithFileScheme(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "a", "b", "llmq.db")
	db := openURL(t, "file:"+path)
	if db.Dialect() != "sqlite" {
		t.Fatalf("Dialect() = %q", db.Dialect())
	}
	if _, err := db.TenantInsert(t.Context(), &TenantInsertParams{Name: "a", Tier: "t"}); err != nil {
		t.Fatal(err)
	}
}

func TestErrorsAreClassified(t *testing.T) {
	t.Parallel()
	if err := postgresDialect.wrap(errors.New("plain")); errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidValue) {
		t.Fatalf("a plain error was classified: %v", err)
	}
	for code, want := range map[string]error{
		"23505": ErrConflict, "23503": ErrNotFound,
		"22021": ErrInvalidValue, "22P05": ErrInvalidValue, "22P02": ErrInvalidValue, "22001": ErrInvalidValue, "22003": ErrInvalidValue,
		"40001": nil, "53300": nil, "42P01": nil,
	} {
		err := postgresDialect.wrap(fmt.Errorf("query: %w", &pgconn.PgError{Code: code}))
		for _, kind := range []error{ErrConflict, ErrNotFound, ErrInvalidValue} {
			if errors.Is(err, kind) != (kind == want) {
				t.Errorf("SQLSTATE %s: errors.Is(%v, %v) = %v", code, err, kind, !(kind == want))
			}
		}
	}
}

// What Postgres refuses in a value (a NUL or invalid UTF-8 in text, a lone
// surrogate in jsonb) is ErrInvalidValue, from the writing methods and from
// Classify over a read's error, so that callers tell it from a failure.
func TestRefusedValuesAreInvalidValue(t *testing.T) {
	t.Parallel()
	db := openURL(t, postgresURL(t))
	ctx := t.Context()
	for _, name := range []string{"a\x00b", "a\xffb"} {
		_, err := db.TenantInsert(ctx, &TenantInsertParams{Name: name, Tier: "standard"})
		if !errors.Is(err, ErrInvalidValue) {
			t.Errorf("TenantInsert(name %q): err = %v, want ErrInvalidValue", name, err)
		}
	}
	ten, err := db.TenantInsert(ctx, &TenantInsertParams{Name: "a", Tier: "standard"})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = db.JobInsert(ctx, &JobInsertParams{TenantID: ten.ID, Endpoint: "/v1/chat/completions", Model: "m",
		Queue: "default", Request: json.RawMessage(`{"messages":[{"content":"\ud800"}]}`)})
	if !errors.Is(err, ErrInvalidValue) {
		t.Errorf("JobInsert with a lone surrogate: err = %v, want ErrInvalidValue", err)
	}
	_, err = db.JobGetForTenant(ctx, ten.ID, "job_\x00")
	if err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("JobGetForTenant(NUL id): err = %v, want the driver's refusal", err)
	}
	if err := db.Classify(err); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("Classify(%v) is not ErrInvalidValue", err)
	}
	if jobs, _, err := db.JobList(ctx, &JobListParams{TenantID: ten.ID}); err != nil || len(jobs) != 0 {
		t.Fatalf("jobs stored: %d (%v)", len(jobs), err)
	}
	if err := db.Classify(nil); err != nil {
		t.Fatalf("Classify(nil) = %v", err)
	}
}

// Locks never take the connections the work under them needs: with a pool
// of two, three locks are held and a query under them still runs.
func TestLocksDoNotStarveThePool(t *testing.T) {
	t.Parallel()
	db := openURL(t, postgresURL(t)+"&pool_max_conns=2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"reconciler", "batch-sweeper", "batch_1"} {
		unlock, ok, err := db.TryLock(ctx, name)
		if err != nil || !ok {
			t.Fatalf("TryLock %s = %v, %v", name, ok, err)
		}
		defer unlock()
	}
	if _, _, err := db.TenantList(ctx, &TenantListParams{Limit: 10}); err != nil {
		t.Fatalf("a query under three locks with a pool of two: %v", err)
	}
}
