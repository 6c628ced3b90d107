// Package dashboard serves what operators look at, behind the admin token:
// /dashboard, a server-rendered page of buckets, budgets, batches, queues
// and the last hour's charts; /monitoring/, the asynq monitor (asynqmon);
// and /metrics, the process's Prometheus registry.
package dashboard

import (
	"cmp"
	"context"
	"embed"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	asynqmetrics "github.com/hibiken/asynq/x/metrics"
	"github.com/hibiken/asynqmon"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/redisconn"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Options configure the pages.
type Options struct {
	// Refresh is how often the dashboard reloads itself. Defaults to 10s.
	Refresh time.Duration
}

// The rows shown at most.
const (
	maxTenantRows = 50
	maxBatchRows  = 20
)

// Server serves the dashboard of a dispatcher's app.
type Server struct {
	a       *app.App
	state   *metrics.State
	refresh time.Duration
	isAdmin func(*http.Request) bool
	page    *template.Template
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// admin lets through requests with the admin token (a bearer token, or the
// basic-auth password a browser resends by itself), refuses cross-site
// requests, and forbids framing the pages.
func (s *Server) admin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.isAdmin(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="llmq", charset="UTF-8"`)
			http.Error(w, "401 Unauthorized: log in with the admin token as the password (any user name).", http.StatusUnauthorized)
			return
		}
		if api.IsCrossSite(r) {
			http.Error(w, "403 Forbidden: cross-site request refused; open llmq's pages from llmq itself.", http.StatusForbidden)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "frame-ancestors 'none'")
		h.ServeHTTP(w, r)
	})
}

// MountApp builds the dashboard, the monitor and /metrics of a dispatcher
// over app a, registers the scrape-time collectors in rec, and mounts them
// beside the API of srv: /dashboard, /monitoring/ (unless LLMQ_REDIS_URL is
// empty) and /metrics. The returned Closer releases asynqmon's Redis
// connections.
func MountApp(srv *api.Server, a *app.App, rec *metrics.Recorder, o Options) (io.Closer, error) {
	// Never closed: the app closes the client it shares.
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	ns := queue.Namespace(a.Env.QueueNamespace)
	st := metrics.NewState(metrics.StateDeps{
		Policy: a.Policy, Limiter: a.Limiter, Budgets: a.Budgets, Store: a.Store, Asynq: in, Namespace: ns,
		Scope: a.Pacer.Scope, Queue: a.Queue,
	}, metrics.StateOptions{})
	if err := rec.Register(st.Collector(), asynqmetrics.NewQueueMetricsCollector(in)); err != nil {
		return nil, fmt.Errorf("register collectors: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := queue.RegisterQueues(ctx, a.Redis, ns); err != nil {
		return nil, fmt.Errorf("register queues: %w", err)
	}
	page, err := template.New("dashboard.html").Funcs(funcs).ParseFS(templateFS, "templates/dashboard.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: parse template: %w", err)
	}
	s := &Server{a: a, state: st, refresh: cmp.Or(o.Refresh, 10*time.Second), isAdmin: srv.IsAdmin, page: page}
	assets, _ := fs.Sub(assetFS, "assets") // a valid path: cannot fail
	mux := srv.Mux()
	mux.Handle("GET /dashboard", s.admin(http.HandlerFunc(s.serveDashboard)))
	mux.Handle("GET /dashboard/", s.admin(http.RedirectHandler("/dashboard", http.StatusFound)))
	mux.Handle("GET /dashboard/assets/", s.admin(http.StripPrefix("/dashboard/assets/", http.FileServerFS(assets))))
	// Every tenant's spend: admins only here; Prometheus scrapes
	// LLMQ_METRICS_ADDR.
	mux.Handle("GET /metrics", s.admin(rec.Handler()))
	if a.Env.RedisURL == "" {
		return nopCloser{}, nil
	}
	opt, err := redisconn.Parse(a.Env.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("LLMQ_REDIS_URL: %w", err)
	}
	// ReadOnly refuses every request but GET, so nobody deletes or reruns
	// tasks behind the store's back.
	mon := asynqmon.New(asynqmon.Options{RootPath: "/monitoring", RedisConnOpt: opt.AsynqConnOpt(),
		ReadOnly: a.Env.MonitoringReadOnly})
	mux.Handle("/monitoring/", s.admin(mon))
	mux.Handle("GET /monitoring", s.admin(http.RedirectHandler("/monitoring/", http.StatusMovedPermanently)))
	return mon, nil
}
