package batch

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/llmq/llmq/internal/store"
)

// What Postgres's numeric, which holds jsonb's numbers, can hold: digits up
// to 10^131071 (a weight of 32767 in base 10000), 16383 after the decimal
// point, and an exponent its parser reads (below INT_MAX/2).
const (
	pgNumericMaxWeight = 131071
	pgNumericMaxScale  = 16383
	pgNumericMaxExp    = 1<<30 - 1
)

// encodingProblem is why a line's bytes cannot be stored as text, or "":
// text and jsonb columns hold UTF-8 without NUL. It is checked before the
// JSON is decoded, which would replace invalid bytes with U+FFFD.
func encodingProblem(line []byte) string {
	for i := 0; i < len(line); {
		c := line[i]
		if c == 0 {
			return fmt.Sprintf("the line holds a NUL byte at byte %d; NUL (U+0000) cannot be stored, raw or escaped.", i+1)
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(line[i:])
		if r == utf8.RuneError && size == 1 {
			return fmt.Sprintf("the line is not valid UTF-8 (byte 0x%02X at byte %d); a batch input file must be UTF-8 text.", c, i+1)
		}
		i += size
	}
	return ""
}

// jsonProblem is why Postgres would refuse raw, valid JSON as jsonb, or "":
// an escaped NUL (\u0000), an unpaired UTF-16 surrogate escape, or a number
// beyond what numeric holds. Go's decoder takes all three (the first two
// become U+0000 and U+FFFD). The code is "invalid_encoding" or
// "number_out_of_range".
func jsonProblem(raw []byte) (code, what string) {
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			end, what := scanString(raw, i+1)
			if what != "" {
				return "invalid_encoding", what
			}
			i = end
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < len(raw) && isNumberByte(raw[j]) {
				j++
			}
			if !numberStorable(string(raw[i:j])) {
				return "number_out_of_range", fmt.Sprintf("the number %.40s (a number may have at most %d digits before the decimal point and %d after)",
					raw[i:j], pgNumericMaxWeight+1, pgNumericMaxScale)
			}
			i = j - 1
		}
	}
	return "", ""
}

// scanString reads the JSON string whose content starts at raw[i] and
// returns the index of its closing quote, or why it cannot be stored.
func scanString(raw []byte, i int) (end int, what string) {
	for ; i < len(raw); i++ {
		switch raw[i] {
		case '"':
			return i, ""
		case '\\':
			if i+1 < len(raw) && raw[i+1] == 'u' {
				r, ok := hex4(raw, i+2)
				switch {
				case !ok:
				case r == 0:
					return 0, `the character U+0000 (NUL, \u0000)`
				case 0xD800 <= r && r < 0xDC00: // a high surrogate: its low one must follow
					if lo, ok := hex4(raw, i+8); ok && i+7 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' && 0xDC00 <= lo && lo < 0xE000 {
						i += 6
						break
					}
					return 0, fmt.Sprintf(`the unpaired surrogate escape \u%04x (a high surrogate must be followed by a low one)`, r)
				case 0xDC00 <= r && r < 0xE000:
					return 0, fmt.Sprintf(`the unpaired surrogate escape \u%04x (a low surrogate must follow a high one)`, r)
				}
			}
			i++ // the escaped byte, so an escaped quote or backslash is not read again
		}
	}
	return len(raw), ""
}

// hex4 reads the four hex digits at raw[i:i+4].
func hex4(raw []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(raw) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(raw[i:i+4]), 16, 16)
	return rune(v), err == nil
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// numberStorable reports whether Postgres's numeric holds the JSON number
// lit, as numeric_in judges it: an exponent it reads, at most
// pgNumericMaxScale digits after the decimal point (trailing zeros count),
// and a most significant digit at most pgNumericMaxWeight places before it.
func numberStorable(lit string) bool {
	s := lit
	if s != "" && s[0] == '-' {
		s = s[1:]
	}
	mant, expPart := s, ""
	for i := 0; i < len(s); i++ {
		if s[i] == 'e' || s[i] == 'E' {
			mant, expPart = s[:i], s[i+1:]
			break
		}
	}
	var exp int64
	if expPart != "" {
		e, err := strconv.ParseInt(expPart, 10, 64)
		if err != nil || e >= pgNumericMaxExp || e <= -pgNumericMaxExp {
			return false
		}
		exp = e
	}
	intPart, frac := mant, ""
	for i := 0; i < len(mant); i++ {
		if mant[i] == '.' {
			intPart, frac = mant[:i], mant[i+1:]
			break
		}
	}
	if int64(len(frac))-exp > pgNumericMaxScale {
		return false
	}
	digits := intPart + frac
	for k := 0; k < len(digits); k++ {
		if digits[k] != '0' {
			return int64(len(intPart)-1-k)+exp <= pgNumericMaxWeight
		}
	}
	return true // zero: any weight
}

// permanent reports whether err, met reading or storing a batch's lines,
// would come back however often the validation ran: the database refused
// the data itself (Postgres's SQLSTATE classes 22, data exception, 23,
// integrity constraint violation, and 54, program limit exceeded; SQLite's
// constraint, too-big, mismatch and range errors), or the store found a
// conflict or a missing row. A lost connection, a timeout, a cancelled
// query or a busy database is not: the next sweep tries again.
func permanent(err error) bool {
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 {
		switch pe.Code[:2] {
		case "22", "23", "54":
			return true
		}
		return false
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE:
			return true
		}
	}
	return false
}

// databaseReason is the database's own words for err: the message and
// SQLSTATE of a Postgres error, without the store's wrapping.
func databaseReason(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Error()
	}
	return err.Error()
}
