// Package migrations holds llmq's numbered SQL migrations, one directory per
// database dialect (postgres/ and sqlite/, the same numbers in both), embedded
// so that every binary brings the schema it was built against and the store
// applies them with goose when it opens a database. A migration is never
// edited once released; a change is a new number in both directories.
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
	f, err := fs.Sub(files, dir)
	if err != nil {
		// Only reachable if the embed pattern above and dir disagree: a build bug.
		panic("migrations: " + err.Error())
	}
	return f
}
