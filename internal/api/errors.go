package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/redisfail"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

func notFound(what, id string) *wire.Error {
	return wire.Errorf(http.StatusNotFound, wire.TypeNotFound, client.CodeNotFound, "", "No %s found with id '%.100s'.", what, id)
}

// missingAs is err, or the 404 of a missing what when the store found
// nothing.
func missingAs(err error, what, id string) error {
	if errors.Is(err, store.ErrNotFound) {
		return notFound(what, id)
	}
	return err
}

var (
	errUnauthorized = wire.Errorf(http.StatusUnauthorized, wire.TypeAuthentication, client.CodeInvalidAPIKey, "",
		"Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.")
	errAnthropicUnauthorized = wire.Errorf(http.StatusUnauthorized, wire.TypeAuthentication, client.CodeInvalidAPIKey, "",
		"Incorrect or missing API key. Send it as 'x-api-key: <key>' or 'Authorization: Bearer <key>'.")
	errAdminUnauthorized = wire.Errorf(http.StatusUnauthorized, wire.TypeAuthentication, client.CodeInvalidAdminToken, "",
		"Incorrect or missing admin token. Send it as 'Authorization: Bearer <token>'.")
)

// unavailableRetryAfter is long enough for a Sentinel failover or a restart
// to end, short enough that a client's retry finds the service back soon.
const unavailableRetryAfter = 5 * time.Second

// The 503s of an outage: the request did not run, nothing was charged, and
// the client retries. A request is never accepted into Postgres alone while
// Redis is down: its budget reservation and API windows live there.
var (
	errDatabaseUnavailable = &wire.Error{Status: http.StatusServiceUnavailable, Type: wire.TypeUnavailable,
		Code: client.CodeDatabaseUnavailable, RetryAfter: unavailableRetryAfter,
		Message: "The database is unavailable, so the request was not run. Retry in a few seconds."}
	errQueueStoreUnavailable = &wire.Error{Status: http.StatusServiceUnavailable, Type: wire.TypeUnavailable,
		Code: client.CodeQueueStoreUnavailable, RetryAfter: unavailableRetryAfter,
		Message: "The queue store (Redis) is unavailable, so the request was not run and nothing was charged. Retry in a few seconds."}
)

// queueStoreDown reports whether err says Redis cannot serve now. pgx's
// connection errors look the same (a refused dial, a reset), so they are
// ruled out: a Postgres outage is never blamed on Redis.
func queueStoreDown(err error) bool {
	if !redisfail.Unavailable(err) {
		return false
	}
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var pgconnErr interface{ SafeToRetry() bool } // every other error pgconn makes
	return !errors.As(err, &pgErr) && !errors.As(err, &connectErr) && !errors.As(err, &pgconnErr)
}

// writeError writes err to the client by write (wire.WriteError, or
// Anthropic's shape on its path): a *wire.Error as it is, an outage as its
// 503, any other error as a generic 500 that leaks nothing, logged.
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error, write func(http.ResponseWriter, *wire.Error)) {
	var e *wire.Error
	var mbe *http.MaxBytesError
	level, logged := slog.LevelWarn, ""
	switch {
	case errors.As(err, &e):
	case errors.As(err, &mbe):
		e = wire.Errorf(http.StatusRequestEntityTooLarge, wire.TypeInvalidRequest, client.CodeRequestTooLarge, "",
			"Request body is larger than the limit of %d bytes.", mbe.Limit)
	case errors.Is(err, store.ErrUnavailable):
		logged, e = "request refused: database unavailable", errDatabaseUnavailable
	case queueStoreDown(err):
		logged, e = "request refused: redis unavailable", errQueueStoreUnavailable
	case errors.Is(err, store.ErrInvalidValue):
		// The backstop of the checks that name the param: each one
		// logged is a check to add.
		logged, e = "request refused by the database", wire.Invalid("", client.CodeInvalidValue,
			"The request holds a value that cannot be stored (such as a NUL character or text that is not UTF-8).")
	default:
		level, logged = slog.LevelError, "request failed"
		e = wire.Errorf(http.StatusInternalServerError, wire.TypeServer, client.CodeInternalError, "",
			"The server had an error while processing your request. Retry later.")
	}
	if logged != "" {
		logger.Log(r.Context(), level, logged, "method", r.Method, "path", r.URL.Path, "err", err)
	}
	write(w, e)
}

// writeJSON answers v with status, ending a handler.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, _ := json.Marshal(v)
	return writeRaw(w, status, append(b, '\n'))
}

// writeOK answers v with 200, ending a handler.
func writeOK(w http.ResponseWriter, v any) error { return writeJSON(w, http.StatusOK, v) }

// writeRaw answers body, a JSON text, with status, ending a handler.
func writeRaw(w http.ResponseWriter, status int, body []byte) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return nil
}

// writeList answers a page of items, each rendered by render, in the list
// shape whose cursors are the ids id returns.
func writeList[S, T any](w http.ResponseWriter, items []S, more bool, render func(S) T, id func(T) string) error {
	out := make([]T, len(items))
	for i, it := range items {
		out[i] = render(it)
	}
	return writeOK(w, client.NewList(out, more, id))
}
