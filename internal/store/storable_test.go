package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/jsontext"
)

// TestUnstorableAgreesWithPostgres checks, value by value, that what
// jsontext.Unstorable lets through Postgres stores as jsonb, and what it
// refuses Postgres refuses: numbers at and past numeric's limits, NUL and
// surrogate escapes, and escapes that only look like them. The database's
// errors are classified too: a refused value is permanent, a lost
// connection is not.
func TestUnstorableAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	sdb := openURL(t, postgresURL(t))
	db := sdb.rw
	permanent := sdb.IsPermanent
	ctx := context.Background()
	digits := func(n int) string { return strings.Repeat("0", n) }
	docs := []string{
		`[0]`, `[-0]`, `[1.5e10]`, `[1E+2]`, `[-12.25e-3]`,
		`[9.99e131071]`, `[1e131072]`, `[0.5e131072]`, `[1000e131068]`, `[1000e131069]`,
		`[1e-16383]`, `[1e-16384]`, `[1.00000e-16378]`, `[1.00000e-16379]`,
		`[0.` + digits(16382) + `1]`, `[0.` + digits(16383) + `1]`, `[1.` + digits(16384) + `]`,
		`[0e1000000]`, `[0e-16383]`, `[0e-16384]`, `[0e1073741822]`, `[0e1073741823]`, `[1e99999999999999999999]`,
		`["a\u0000b"]`, `["a\\u0000b"]`, `["\\\u0000"]`, `["\u0001\u007f\uffff"]`,
		`["\ud83d\ude00"]`, `["\uD83D\uDE00"]`, `["\ud83d"]`, `["\ud83d\u0041"]`, `["\ude00"]`, `["x\ud83d\ud83d\ude00"]`,
		`{"k\u0000":1}`, `{"\"":[1e131072]}`, `["\"1e131072"]`,
	}
	for _, doc := range docs {
		p := jsontext.Unstorable([]byte(doc))
		var n int
		dbErr := db.queryRow(ctx, `SELECT length($1::text::jsonb::text)`, doc).Scan(&n)
		short := doc
		if len(short) > 40 {
			short = short[:40] + "…"
		}
		if (p == nil) != (dbErr == nil) {
			t.Errorf("%s: Unstorable = %+v, Postgres: %v", short, p, dbErr)
		}
		if dbErr != nil && !permanent(dbErr) {
			t.Errorf("%s: Postgres's refusal %v is not permanent", short, dbErr)
		}
	}
	for _, line := range []string{"caf\xe9", "a\x00b", "\xc3"} {
		if p := jsontext.Unstorable([]byte(line)); p == nil || !p.Raw {
			t.Errorf("Unstorable(%q) = %+v, want a problem of the bytes", line, p)
		}
		if err := db.queryRow(ctx, `SELECT $1::text`, line).Scan(new(string)); err == nil || !permanent(err) {
			t.Errorf("Postgres took %q as text, or its refusal is not permanent: %v", line, err)
		}
	}
	if p := jsontext.Unstorable([]byte("café ☕ \U0001F600")); p != nil {
		t.Errorf("Unstorable of UTF-8 text = %+v", p)
	}

	// Errors retrying can fix are not permanent.
	if _, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2"); err == nil || permanent(err) {
		t.Errorf("a refused connection: err = %v, permanent = %v", err, err != nil && permanent(err))
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := db.exec(short, `SELECT pg_sleep(5)`); err == nil || permanent(err) {
		t.Errorf("a timed-out query: err = %v, permanent = %v", err, err != nil && permanent(err))
	}
}
