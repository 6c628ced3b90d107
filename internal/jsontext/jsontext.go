// Package jsontext checks JSON texts as they arrive, before llmq decodes or
// stores them: what the database cannot store (Go's decoder would take it),
// what two readers may take apart differently, nesting too deep, and which
// field a byte belongs to, so that the API and batch validation refuse the
// same requests with errors that name the field.
package jsontext

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/llmq/llmq/client"
)

// MaxDepth is how deep objects and arrays may nest in a text llmq takes.
const MaxDepth = 128

// What Postgres's numeric, which holds jsonb's numbers, can hold.
const (
	pgNumericMaxWeight = 131071
	pgNumericMaxScale  = 16383
	pgNumericMaxExp    = 1<<30 - 1
)

// Problem is something in a text that llmq refuses.
type Problem struct {
	Offset int         // where it starts, in bytes from the start of the text
	Code   client.Code // client.CodeInvalidEncoding or client.CodeNumberOutOfRange
	What   string      // what it is, for a message: "a NUL byte", "the number 1e999999 (…)"
	// Member is the name of the member that is the problem (one named
	// twice); "" when the problem is in a value.
	Member string
	// Raw: the bytes themselves are the problem (a NUL byte, bytes that are
	// not UTF-8), not an escape or a number: the text is not text.
	Raw bool
}

// whys say why a problem of a code refuses the text; any other cannot be stored.
var whys = map[client.Code]string{
	client.CodeDuplicateKey: "and a member may be named once, in one case: " +
		"the provider could read the other one",
	client.CodeTooDeep:     "which llmq does not take",
	client.CodeCaseVariant: "and member names are case-sensitive",
}

// Why says, for a message after What, why the problem refuses the text.
func (p *Problem) Why() string { return cmp.Or(whys[p.Code], "which cannot be stored") }

// Unstorable returns the first thing in the text doc that the database
// cannot store, or nil. A text that is not JSON is checked as far as its
// strings and numbers can be told apart.
func Unstorable(doc []byte) *Problem {
	if p := badBytes(doc); p != nil {
		return p
	}
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case c == '"':
			end, p := scanString(doc, i+1)
			if p != nil {
				return p
			}
			i = end
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < len(doc) && isNumberByte(doc[j]) {
				j++
			}
			if !numberStorable(string(doc[i:j])) {
				return &Problem{Offset: i, Code: client.CodeNumberOutOfRange,
					What: fmt.Sprintf("the number %.40s (a number may have at most %d digits before the decimal point and %d after)",
						doc[i:j], pgNumericMaxWeight+1, pgNumericMaxScale)}
			}
			i = j - 1
		}
	}
	return nil
}

// badBytes finds a NUL byte or bytes that are not UTF-8.
func badBytes(doc []byte) *Problem {
	for i := 0; i < len(doc); {
		c := doc[i]
		if c == 0 {
			return &Problem{Offset: i, Code: client.CodeInvalidEncoding, What: "a NUL byte (U+0000 cannot be stored, raw or escaped)", Raw: true}
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(doc[i:])
		if r == utf8.RuneError && size == 1 {
			return &Problem{Offset: i, Code: client.CodeInvalidEncoding, What: fmt.Sprintf("bytes that are not UTF-8 (0x%02X)", c), Raw: true}
		}
		i += size
	}
	return nil
}

// scanString reads the JSON string whose content starts at doc[i] and
// returns the index of its closing quote, or the escape that cannot be
// stored.
func scanString(doc []byte, i int) (end int, p *Problem) {
	for ; i < len(doc); i++ {
		switch doc[i] {
		case '"':
			return i, nil
		case '\\':
			if i+1 < len(doc) && doc[i+1] == 'u' {
				r, ok := hex4(doc, i+2)
				switch {
				case !ok:
				case r == 0:
					return 0, &Problem{Offset: i, Code: client.CodeInvalidEncoding, What: `the character U+0000 (NUL, \u0000)`}
				case 0xD800 <= r && r < 0xDC00: // a high surrogate: its low one must follow
					if lo, ok := hex4(doc, i+8); ok && i+7 < len(doc) && doc[i+6] == '\\' && doc[i+7] == 'u' && 0xDC00 <= lo && lo < 0xE000 {
						i += 6
						break
					}
					return 0, &Problem{Offset: i, Code: client.CodeInvalidEncoding,
						What: fmt.Sprintf(`the unpaired surrogate escape \u%04x (a high surrogate must be followed by a low one)`, r)}
				case 0xDC00 <= r && r < 0xE000:
					return 0, &Problem{Offset: i, Code: client.CodeInvalidEncoding,
						What: fmt.Sprintf(`the unpaired surrogate escape \u%04x (a low surrogate must follow a high one)`, r)}
				}
			}
			i++ // the escaped byte, so an escaped quote or backslash is not read again
		}
	}
	return len(doc), nil
}

func hex4(doc []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(doc) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(doc[i:i+4]), 16, 16)
	return rune(v), err == nil
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// numberStorable reports whether Postgres's numeric holds the JSON number
// lit, as numeric_in judges it (trailing zeros count).
func numberStorable(lit string) bool {
	s := strings.TrimPrefix(lit, "-")
	mant, expPart := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, expPart = s[:i], s[i+1:]
	}
	var exp int64
	if expPart != "" {
		e, err := strconv.ParseInt(expPart, 10, 64)
		if err != nil || e >= pgNumericMaxExp || e <= -pgNumericMaxExp {
			return false
		}
		exp = e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
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

// Structure returns the first thing in the JSON text doc that two readers
// may take apart differently, or nil: a member named twice in one object,
// or two whose names differ only in case, at any depth; nesting deeper than
// MaxDepth; and a top-level member whose name differs only in case from one
// of names (what its reader takes). A text that is not JSON has no such
// problem here.
func Structure(doc []byte, names ...string) (p *Problem) {
	walk(doc, func(stack []frame, tok json.Token, start, _ int, isKey bool) bool {
		n := len(stack)
		if _, ok := tok.(json.Delim); ok && n == MaxDepth {
			// at the third container, whose path names the field
			// ("body.metadata") without a hundred indexes
			p = &Problem{Offset: stack[min(2, n-1)].opened, Code: client.CodeTooDeep,
				What: fmt.Sprintf("objects and arrays nested more than %d deep", MaxDepth)}
			return false
		}
		if !isKey {
			return true
		}
		key, top := tok.(string), &stack[n-1]
		folded := FoldName(key)
		off := start + bytes.IndexByte(doc[start:], '"')
		if first, ok := top.keys[folded]; ok {
			what := fmt.Sprintf("the member %q a second time", key)
			if first != key {
				what = fmt.Sprintf("the member %q beside %q, a name that differs only in case", key, first)
			}
			p = &Problem{Offset: off, Code: client.CodeDuplicateKey, What: what, Member: key}
			return false
		}
		for _, name := range names {
			if n == 1 && key != name && FoldName(name) == folded {
				p = &Problem{Offset: off, Code: client.CodeCaseVariant, Member: key,
					What: fmt.Sprintf("the member %q, which differs from %q only in case", key, name)}
				return false
			}
		}
		top.keys[folded] = key
		return true
	})
	return p
}

// frame is an object or an array walk is in.
type frame struct {
	array   bool
	opened  int               // the offset of its '{' or '['
	keys    map[string]string // an object's names read, folded (see FoldName) → the name
	key     string            // an object's member being read
	index   int               // an array's element being read
	wantKey bool
}

// walk gives visit each token of doc but closing delimiters, in order, with
// the containers it is in, where it starts and ends and whether it is a
// member's name, until visit returns false or doc ends or does not parse.
func walk(doc []byte, visit func(stack []frame, tok json.Token, start, end int, isKey bool) bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber() // a number beyond float64 is still a token
	var stack []frame
	for {
		start := int(dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return
		}
		n := len(stack)
		d, isDelim := tok.(json.Delim)
		if isDelim && (d == '}' || d == ']') {
			stack = stack[:n-1]
			if n > 1 && !stack[n-2].array {
				stack[n-2].wantKey = true
			}
			continue
		}
		isKey := n > 0 && !stack[n-1].array && stack[n-1].wantKey
		if n > 0 && stack[n-1].array {
			stack[n-1].index++
		}
		if !visit(stack, tok, start, int(dec.InputOffset()), isKey) {
			return
		}
		switch {
		case isKey:
			stack[n-1].key, stack[n-1].wantKey = tok.(string), false
		case d == '{':
			stack = append(stack, frame{opened: start + bytes.IndexByte(doc[start:], '{'), keys: map[string]string{}, wantKey: true})
		case d == '[':
			stack = append(stack, frame{array: true, opened: start + bytes.IndexByte(doc[start:], '['), index: -1})
		case n > 0 && !stack[n-1].array:
			stack[n-1].wantKey = true // a member's value was read
		}
	}
}

// FoldName is name with each character replaced by the least of those that
// fold to it, so that two names are equal folded exactly when
// strings.EqualFold says they are (Go's encoding/json's matching).
func FoldName(name string) string {
	var b strings.Builder
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

// Param is the path in doc of what p is about: the member it names
// ("body.max_tokens"), else the value holding its offset (see PathAt).
func (p *Problem) Param(doc []byte) string {
	path := PathAt(doc, p.Offset)
	if path == "" || p.Member == "" {
		return path + p.Member
	}
	return path + "." + p.Member
}

// Names are the json names of the fields of the struct v (or *v), those of
// an embedded struct without a name its own, for Structure.
func Names(v any) []string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		switch name, _, _ := strings.Cut(f.Tag.Get("json"), ","); {
		case f.Anonymous && name == "":
			out = append(out, Names(reflect.Zero(f.Type).Interface())...)
		case name != "" && name != "-":
			out = append(out, name)
		}
	}
	return out
}

// PathAt is the path ("body.messages[0].content") of the value of doc that
// holds byte off (for a member's name, the object's); "" for the top level
// or where doc does not parse.
func PathAt(doc []byte, off int) (path string) {
	walk(doc, func(stack []frame, _ json.Token, _, end int, isKey bool) bool {
		if off >= end {
			return true
		}
		if isKey {
			stack = stack[:len(stack)-1]
		}
		var p strings.Builder
		for _, f := range stack {
			if f.array {
				fmt.Fprintf(&p, "[%d]", f.index)
				continue
			}
			if p.Len() > 0 {
				p.WriteByte('.')
			}
			p.WriteString(f.key)
		}
		path = p.String()
		return false
	})
	return path
}

// Field is the top-level member of a path ("body" of "body.messages[0]").
func Field(path string) string {
	if i := strings.IndexAny(path, ".["); i >= 0 {
		return path[:i]
	}
	return path
}
