package store

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/money"
)

// The scan targets below read a column whichever driver hands it over: pgx
// gives timestamptz and date as time.Time, SQLite's TEXT comes as a string.

// timeCol scans a NOT NULL timestamp into t, in UTC.
type timeCol struct{ t *time.Time }

func (c timeCol) Scan(src any) error {
	var s string
	switch v := src.(type) {
	case time.Time:
		*c.t = v.UTC()
		return nil
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return fmt.Errorf("store: cannot read %T as a time", src)
	}
	parsed, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return fmt.Errorf("store: time column: %w", err)
	}
	*c.t = parsed.UTC()
	return nil
}

// nullTimeCol scans a nullable timestamp into *t (nil for NULL).
type nullTimeCol struct{ t **time.Time }

func (c nullTimeCol) Scan(src any) error {
	*c.t = nil
	if src == nil {
		return nil
	}
	*c.t = new(time.Time)
	return timeCol{*c.t}.Scan(src)
}

// orZero scans a nullable column into *p, the zero value for NULL.
type orZero[T any] struct{ p *T }

func (c orZero[T]) Scan(src any) error {
	var n sql.Null[T]
	err := n.Scan(src)
	*c.p = n.V
	return err
}

// dayCol scans a budget day (DATE on Postgres, TEXT on SQLite) as "YYYY-MM-DD".
type dayCol struct{ s *string }

func (c dayCol) Scan(src any) error {
	switch v := src.(type) {
	case time.Time:
		*c.s = v.Format(time.DateOnly)
	case string:
		*c.s = v
	case []byte:
		*c.s = string(v)
	default:
		return fmt.Errorf("store: cannot read %T as a day", src)
	}
	return nil
}

// orNull is v, or NULL for the zero value, which partial indexes and
// foreign keys skip.
func orNull[T comparable](v T) any {
	var zero T
	if v == zero {
		return nil
	}
	return v
}

// nullJSON is raw as text, or NULL when raw is empty or the JSON null.
func nullJSON(raw json.RawMessage) any {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		return nil
	}
	return string(withoutNUL(raw))
}

// withoutNUL replaces the escape \u0000 in JSON strings with \ufffd, which
// Postgres jsonb can hold; SQLite gets the same text.
func withoutNUL(raw []byte) []byte {
	if !bytes.Contains(raw, []byte(`\u0000`)) {
		return raw
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 == len(raw) {
			out = append(out, c)
			continue
		}
		// Any other escape (\\ included) is kept whole.
		if raw[i+1] == 'u' && i+6 <= len(raw) && string(raw[i+2:i+6]) == "0000" {
			out = append(out, `\ufffd`...)
			i += 5
			continue
		}
		out = append(out, c, raw[i+1])
		i++
	}
	return out
}

func validDay(method, day string) error {
	if _, err := time.Parse(time.DateOnly, day); err != nil || len(day) != len(time.DateOnly) {
		return fmt.Errorf("store: %s: day %q is not YYYY-MM-DD", method, day)
	}
	return nil
}

// microsCol scans a nullable amount into *m (nil for NULL).
type microsCol struct{ m **money.Micros }

func (c microsCol) Scan(src any) error {
	var n sql.Null[money.Micros]
	err := n.Scan(src)
	*c.m = nil
	if n.Valid {
		*c.m = &n.V
	}
	return err
}

func nullMicros(m *money.Micros) any {
	if m == nil {
		return nil
	}
	return int64(*m)
}
