package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openURL opens url for the test and closes it when the test ends.
func openURL(tb testing.TB, url string) *DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := Open(ctx, url, nil)
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
					db, err := Open(t.Context(), url, nil)
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
		db, err := Open(t.Context(), url, nil)
		if err == nil {
			_ = db.Close()
			t.Errorf("Open(%q) succeeded", url)
		}
	}
	// A password never appears in an error.
	_, err := Open(t.Context(), "postgres://u:hunter2@127.0.0.1:1/x?connect_timeout=1", nil)
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
	if err := postgresDialect.wrap(errors.New("plain")); errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
		t.Fatalf("a plain error was classified: %v", err)
	}
}
