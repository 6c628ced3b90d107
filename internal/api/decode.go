package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/ids"
)

// decodeJSON reads a JSON object of at most limit bytes from r's body into
// dst (whatever the Content-Type says: curl -d sends a form type), refusing unknown fields, trailing data and wrong types with an error
// that names the field. The raw body is returned for callers that keep it.
//
// It also refuses, naming the field, what Postgres cannot store as text or
// jsonb: bytes that are not UTF-8, and the escapes of NUL (\u0000) and of
// unpaired UTF-16 surrogates, which Go's decoder would take (as U+0000 and
// U+FFFD). A prompt holding one is refused too, as a batch's line is: a
// request is never sent other than it was written.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, dst any) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, err // MaxBytesError becomes a 413 in writeError
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest("", "invalid_json", "Request body is empty; expected a JSON object.")
	}
	if off := invalidUTF8(body); off >= 0 {
		return nil, encodingError(body, off, "is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return nil, jsonError(err)
	}
	if dec.More() {
		return nil, badRequest("", "invalid_json", "Request body has data after the JSON object.")
	}
	if off, what := unstorableEscape(body); off >= 0 {
		return nil, encodingError(body, off, "holds "+what+", which cannot be stored")
	}
	return body, nil
}

// encodingError is the 400 of a body that holds at byte off what cannot be
// stored; it names the field whose value holds it when the body is JSON
// that far.
func encodingError(body []byte, off int, what string) *Error {
	param := jsonPathAt(body, off)
	if param == "" {
		return badRequest("", "invalid_encoding", "Request body %s (at byte %d).", what, off)
	}
	return badRequest(param, "invalid_encoding", "'%s' %s (at byte %d of the request body).", param, what, off)
}

// invalidUTF8 is the offset of the first byte of b that is not UTF-8, or -1.
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1
}

// unstorableEscape is the offset in the valid JSON text b of the first
// escape Postgres refuses (NUL, or half of a surrogate pair without its
// other half) and what it is, or -1.
func unstorableEscape(b []byte) (int, string) {
	hex4 := func(i int) rune {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return -1
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		if err != nil {
			return -1
		}
		return rune(v)
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		// Valid JSON: a backslash is in a string and starts an escape.
		switch r := hex4(i); {
		case r == 0:
			return i, `the character U+0000 (NUL, \u0000)`
		case r >= 0xd800 && r < 0xdc00:
			if lo := hex4(i + 6); lo < 0xdc00 || lo > 0xdfff {
				return i, fmt.Sprintf(`the unpaired surrogate escape \u%04x (a high surrogate must be followed by a low one)`, r)
			}
			i += 11
		case r >= 0xdc00 && r <= 0xdfff:
			return i, fmt.Sprintf(`the unpaired surrogate escape \u%04x (a low surrogate must follow a high one)`, r)
		default:
			i++ // the escaped character, so an escaped backslash is not read again
		}
	}
	return -1, ""
}

// jsonPathAt is the param ("body.messages[0].content") of the value of the
// JSON document doc that holds byte off; for a byte inside a member's name,
// the object's. It is "" for the top level, or where doc does not parse.
func jsonPathAt(doc []byte, off int) string {
	type frame struct {
		array   bool
		key     string // an object's member being read
		index   int    // an array's element being read
		wantKey bool
	}
	var stack []frame
	path := func(fs []frame) string {
		var p strings.Builder
		for _, f := range fs {
			if f.array {
				fmt.Fprintf(&p, "[%d]", f.index)
				continue
			}
			if p.Len() > 0 {
				p.WriteByte('.')
			}
			p.WriteString(f.key)
		}
		return p.String()
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		end := int(dec.InputOffset())
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			if key, ok := tok.(string); ok && !top.array && top.wantKey {
				if off < end {
					return path(stack[:n-1])
				}
				top.key, top.wantKey = key, false
				continue
			}
			if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
				stack = stack[:n-1]
				if n > 1 && !stack[n-2].array {
					stack[n-2].wantKey = true
				}
				continue
			}
			if top.array {
				top.index++
			}
		}
		if d, ok := tok.(json.Delim); ok { // '{' or '['
			stack = append(stack, frame{array: d == '[', index: -1, wantKey: d == '{'})
			continue
		}
		if off < end {
			return path(stack)
		}
		if n := len(stack); n > 0 && !stack[n-1].array {
			stack[n-1].wantKey = true
		}
	}
}

// pathID is the {id} of r's path when it is an id of prefix's type (the ids
// package's shape). Any other cannot name an object: it is the 404 of a
// missing what, answered without asking the store.
func pathID(r *http.Request, prefix, what string) (string, error) {
	id := r.PathValue("id")
	if !ids.Valid(prefix, id) {
		return "", notFound(what, id)
	}
	return id, nil
}

// queryID is the query parameter name of q, which must be empty or the id
// of a what (of prefix's type): a list's cursor (after) or a filter by id.
func queryID(q url.Values, name, prefix, what string) (string, error) {
	v := q.Get(name)
	if v != "" && !ids.Valid(prefix, v) {
		return "", badRequest(name, "invalid_value", "%s must be the id of a %s ('%s…'), got '%.100s'.", name, what, prefix, v)
	}
	return v, nil
}

// jsonError turns a decoding error into a client error naming what is wrong.
func jsonError(err error) *Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return badRequest("", "invalid_json", "Request body is not valid JSON (at byte %d): %v.", syn.Offset, syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return badRequest("", "invalid_json", "Request body must be a JSON object, got %s.", typ.Value)
		}
		return badRequest(field, "invalid_type", "Field '%s' must be %s, got %s.", field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "invalid_json", "Request body is truncated JSON.")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badRequest(name, "unknown_field", "Unknown field '%s'.", name)
	}
	return badRequest("", "invalid_json", "Request body is not valid JSON: %v.", err)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64", "int32", "uint", "uint64", "float64":
		return "a number"
	case "bool":
		return "a boolean"
	case "map", "struct":
		return "an object"
	case "slice", "array":
		return "an array"
	}
	return fmt.Sprintf("of type %s", goKind)
}
