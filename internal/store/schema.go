package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// DefaultMigrateLockTimeout is how long a migration waits for a lock
// (another migrating process's, or a table's) before it gives up.
const DefaultMigrateLockTimeout = 10 * time.Second

// SchemaError says the database's schema is not this binary's.
type SchemaError struct {
	// Have is the database's schema version, Want this binary's.
	Have, Want int64
}

func (e *SchemaError) Error() string {
	if e.Have > e.Want {
		return fmt.Sprintf("store: the database's schema is at version %d, newer than this binary knows (%d): "+
			"a later llmq migrated it; run that version (or a later one), or `dispatcher migrate down` with the binary that migrated it",
			e.Have, e.Want)
	}
	return fmt.Sprintf("store: the database's schema is at version %d, this binary needs version %d: run `dispatcher migrate up` first",
		e.Have, e.Want)
}

// MigrationState is one migration this binary knows.
type MigrationState struct {
	Version   int64
	Name      string // the file name, e.g. 012_worker_lease.sql
	Applied   bool
	AppliedAt time.Time // zero when pending
}

// SchemaVersion returns the database's schema version (0 for none, left
// as it was) and this binary's.
func (db *DB) SchemaVersion(ctx context.Context) (have, want int64, err error) {
	m, done, err := db.migrator()
	if err != nil {
		return 0, 0, failed("schema version", err)
	}
	defer func() { _ = done() }()
	if have, _, err = m.applied(ctx); err != nil {
		return 0, 0, failed("schema version", err)
	}
	src := m.ListSources()
	return have, src[len(src)-1].Version, nil
}

// MigrateUp applies every pending migration and returns their versions.
func (db *DB) MigrateUp(ctx context.Context) ([]int64, error) {
	var applied []int64
	err := db.migrating(ctx, func(p *goose.Provider) error {
		results, err := p.Up(ctx)
		for _, r := range results {
			applied = append(applied, r.Source.Version)
		}
		return err
	})
	level := slog.LevelDebug
	if len(applied) > 0 {
		level = slog.LevelInfo
	}
	if err == nil {
		db.log.Log(ctx, level, "store: schema migrated", "dialect", db.d.name, "applied", len(applied))
	}
	return applied, err
}

// MigrateDown reverts the latest applied migration and returns its
// version, or 0 when none is applied.
func (db *DB) MigrateDown(ctx context.Context) (int64, error) {
	var version int64
	err := db.migrating(ctx, func(p *goose.Provider) error {
		r, err := p.Down(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			return nil
		}
		if r != nil && r.Source != nil {
			version = r.Source.Version
		}
		return err
	})
	return version, err
}

// MigrationStatus lists every migration this binary knows, oldest first.
// It only reads (goose's Status would create its table in a database never
// migrated).
func (db *DB) MigrationStatus(ctx context.Context) ([]MigrationState, error) {
	m, done, err := db.migrator()
	if err != nil {
		return nil, failed("migration status", err)
	}
	defer func() { _ = done() }()
	_, migrated, err := m.applied(ctx)
	var out []MigrationState
	for _, src := range m.ListSources() {
		s := MigrationState{Version: src.Version, Name: path.Base(src.Path)}
		if migrated && err == nil {
			var r *database.GetMigrationResult
			if r, err = m.versions.GetMigration(ctx, m.sdb, src.Version); err == nil {
				s.Applied, s.AppliedAt = true, r.Timestamp
			} else if errors.Is(err, database.ErrVersionNotFound) {
				err = nil
			}
		}
		out = append(out, s)
	}
	if err != nil {
		return nil, failed("migration status", err)
	}
	return out, nil
}

// migrating runs fn under the migration lock, which processes migrating
// one database take in turn, giving up after the lock timeout.
func (db *DB) migrating(ctx context.Context, fn func(*goose.Provider) error) error {
	wctx, cancel := context.WithTimeout(ctx, db.migrateLockTimeout)
	unlock, err := db.waitLock(wctx, "llmq.migrate")
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			return fmt.Errorf("store: migrate: another process has been migrating this database for %v (lock llmq.migrate); try again once it is done", db.migrateLockTimeout)
		}
		return failed("migrate", err)
	}
	defer unlock()
	p, done, err := db.migrator()
	if err != nil {
		return failed("migrate", err)
	}
	defer func() { _ = done() }()
	err = fn(p.Provider)
	if err != nil && isLockTimeout(err) {
		return fmt.Errorf("store: migrate: a table it changes stayed locked by another transaction for %v (lock_timeout), nothing of that migration was applied: "+
			"end that transaction or try again when the database is quieter: %w", db.migrateLockTimeout, err)
	}
	return failed("migrate", err)
}

// migrator is goose's provider of the embedded migrations, and its store
// of versions.
type migrator struct {
	*goose.Provider
	versions database.Store
	sdb      *sql.DB
	db       *DB
}

func (db *DB) migrator() (*migrator, func() error, error) {
	sdb, done := db.d.gooseDB(db)
	versions, err := database.NewStore(db.d.goose, goose.DefaultTablename)
	var p *goose.Provider
	if err == nil {
		p, err = goose.NewProvider(goose.DialectCustom, sdb, db.d.migrations, goose.WithStore(versions),
			goose.WithDisableGlobalRegistry(true))
	}
	if err != nil {
		_ = done()
		return nil, nil, err
	}
	return &migrator{Provider: p, versions: versions, sdb: sdb, db: db}, done, nil
}

// applied is the latest version applied and whether goose's table exists.
// It only reads.
func (m *migrator) applied(ctx context.Context) (version int64, migrated bool, err error) {
	err = m.db.ro.queryRow(ctx, m.db.d.tableExists, m.versions.Tablename()).Scan(&migrated)
	if err != nil || !migrated {
		return 0, false, err
	}
	version, err = m.versions.GetLatestVersion(ctx, m.sdb)
	if errors.Is(err, database.ErrVersionNotFound) {
		return 0, true, nil
	}
	return version, true, err
}
