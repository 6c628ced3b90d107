package migrations

import (
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var name = regexp.MustCompile(`^\d{3}_[a-z0-9_]+\.sql$`)

// Both dialects must have the same numbered migrations, each with an Up and
// a Down section, or a schema change would reach one backend only.
func TestDialectsHaveTheSameMigrations(t *testing.T) {
	t.Parallel()
	list := func(fsys fs.FS) []string {
		entries, err := fs.ReadDir(fsys, ".")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			if !name.MatchString(e.Name()) {
				t.Errorf("%s: want NNN_name.sql", e.Name())
			}
			b, err := fs.ReadFile(fsys, e.Name())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), "-- +goose Up") || !strings.Contains(string(b), "-- +goose Down") {
				t.Errorf("%s: missing a -- +goose Up or Down section", e.Name())
			}
			names = append(names, e.Name())
		}
		return names
	}
	pg, lite := list(Postgres()), list(SQLite())
	if len(pg) == 0 || !slices.Equal(pg, lite) {
		t.Fatalf("postgres has %v, sqlite has %v", pg, lite)
	}
}

// largeTables grow with traffic: a migration must not lock one for long.
var largeTables = []string{"jobs", "usage_ledger", "file_chunks", "files", "batches"}

var (
	createIndex = regexp.MustCompile(`(?is)\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?\S+\s+ON\s+(?:ONLY\s+)?"?(\w+)"?`)
	updateAll   = regexp.MustCompile(`(?is)\bUPDATE\s+"?(\w+)"?\s+SET\b[^;]*;`)
)

// From migration 013 on, a Postgres migration changes the large tables
// online (the package comment): indexes CONCURRENTLY, outside a
// transaction, and no UPDATE of a whole large table.
func TestLargeTablesChangeOnline(t *testing.T) {
	t.Parallel()
	entries, err := fs.ReadDir(Postgres(), ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() < "013" {
			continue // released before the rule
		}
		raw, err := fs.ReadFile(Postgres(), e.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, problem := range onlineProblems(string(raw)) {
			t.Errorf("%s: %s", e.Name(), problem)
		}
	}
	// The check itself, on what 006 did and what it should have done.
	if p := onlineProblems("-- +goose Up\nCREATE INDEX jobs_x ON jobs (x);\nUPDATE jobs SET x = 1;"); len(p) != 2 {
		t.Errorf("the rule misses a blocking index and a full-table UPDATE: %q", p)
	}
	if p := onlineProblems("-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_x ON jobs (x);\n" +
		"UPDATE jobs SET x = 1 WHERE id IN (SELECT id FROM jobs WHERE x IS NULL LIMIT 1000);"); len(p) != 0 {
		t.Errorf("the rule refuses an online change: %q", p)
	}
}

// onlineProblems lists what in a Postgres migration would lock a large
// table for long.
func onlineProblems(sql string) []string {
	var out []string
	for _, m := range createIndex.FindAllStringSubmatch(sql, -1) {
		if !slices.Contains(largeTables, strings.ToLower(m[2])) {
			continue
		}
		if m[1] == "" {
			out = append(out, "CREATE INDEX on "+m[2]+" without CONCURRENTLY blocks its writes while it builds")
		} else if !strings.Contains(sql, "-- +goose NO TRANSACTION") {
			out = append(out, "CREATE INDEX CONCURRENTLY needs the file marked -- +goose NO TRANSACTION")
		}
	}
	for _, m := range updateAll.FindAllStringSubmatch(sql, -1) {
		if slices.Contains(largeTables, strings.ToLower(m[1])) && !regexp.MustCompile(`(?i)\bLIMIT\b`).MatchString(m[0]) {
			out = append(out, "UPDATE of "+m[1]+" without a batch (LIMIT): one transaction locks every row it rewrites")
		}
	}
	return out
}
