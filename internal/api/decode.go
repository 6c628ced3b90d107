package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/jsontext"
	"github.com/llmq/llmq/internal/wire"
)

// decodeJSON reads a JSON object of at most limit bytes from r's body into
// dst (whatever the Content-Type says: curl -d sends a form type) and
// returns the body; an optional body may be empty, which leaves dst as it
// is. It refuses, naming the field, unknown fields, trailing data, wrong
// types, what jsontext refuses, and a member named as one of dst's fields
// but for case (Go's decoder would take it for that field).
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, dst any, optional bool) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	empty := len(bytes.TrimSpace(body)) == 0
	switch {
	case err != nil:
		return nil, err // MaxBytesError becomes a 413 in writeError
	case empty && optional:
		return body, nil
	case empty:
		return nil, wire.Invalid("", client.CodeInvalidJSON, "Request body is empty; expected a JSON object.")
	}
	if p := jsontext.Unstorable(body); p != nil {
		return nil, encodingError(body, p)
	}
	if p := jsontext.Structure(body, jsontext.Names(dst)...); p != nil {
		return nil, encodingError(body, p)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return nil, jsonError(err)
	}
	if dec.More() {
		return nil, wire.Invalid("", client.CodeInvalidJSON, "Request body has data after the JSON object.")
	}
	return body, nil
}

// encodingError is the 400 of a body holding what the database cannot
// store or what readers may take apart differently; it names the field whose
// value holds it when the body is JSON.
func encodingError(body []byte, p *jsontext.Problem) *wire.Error {
	param := p.Param(body)
	switch {
	case param == "":
		return wire.Invalid("", p.Code, "Request body holds %s at byte %d, %s.", p.What, p.Offset, p.Why())
	case p.Member != "":
		return wire.Invalid(param, p.Code, "Request body holds %s, '%s' (at byte %d), %s.", p.What, param, p.Offset, p.Why())
	}
	return wire.Invalid(param, p.Code, "'%s' holds %s (at byte %d of the request body), %s.", param, p.What, p.Offset, p.Why())
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

// callersByID is the caller's what whose id is id, read by get; an id that
// is malformed or not the caller's is the 404 of a missing what.
func callersByID[T any](r *http.Request, id, prefix, what string, get func(ctx context.Context, tenantID, id string) (T, error)) (T, error) {
	if !ids.Valid(prefix, id) {
		var zero T
		return zero, notFound(what, id)
	}
	v, err := get(r.Context(), callerOf(r).tenant.ID, id)
	return v, missingAs(err, what, id)
}

// listPage reads a list's ?limit= (1 to most, default 20) and its ?after=
// cursor, the id of a what (of prefix's type).
func listPage(q url.Values, most int, prefix, what string) (limit int, after string, err error) {
	limit = 20
	if raw := q.Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > most {
			return 0, "", wire.Invalid("limit", client.CodeInvalidValue, "limit must be a whole number from 1 to %d, got '%s'.", most, raw)
		}
		limit = n
	}
	after, err = queryID(q, "after", prefix, what)
	return limit, after, err
}

// queryID is the query parameter name of q, which must be empty or the id
// of a what (of prefix's type): a list's cursor (after) or a filter by id.
func queryID(q url.Values, name, prefix, what string) (string, error) {
	v := q.Get(name)
	if v != "" && !ids.Valid(prefix, v) {
		return "", wire.Invalid(name, client.CodeInvalidValue, "%s must be the id of a %s ('%s…'), got '%.100s'.", name, what, prefix, v)
	}
	return v, nil
}

// jsonError turns a decoding error into a client error naming what is wrong.
func jsonError(err error) *wire.Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return wire.Invalid("", client.CodeInvalidJSON, "Request body is not valid JSON (at byte %d): %v.", syn.Offset, syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return wire.Invalid("", client.CodeInvalidJSON, "Request body must be a JSON object, got %s.", typ.Value)
		}
		return wire.Invalid(field, client.CodeInvalidType, "Field '%s' must be %s, got %s.", field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return wire.Invalid("", client.CodeInvalidJSON, "Request body is truncated JSON.")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return wire.Invalid(name, client.CodeUnknownField, "Unknown field '%s'.", name)
	}
	return wire.Invalid("", client.CodeInvalidJSON, "Request body is not valid JSON: %v.", err)
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
