package wire

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/llmq/llmq/client"
)

// Error types, as OpenAI names them, so the official SDKs map them to their
// exception classes: every error llmq answers or stores has one of these.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeBudget         = "budget_exceeded_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable_error"
)

// ErrorObject is OpenAI's error object, {"message","type","code","param"}
// with null for an empty code or param. It is client.ErrorObject, and the
// store keeps a job's error as the same type (store.JobError).
type ErrorObject = client.ErrorObject

// Error is an error answer: the object under "error" in the body, the
// status and Retry-After beside it.
type Error = client.Error

// ErrorBody is the body of an error answer, {"error":{...}}.
func ErrorBody(o ErrorObject) []byte {
	b, _ := json.Marshal(Error{ErrorObject: o}) // four strings: cannot fail
	return b
}

// WriteError writes e as the answer: Retry-After in whole seconds (rounded
// up) when e.RetryAfter is positive, e.StatusCode, and its body on one line.
func WriteError(w http.ResponseWriter, e *Error) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.StatusCode)
	_, _ = w.Write(append(ErrorBody(e.ErrorObject), '\n'))
}
