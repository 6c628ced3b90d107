package wire

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/llmq/llmq/client"
)

// Error types, as OpenAI names them, so the official SDKs map them to their
// exception classes: every error llmq answers or stores has one of these.
const (
	TypeInvalidRequest    = "invalid_request_error"
	TypeAuthentication    = "authentication_error"
	TypePermission        = "permission_error"
	TypeNotFound          = "not_found_error"
	TypeRateLimit         = "rate_limit_error"
	TypeBudget            = "budget_exceeded_error"
	TypeInsufficientQuota = "insufficient_quota"
	TypeServer            = "server_error"
	TypeUnavailable       = "service_unavailable_error"
)

// ErrorObject is OpenAI's error object, {"message","type","code","param"}
// with null for an empty code or param. It is client.ErrorObject, and the
// store keeps a job's error as the same type (store.JobError).
type ErrorObject = client.ErrorObject

// Error is llmq's one client error: every refusal the API answers, that
// admission, request parsing, batch validation or a synchronous run makes,
// is one. Its codes are package client's (client/codes.go).
type Error struct {
	Status     int
	Type       string
	Code       client.Code
	Param      string
	Message    string
	RetryAfter time.Duration // sets Retry-After when positive
}

func (e *Error) Error() string { return e.Message }

// Errorf builds an Error; param may be empty.
func Errorf(status int, typ string, code client.Code, param, format string, args ...any) *Error {
	return &Error{Status: status, Type: typ, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// Invalid is a 400 invalid_request_error.
func Invalid(param string, code client.Code, format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, TypeInvalidRequest, code, param, format, args...)
}

// Object is e's error object, as a body or a job's error carries it.
func (e *Error) Object() ErrorObject {
	return ErrorObject{Message: e.Message, Type: e.Type, Code: e.Code, Param: e.Param}
}

// ParamIn is Param as a path within a request's field ("body.messages"):
// the field itself when Param is empty or names the whole body.
func (e *Error) ParamIn(field string) string {
	if e.Param == "" || e.Param == "body" {
		return field
	}
	return field + "." + e.Param
}

// ErrorBody is the body of an error answer, {"error":{...}}.
func ErrorBody(o ErrorObject) []byte {
	b, _ := json.Marshal(client.Error{ErrorObject: o}) // four strings: cannot fail
	return b
}

// WriteError writes e as the answer: Retry-After in whole seconds (rounded
// up) when e.RetryAfter is positive, e.Status, and its body on one line.
func WriteError(w http.ResponseWriter, e *Error) { writeError(w, e, ErrorBody(e.Object())) }

// writeError answers e with body.
func writeError(w http.ResponseWriter, e *Error, body []byte) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}

// AnthropicType is the type of Anthropic's error of e's status, by which
// Anthropic's SDKs pick their error classes.
func (e *Error) AnthropicType() string {
	switch e.Status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	if e.Status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// AnthropicErrorBody is e in Anthropic's error shape, {"type": "error",
// "error": {"type", "message"}}: an answer's body, a stream's error event.
func AnthropicErrorBody(e *Error) []byte {
	type object struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error object `json:"error"`
	}{"error", object{e.AnthropicType(), e.Message}}) // strings: cannot fail
	return b
}

// WriteAnthropicError is WriteError in Anthropic's error shape.
func WriteAnthropicError(w http.ResponseWriter, e *Error) { writeError(w, e, AnthropicErrorBody(e)) }
