package app

import (
	"net/http"
	"time"
)

// MetricsServer is the server of LLMQ_METRICS_ADDR: GET /metrics of h,
// without credentials, for Prometheus on an internal network.
func MetricsServer(h http.Handler) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
}
