package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/redisfail"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Error is the one error every handler returns to a client. It is written as
// OpenAI's {"error":{"message","type","code","param"}} (wire.WriteError).
type Error struct {
	Status     int
	Type       string
	Code       string
	Param      string
	Message    string
	RetryAfter time.Duration // sets Retry-After when positive
}

func (e *Error) Error() string { return e.Message }

// errorf builds an Error; param and code may be empty.
func errorf(status int, typ, code, param, format string, args ...any) *Error {
	return &Error{Status: status, Type: typ, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

func badRequest(param, code, format string, args ...any) *Error {
	return errorf(http.StatusBadRequest, wire.TypeInvalidRequest, code, param, format, args...)
}

func notFound(what, id string) *Error {
	return errorf(http.StatusNotFound, wire.TypeNotFound, "not_found", "", "No %s found with id '%.100s'.", what, id)
}

var (
	errUnauthorized = errorf(http.StatusUnauthorized, wire.TypeAuthentication, "invalid_api_key", "",
		"Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.")
	errAdminUnauthorized = errorf(http.StatusUnauthorized, wire.TypeAuthentication, "invalid_admin_token", "",
		"Incorrect or missing admin token. Send it as 'Authorization: Bearer <token>'.")
)

// unavailableRetryAfter is the Retry-After of a request refused while Redis
// or the database cannot serve: long enough for a Sentinel failover or a
// restart to end, short enough that a client's retry finds it back soon
// after.
const unavailableRetryAfter = 5 * time.Second

// errDatabaseUnavailable refuses a request while the database cannot serve
// (store.ErrUnavailable): it ends by itself, so the client is told to retry,
// not that llmq failed. What the request needed from the database was not
// had, so it did not run.
var errDatabaseUnavailable = &Error{Status: http.StatusServiceUnavailable, Type: wire.TypeUnavailable,
	Code: "database_unavailable", RetryAfter: unavailableRetryAfter,
	Message: "The database is unavailable, so the request was not run. Retry in a few seconds."}

// errQueueStoreUnavailable refuses a request while Redis cannot serve.
// Admission needs Redis: a tenant's daily budget reservation and its API
// rate windows live there, and a job accepted without them could overspend
// a budget. So the request is refused before any job row is written and
// before anything is reserved, and the client retries, rather than being
// accepted into Postgres alone.
var errQueueStoreUnavailable = &Error{Status: http.StatusServiceUnavailable, Type: wire.TypeUnavailable,
	Code: "queue_store_unavailable", RetryAfter: unavailableRetryAfter,
	Message: "The queue store (Redis) is unavailable, so the request was not run and nothing was charged. Retry in a few seconds."}

// queueStoreDown reports whether err says Redis cannot serve now
// (redisfail.Unavailable). The database's connection errors look the same
// (a refused dial, a reset, a timeout): the store gives those
// store.ErrUnavailable, which writeError tests first, and pgx's own error
// types are ruled out here too, so a Postgres outage is never blamed on
// Redis.
func queueStoreDown(err error) bool {
	if !redisfail.Unavailable(err) {
		return false
	}
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var pgconnErr interface{ SafeToRetry() bool } // every other error pgconn makes
	return !errors.As(err, &pgErr) && !errors.As(err, &connectErr) && !errors.As(err, &pgconnErr)
}

// writeError writes err to the client. An *Error is written as it is; an
// error that says the database or Redis cannot serve now is the 503
// errDatabaseUnavailable or errQueueStoreUnavailable; any other error is an
// internal failure: logged, and answered with a generic 500 that leaks
// nothing (no stack, no driver message, no secret).
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	var e *Error
	if !errors.As(err, &e) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			e = errorf(http.StatusRequestEntityTooLarge, wire.TypeInvalidRequest, "request_too_large", "",
				"Request body is larger than the limit of %d bytes.", mbe.Limit)
		} else if errors.Is(err, store.ErrUnavailable) {
			// Logged once per request the outage refuses, as Redis's.
			logger.WarnContext(r.Context(), "request refused: database unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
			e = errDatabaseUnavailable
		} else if queueStoreDown(err) {
			// Logged once per request the outage refuses: how long it
			// lasted shows in the log.
			logger.WarnContext(r.Context(), "request refused: redis unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
			e = errQueueStoreUnavailable
		} else if errors.Is(err, store.ErrInvalidValue) {
			// The backstop of the checks that name the param: logged, as
			// each one is a check to add.
			logger.WarnContext(r.Context(), "request refused by the database", "method", r.Method, "path", r.URL.Path, "err", err)
			e = errorf(http.StatusBadRequest, wire.TypeInvalidRequest, "invalid_value", "",
				"The request holds a value that cannot be stored (such as a NUL character or text that is not UTF-8).")
		} else {
			logger.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			e = errorf(http.StatusInternalServerError, wire.TypeServer, "internal_error", "",
				"The server had an error while processing your request. Retry later.")
		}
	}
	wire.WriteError(w, &wire.Error{StatusCode: e.Status, RetryAfter: e.RetryAfter, ErrorObject: e.object()})
}

// object is e's error object, as the body carries it.
func (e *Error) object() wire.ErrorObject {
	return wire.ErrorObject{Message: e.Message, Type: e.Type, Code: e.Code, Param: e.Param}
}

// writeJSON writes v as the response body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}
