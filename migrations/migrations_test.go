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
