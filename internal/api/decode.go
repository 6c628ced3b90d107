package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// decodeJSON reads a JSON object of at most limit bytes from r's body into
// dst (whatever the Content-Type says: curl -d sends a form type), refusing unknown fields, trailing data and wrong types with an error
// that names the field. The raw body is returned for callers that keep it.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, dst any) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, err // MaxBytesError becomes a 413 in writeError
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest("", "invalid_json", "Request body is empty; expected a JSON object.")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return nil, jsonError(err)
	}
	if dec.More() {
		return nil, badRequest("", "invalid_json", "Request body has data after the JSON object.")
	}
	return body, nil
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
