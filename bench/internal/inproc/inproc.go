// Package inproc runs the parts of an llmq that a benchmark starts in its
// own process, as the dispatcher and the worker run them: the app over a
// schema, Redis namespace and policy of its own (open.go), the API on a
// loopback listener, the dispatcher's background loops, a worker server.
package inproc

import (
	"context"
	"net"
	"sync"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/worker"
)

// ServeAPI serves a's API, with the dispatcher's HTTP server and limits, on
// a loopback port the system picks, and returns its root URL
// (http://127.0.0.1:port) and what closes the server.
func ServeAPI(a *app.App) (url string, closeAPI func(), err error) {
	srv, err := a.API()
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := api.NewHTTPServer(srv, api.ServerOptions{})
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = hs.Close() }, nil
}

// Loops runs each of loops, a dispatcher's background work (an app's
// Scheduler().Run, Batches.Run, Offload.Run), in a goroutine of its own, and
// returns what stops them: it cancels their context and waits until every
// one has returned.
func Loops(loops ...func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range loops {
		wg.Go(func() { run(ctx) })
	}
	return func() { cancel(); wg.Wait() }
}

// StartWorker starts a worker server of a (its asynq servers, at the
// environment's concurrency), every task it runs passed through mws first,
// and returns what shuts it down.
func StartWorker(a *app.App, mws ...asynq.MiddlewareFunc) (shutdown func(), err error) {
	srv, mux, err := a.WorkerServer(worker.Options{})
	if err != nil {
		return nil, err
	}
	mux.Use(mws...)
	if err := srv.Start(mux); err != nil {
		return nil, err
	}
	return srv.Shutdown, nil
}
