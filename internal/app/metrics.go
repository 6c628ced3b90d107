package app

import (
	"context"
	"net/http"
	"time"

	"github.com/llmq/llmq/internal/metrics"
)

// MetricsServer is the server of LLMQ_METRICS_ADDR: GET /metrics of h,
// without credentials, for Prometheus on an internal network.
func MetricsServer(h http.Handler) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
}

// StartRecorder makes the process's metrics recorder, sets it as the
// observer of the app's API and workers (before any worker is built) and
// runs it past ctx's end, so the jobs finishing in the shutdown grace
// period are counted. stop flushes it: call it before the app closes Redis.
func (a *App) StartRecorder(ctx context.Context) (rec *metrics.Recorder, stop func(), err error) {
	rec = metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, Logger: a.Logger})
	a.Observer, a.APIObserver = rec, rec
	for _, c := range a.ReadyChecks() {
		if err := rec.WatchReady(c.Name, c.Check); err != nil {
			return nil, nil, err
		}
	}
	return rec, Background(ctx, rec.Run), nil
}

// Background runs run past ctx's end, until the stop it returns is called.
func Background(ctx context.Context, run func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { run(ctx); close(done) }()
	return func() { cancel(); <-done }
}
