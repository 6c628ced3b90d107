package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A binary refuses a schema that is not its own: older (it says to run
// `dispatcher migrate up`) or newer (a later version migrated it). Up,
// down and status go through goose's Up and Down sections.
func TestSchemaVersionIsChecked(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := postgresURL(t)
	_, err := Open(ctx, url, nil)
	var se *SchemaError
	if !errors.As(err, &se) || se.Have != 0 || !strings.Contains(err.Error(), "run `dispatcher migrate up` first") {
		t.Fatalf("Open of an empty schema = %v, want a SchemaError telling to migrate", err)
	}
	db := openURL(t, url)
	have, want, err := db.SchemaVersion(ctx)
	if err != nil || have != want || want < 12 {
		t.Fatalf("SchemaVersion = %d, %d, %v", have, want, err)
	}
	if db2, err := Open(ctx, url, nil); err != nil {
		t.Fatalf("Open of a migrated schema: %v", err)
	} else {
		_ = db2.Close()
	}

	// down, status, up
	v, err := db.MigrateDown(ctx)
	if err != nil || v != want {
		t.Fatalf("MigrateDown = %d, %v; want %d", v, err, want)
	}
	sts, err := db.MigrationStatus(ctx)
	if err != nil || len(sts) != int(want) || sts[len(sts)-1].Applied || !sts[0].Applied || !strings.HasSuffix(sts[0].Name, ".sql") {
		t.Fatalf("MigrationStatus after down = %+v, %v", sts, err)
	}
	if _, err := Open(ctx, url, nil); !errors.As(err, &se) || se.Have != want-1 {
		t.Fatalf("Open one version behind = %v", err)
	}
	if applied, err := db.MigrateUp(ctx); err != nil || len(applied) != 1 || applied[0] != want {
		t.Fatalf("MigrateUp = %v, %v; want [%d]", applied, err, want)
	}

	// A later version's migration, as the older binary sees it.
	if _, err := db.pool.Exec(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)", want+1); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, url, nil)
	if !errors.As(err, &se) || se.Have != want+1 || se.Want != want || !strings.Contains(err.Error(), "newer than this binary knows") {
		t.Fatalf("Open of a newer schema = %v", err)
	}
}

// Checking the schema only reads: Open and MigrationStatus on a database
// never migrated say so (the error telling to migrate; every migration
// pending) and leave it without a table, goose's version table included.
func TestSchemaCheckWritesNothing(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			_, err := Open(ctx, url, nil)
			var se *SchemaError
			if !errors.As(err, &se) || se.Have != 0 || !strings.Contains(err.Error(), "run `dispatcher migrate up` first") {
				t.Fatalf("Open of an empty database = %v, want a SchemaError telling to migrate", err)
			}
			db, err := Connect(ctx, url, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			sts, err := db.MigrationStatus(ctx)
			if err != nil || len(sts) < 12 || sts[0].Version != 1 || sts[0].Name == "" {
				t.Fatalf("MigrationStatus of an empty database = %+v, %v", sts, err)
			}
			for _, st := range sts {
				if st.Applied || !st.AppliedAt.IsZero() {
					t.Fatalf("MigrationStatus of an empty database: %+v applied", st)
				}
			}
			tables := `SELECT name FROM sqlite_master WHERE type = 'table'`
			if db.Dialect() == "postgres" {
				tables = `SELECT tablename FROM pg_tables WHERE schemaname = current_schema()`
			}
			var names []string
			if err := db.ro.query(ctx, tables, nil, func(r row) error {
				var n string
				names = append(names, n)
				return r.Scan(&names[len(names)-1])
			}); err != nil {
				t.Fatal(err)
			}
			if len(names) != 0 {
				t.Fatalf("checking the schema created tables %v", names)
			}
		})
	}
}

// A migration that meets a lock gives up after the lock timeout with an
// error saying so, instead of hanging (and queueing every query of the
// table behind its own wait), and applies nothing.
func TestMigrationGivesUpOnAHeldLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := postgresURL(t)
	db := openURL(t, url)
	db.migrateLockTimeout = 500 * time.Millisecond
	_, want, err := db.SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("a table held by a long transaction", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A writer's lock on every table, as a long transaction that wrote
		// to them holds (a migration's ALTER TABLE waits for a reader too; a
		// new table's foreign key for a writer).
		if _, err := tx.Exec(ctx, "LOCK TABLE jobs, tenants, usage_ledger, batches, files IN ROW EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = db.MigrateUp(ctx)
		took := time.Since(start)
		_ = tx.Rollback(ctx)
		if err == nil || !strings.Contains(err.Error(), "stayed locked by another transaction") || took > 5*time.Second {
			t.Fatalf("MigrateUp behind a held table lock = %v after %v, want a lock timeout", err, took)
		}
		if have, _, _ := db.SchemaVersion(ctx); have != want-1 {
			t.Fatalf("schema at %d after the failed migration, want %d (nothing applied)", have, want-1)
		}
	})

	t.Run("another process migrating", func(t *testing.T) {
		other, err := Connect(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		unlock, ok, err := other.TryLock(ctx, "llmq.migrate")
		if err != nil || !ok {
			t.Fatalf("TryLock = %v, %v", ok, err)
		}
		defer unlock()
		_, err = db.MigrateUp(ctx)
		if err == nil || !strings.Contains(err.Error(), "another process has been migrating this database") {
			t.Fatalf("MigrateUp while another migrates = %v", err)
		}
	})

	if applied, err := db.MigrateUp(ctx); err != nil || len(applied) != 1 {
		t.Fatalf("MigrateUp once the locks are gone = %v, %v", applied, err)
	}
}

// Every session of the store bounds its statements and its idle
// transactions (60 s unless the URL says otherwise), so none holds its
// locks for ever; the migrations' sessions do not bound their statements.
func TestSessionTimeouts(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := postgresURL(t)
	show := func(db *DB, param string) string {
		var v string
		if err := db.pool.QueryRow(ctx, "SHOW "+param).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	db := openURL(t, url)
	if st, idle := show(db, "statement_timeout"), show(db, "idle_in_transaction_session_timeout"); st != "1min" || idle != "1min" {
		t.Fatalf("statement_timeout %s, idle_in_transaction_session_timeout %s; want 1min each", st, idle)
	}
	own := openURL(t, url+"&statement_timeout=5000")
	if st := show(own, "statement_timeout"); st != "5s" {
		t.Fatalf("the URL's statement_timeout: %s, want 5s", st)
	}
	sdb, done := db.d.gooseDB(db)
	defer func() { _ = done() }()
	var st, lock string
	if err := sdb.QueryRowContext(ctx, "SHOW statement_timeout").Scan(&st); err != nil {
		t.Fatal(err)
	}
	if err := sdb.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&lock); err != nil {
		t.Fatal(err)
	}
	if st != "0" || lock != "10s" {
		t.Fatalf("migration sessions: statement_timeout %s, lock_timeout %s; want 0 and 10s", st, lock)
	}
}
