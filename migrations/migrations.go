// Package migrations holds llmq's numbered SQL migrations, one directory per
// database dialect (postgres/ and sqlite/, the same numbers in both), embedded
// so that every binary brings the schema it was built against and the store
// applies them with goose under `dispatcher migrate` (and `dispatcher dev`).
// A migration is never edited once released; a change is a new number in
// both directories.
//
// The tables that grow with traffic (jobs, usage_ledger, file_chunks,
// files, batches) are changed while llmq runs: from
// migration 013 on, a Postgres migration creates their indexes
// CONCURRENTLY (in a file marked "-- +goose NO TRANSACTION", since that
// cannot run in a transaction), never backfills them with one UPDATE of the
// whole table (a column gets a default, or a later migration fills it in
// batches), and adds a column NOT NULL only with a constant default
// (Postgres then writes no row). TestLargeTablesChangeOnline checks the
// first two. Migrations 001–012 predate the rule.
package migrations

import (
	"embed"
	"io/fs"
)

//go:embed postgres/*.sql sqlite/*.sql
var files embed.FS

// Postgres returns the migrations for PostgreSQL, file names NNN_name.sql at the root.
func Postgres() fs.FS { return sub("postgres") }

// SQLite returns the migrations for SQLite, file names NNN_name.sql at the root.
func SQLite() fs.FS { return sub("sqlite") }

func sub(dir string) fs.FS {
	f, _ := fs.Sub(files, dir) // refuses only a dir that is not a valid path
	return f
}
