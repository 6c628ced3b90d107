package api

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/wire"
)

// ServerOptions are the connection limits of the HTTP server in front of the
// API. There is no global ReadTimeout or WriteTimeout: a body may take as
// long as it keeps arriving at BodyMinRate, and each response gets its own
// write deadline, which a streaming route moves as it writes.
type ServerOptions struct {
	// ReadHeaderTimeout bounds reading a request's headers. Defaults to 10s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that waits this long for
	// its next request. Defaults to 60s.
	IdleTimeout time.Duration
	// WriteTimeout bounds writing a response, counted from the end of the
	// request's body (from its headers when it has none). A streaming route
	// gets it per write instead (streamTo). Defaults to 60s.
	WriteTimeout time.Duration
	// BodyMinRate is the slowest average a request body may arrive at, in
	// bytes per second, once BodyGrace has passed. Defaults to 1024.
	BodyMinRate int64
	// BodyGrace is how long a body may take before BodyMinRate counts (a
	// client may start sending late). Defaults to 10s.
	BodyGrace time.Duration
	// BodyStall is the longest a body may pause, however far ahead of
	// BodyMinRate it was. Defaults to 30s.
	BodyStall time.Duration
}

func (o *ServerOptions) withDefaults() {
	o.ReadHeaderTimeout = cmp.Or(o.ReadHeaderTimeout, 10*time.Second)
	o.IdleTimeout = cmp.Or(o.IdleTimeout, 60*time.Second)
	o.WriteTimeout = cmp.Or(o.WriteTimeout, 60*time.Second)
	o.BodyMinRate = cmp.Or(o.BodyMinRate, 1024)
	o.BodyGrace = cmp.Or(o.BodyGrace, 10*time.Second)
	o.BodyStall = cmp.Or(o.BodyStall, 30*time.Second)
}

// NewHTTPServer returns the http.Server that serves h with o's limits
// (zero fields take their defaults).
func NewHTTPServer(h http.Handler, o ServerOptions) *http.Server {
	o.withDefaults()
	return &http.Server{
		Handler:           o.deadlines(h),
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

type serverOptionsKey struct{}

// deadlines sets each request's read and write deadlines through
// http.ResponseController, so that a route can set its own.
func (o ServerOptions) deadlines(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		start := time.Now()
		_ = rc.SetWriteDeadline(start.Add(o.WriteTimeout))
		if r.Body != nil && r.Body != http.NoBody {
			b := &rateBody{body: r.Body, rc: rc, o: &o, start: start}
			// Bounds a body the handler never reads, which the server
			// still drains after the handler to keep the connection.
			b.setDeadlines()
			r.Body = b
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), serverOptionsKey{}, &o)))
	})
}

// errSlowBody is the answer to a body that arrives below the minimum rate.
var errSlowBody = wire.Errorf(http.StatusRequestTimeout, wire.TypeInvalidRequest, client.CodeRequestTimeout, "",
	"The request body arrived too slowly and was cut off; send it faster or retry.")

// rateBody is a request body that must keep arriving at BodyMinRate: before
// each read the connection's read deadline is moved to when the next byte
// is due at that rate (and at most BodyStall away), and the write deadline
// to WriteTimeout after it.
type rateBody struct {
	body  io.ReadCloser
	rc    *http.ResponseController
	o     *ServerOptions
	start time.Time
	n     int64
	done  bool
}

func (b *rateBody) setDeadlines() {
	due := b.start.Add(b.o.BodyGrace + time.Duration(float64(b.n+1)/float64(b.o.BodyMinRate)*float64(time.Second)))
	if stall := time.Now().Add(b.o.BodyStall); due.After(stall) {
		due = stall
	}
	_ = b.rc.SetReadDeadline(due)
	_ = b.rc.SetWriteDeadline(due.Add(b.o.WriteTimeout))
}

func (b *rateBody) Read(p []byte) (int, error) {
	if b.done {
		return b.body.Read(p)
	}
	b.setDeadlines()
	n, err := b.body.Read(p)
	b.n += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		// The whole body is in: no read deadline may cut the request
		// while its handler works, and the response has WriteTimeout.
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
		_ = b.rc.SetWriteDeadline(time.Now().Add(b.o.WriteTimeout))
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = errSlowBody
	}
	return n, err
}

func (b *rateBody) Close() error { return b.body.Close() }

// streamTo returns the writer of a streamed response: each write gets
// WriteTimeout of its own, so a long download to a client that keeps
// reading is not cut. Without the server's deadlines it is w itself.
func streamTo(w http.ResponseWriter, r *http.Request) io.Writer {
	o, ok := r.Context().Value(serverOptionsKey{}).(*ServerOptions)
	if !ok {
		return w
	}
	return &streamWriter{w: w, rc: http.NewResponseController(w), timeout: o.WriteTimeout}
}

type streamWriter struct {
	w       io.Writer
	rc      *http.ResponseController
	timeout time.Duration
}

func (s *streamWriter) Write(p []byte) (int, error) {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	return s.w.Write(p)
}
