// Package api serves llmq's HTTP API: jobs, files and batches (OpenAI's
// shapes), usage, the admin API for tenants and keys, and health checks. It
// owns authentication (tenant keys, stored hashed; the admin token) with
// its limit of failures per client address, the per-key API limits (a
// tier's windows and endpoint limits) with their X-RateLimit-* headers,
// request size limits, and the one error shape every handler answers with.
package api

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/coalesce"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Deps are what the API works with.
type Deps struct {
	Store     *store.DB
	Policy    *config.PolicyHolder
	Admission *admission.Estimator
	Budgets   *budget.Budgets
	Queue     *queue.Client
	// APILimiter enforces each key's tier api_limits and the per-address
	// limit of failed authentications. Nil turns both off.
	APILimiter *limiter.Windows
	Logger     *slog.Logger
	// ReadyChecks are the services /readyz asks, each named in its answer.
	ReadyChecks []ReadyCheck
	Observer    Observer // nil: none
	// KeyCache keeps authenticated keys, and is told of the admin API's
	// changes to keys and tenants. Nil reads the store at every request.
	KeyCache *KeyCache
}

// Observer is told of the jobs the API creates ("queued") and cancels
// ("cancelled"), for metrics.
type Observer interface {
	JobState(tier, model, status string)
}

type nopObserver struct{}

func (nopObserver) JobState(string, string, string) {}

// Options configure the API.
type Options struct {
	// AdminToken guards /admin/; empty disables the admin API.
	AdminToken string
	// AdminTokenPrevious is accepted too, during a rotation.
	AdminTokenPrevious string
	// MaxBodyBytes caps JSON request bodies (LLMQ_MAX_BODY_BYTES, at least 1).
	MaxBodyBytes int64
	// WebhookAllowPrivate accepts webhook URLs whose host is an internal
	// address (LLMQ_WEBHOOK_ALLOW_PRIVATE).
	WebhookAllowPrivate bool
	Now                 func() time.Time // defaults to time.Now
	// TrustedProxies are the proxies whose X-Forwarded-For names the client
	// (LLMQ_TRUSTED_PROXIES).
	TrustedProxies []netip.Prefix
}

// Server is the HTTP API.
type Server struct {
	Deps
	opts   Options
	mux    *http.ServeMux
	leases leases
	// counts is shared by a key's concurrent requests (rateLimit).
	counts    coalesce.Group[windowKey, windowCount]
	authFails authFailures
}

// New returns the API server, or an error naming a readiness check that
// is invalid.
func New(d Deps, opts Options) (*Server, error) {
	if err := validateReadyChecks(d.ReadyChecks); err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	d.Logger = cmp.Or(d.Logger, slog.New(slog.DiscardHandler))
	d.Observer = cmp.Or[Observer](d.Observer, nopObserver{})
	s := &Server{Deps: d, opts: opts, mux: http.NewServeMux()}
	s.routes()
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Mux returns the router, so the dispatcher can mount more handlers
// (dashboard, metrics, monitoring) beside the API.
func (s *Server) Mux() *http.ServeMux { return s.mux }

// handlerFunc is a handler whose error plain writes.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) routes() {
	t := s.tenantRoute
	s.mux.Handle("POST /v1/jobs", t("jobs.create", s.createJob))
	s.mux.Handle("GET /v1/jobs", t("jobs.list", s.listJobs))
	s.mux.Handle("GET /v1/jobs/{id}", t("jobs.retrieve", s.getJob))
	s.mux.Handle("DELETE /v1/jobs/{id}", t("jobs.cancel", s.cancelJob))
	s.mux.Handle("GET /v1/usage", t("usage.retrieve", s.usage))

	a := s.adminRoute
	s.mux.Handle("POST /admin/v1/tenants", a(s.createTenant))
	s.mux.Handle("GET /admin/v1/tenants", a(s.listTenants))
	s.mux.Handle("GET /admin/v1/tenants/{id}", a(s.getTenant))
	s.mux.Handle("PATCH /admin/v1/tenants/{id}", a(s.updateTenant))
	s.mux.Handle("POST /admin/v1/tenants/{id}/keys", a(s.createKey))
	s.mux.Handle("POST /admin/v1/tenants/{id}/webhook_secret/rotate", a(s.rotateWebhookSecret))
	s.mux.Handle("GET /admin/v1/tenants/{id}/keys", a(s.listKeys))
	s.mux.Handle("PATCH /admin/v1/keys/{id}", a(s.updateKey))
	s.mux.Handle("DELETE /admin/v1/keys/{id}", a(s.revokeKey))
	s.mux.Handle("GET /admin/v1/usage", a(s.adminUsage))
	s.mux.Handle("GET /admin/v1/retention", a(s.adminRetention))

	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_ = writeOK(w, map[string]string{"status": "ok"})
	})
	s.mux.Handle("GET /readyz", s.plain(s.readyz))
	// Unknown API paths are a JSON 404; under /admin/ only for the admin,
	// so that without the token no path says whether it exists.
	unknownURL := func(w http.ResponseWriter, r *http.Request) error {
		return wire.Errorf(http.StatusNotFound, wire.TypeNotFound, client.CodeUnknownURL, "", "Unknown request URL: %s %s.", r.Method, r.URL.Path)
	}
	s.mux.Handle("/v1/", s.plain(unknownURL))
	s.mux.Handle("/admin/", a(unknownURL))
}

// ReadyCheck is one service /readyz asks whether it answers: Check returns
// nil when it does, within readyTimeout; Name is its field in the answer.
type ReadyCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// validateReadyChecks refuses a check without a name or a function, or
// whose name another check or a field of the answer has.
func validateReadyChecks(checks []ReadyCheck) error {
	seen := map[string]bool{"status": true, "error": true}
	for i, c := range checks {
		switch {
		case c.Name == "" || c.Check == nil:
			return fmt.Errorf("api: Deps.ReadyChecks[%d] needs a Name and a Check", i)
		case seen[c.Name]:
			return fmt.Errorf("api: Deps.ReadyChecks[%d].Name %q is taken by another check or by a field of /readyz's answer", i, c.Name)
		}
		seen[c.Name] = true
	}
	return nil
}

// readyTimeout bounds each check of /readyz: a server that does not answer
// in that time is not ready, whatever it would say later.
const readyTimeout = 2 * time.Second

// readyz answers 200 when every service answers, else 503 with the error
// and each service's state ("ok" or its NotReadyReason). The checks run at
// once: one that hangs delays the answer by readyTimeout at most.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	errs := make([]error, len(s.ReadyChecks))
	var wg sync.WaitGroup
	for i, c := range s.ReadyChecks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			errs[i] = c.Check(ctx)
		})
	}
	wg.Wait()
	body := map[string]any{"status": "ready"}
	var why []string
	for i, c := range s.ReadyChecks {
		body[c.Name] = "ok"
		if errs[i] != nil {
			reason := NotReadyReason(errs[i])
			body[c.Name] = reason
			why = append(why, c.Name+": "+reason)
			s.Logger.WarnContext(r.Context(), "not ready", "service", c.Name, "err", errs[i])
		}
	}
	if len(why) == 0 {
		return writeOK(w, body)
	}
	body["status"] = "unavailable"
	body["error"] = wire.Errorf(http.StatusServiceUnavailable, wire.TypeUnavailable, client.CodeNotReady, "",
		"Not ready: %s.", strings.Join(why, "; ")).Object()
	return writeJSON(w, http.StatusServiceUnavailable, body)
}

// NotReadyReason says why a service did not answer in words of a fixed
// set, so /readyz, which anyone may ask, shows no address, user name or
// password: the errors of drivers and dials name them.
func NotReadyReason(err error) string {
	var netErr net.Error
	var dnsErr *net.DNSError
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return fmt.Sprintf("no answer within %v", readyTimeout)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &dnsErr):
		return "host name not found"
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case redis.IsLoadingError(err):
		return "loading its data"
	case redis.IsReadOnlyError(err):
		return "read-only replica (a failover is under way)"
	case redis.IsClusterDownError(err):
		return "cluster down"
	case redis.IsMasterDownError(err):
		return "replica without its master"
	case redis.IsTryAgainError(err):
		return "busy, try again"
	case redis.IsMaxClientsError(err):
		return "too many clients"
	case redis.IsAuthError(err):
		return "authentication refused"
	case errors.Is(err, redis.ErrPoolTimeout):
		return "no free connection"
	case errors.As(err, &pgErr):
		return "refused, SQLSTATE " + pgErr.Code
	}
	return "error (see the log)"
}

// plain adapts a handlerFunc without authentication. The store classifies
// errors first, so a value the database refuses is a 400.
func (s *Server) plain(h handlerFunc) http.Handler { return s.plainAs(openAIWay, h) }

// plainAs is plain writing errors api's way.
func (s *Server) plainAs(api tenantAPI, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			writeError(w, r, s.Logger, s.Store.Classify(err), api.write)
		}
	})
}

// tenantAPI is the way of the API a tenant route serves: where it reads
// the key and how it writes errors.
type tenantAPI struct {
	key          func(*http.Request) string
	unauthorized *wire.Error
	write        func(http.ResponseWriter, *wire.Error)
}

var (
	// openAIWay is llmq's own and OpenAI's: a bearer token, OpenAI's errors.
	openAIWay = tenantAPI{bearer, errUnauthorized, wire.WriteError}
	// anthropicWay is Anthropic's, whose SDKs send the key as x-api-key or
	// a bearer token and read errors in Anthropic's shape.
	anthropicWay = tenantAPI{func(r *http.Request) string { return cmp.Or(strings.TrimSpace(r.Header.Get("x-api-key")), bearer(r)) },
		errAnthropicUnauthorized, wire.WriteAnthropicError}
)

// caller is the authenticated tenant of a request, with its budget
// account and today's spend as of the request.
type caller struct {
	key    *store.APIKey
	tenant *store.Tenant
	// policy is the one snapshot the whole request is judged by.
	policy *config.Policy
	acct   budget.Account
	tier   *config.Tier
	budget *budget.Decision // nil when the budget engine is not configured
}

// budgetHeaders sets X-Budget-Remaining on every tenant response (dollars
// left today, or "unlimited") and X-Budget-Warning once spend and
// reservations pass the tier's soft limit.
func (s *Server) budgetHeaders(ctx context.Context, h http.Header, c *caller) error {
	if s.Budgets == nil {
		return nil
	}
	d, err := s.Budgets.Status(ctx, c.acct)
	if err != nil {
		return err
	}
	c.budget = d
	if d.Unlimited {
		h.Set("X-Budget-Remaining", "unlimited")
		return nil
	}
	h.Set("X-Budget-Remaining", d.Remaining.String())
	if d.SoftLimitReached {
		h.Set("X-Budget-Warning", fmt.Sprintf("soft limit reached: $%s spent and $%s reserved of the $%s daily budget (soft limit %.0f%%)",
			d.Spent, d.Reserved, d.Budget, c.acct.SoftLimit*100))
	}
	return nil
}

type callerKey struct{}

func callerOf(r *http.Request) *caller { c, _ := r.Context().Value(callerKey{}).(*caller); return c }

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// tenantRoute authenticates a tenant key (a missing or wrong one counts
// against the client address's failures), applies the key's API rate limit
// and sets the budget headers on every response, a refused one included,
// then runs h. endpoint is the route's name in a tier's api_endpoint_limits
// (config.APIEndpoints); empty for a route no tier limits on its own.
func (s *Server) tenantRoute(endpoint string, h handlerFunc) http.Handler {
	return s.tenantRouteAs(openAIWay, endpoint, h)
}

// tenantRouteAs is tenantRoute serving api's way.
func (s *Server) tenantRouteAs(api tenantAPI, endpoint string, h handlerFunc) http.Handler {
	return s.plainAs(api, func(w http.ResponseWriter, r *http.Request) error {
		token := api.key(r)
		if token == "" || len(token) > 200 {
			return s.authFailed(w, r, api.unauthorized)
		}
		sum := sha256.Sum256([]byte(token))
		// The lookup was by hash; compare again in constant time so no code
		// path depends on how much of the hash matched.
		key, tenant, err := s.authenticate(r.Context(), sum)
		if errors.Is(err, store.ErrNotFound) || err == nil && subtle.ConstantTimeCompare(key.Hash, sum[:]) != 1 {
			return s.authFailed(w, r, api.unauthorized)
		}
		if err != nil {
			return err
		}
		// The API limit and the budget's status are independent Redis
		// reads: they go at once, each into headers of its own.
		c := &caller{key: key, tenant: tenant, policy: s.Policy.Current()}
		if c.acct, c.tier, err = admission.Account(c.policy, tenant); err != nil {
			return err
		}
		var limited error
		limitHeaders, budgetHeaders := http.Header{}, http.Header{}
		var steps sync.WaitGroup
		steps.Go(func() { limited = s.rateLimit(r.Context(), limitHeaders, endpoint, c) })
		budgetErr := s.budgetHeaders(r.Context(), budgetHeaders, c)
		steps.Wait()
		maps.Copy(w.Header(), limitHeaders)
		maps.Copy(w.Header(), budgetHeaders)
		if err := cmp.Or(limited, budgetErr); err != nil {
			return err
		}
		return h(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// authenticate returns the unrevoked key whose hash is sum and its tenant,
// from the key cache or else the store.
func (s *Server) authenticate(ctx context.Context, sum [32]byte) (*store.APIKey, *store.Tenant, error) {
	if s.KeyCache == nil {
		return s.Store.APIKeyGetByHash(ctx, sum[:])
	}
	key, tenant, gen, ok := s.KeyCache.get(sum)
	if ok {
		return key, tenant, nil
	}
	key, tenant, err := s.Store.APIKeyGetByHash(ctx, sum[:])
	if err == nil {
		s.KeyCache.put(sum, key, tenant, gen)
	}
	return key, tenant, err
}

// keysChanged tells every dispatcher's key cache that a key or a tenant
// changed. The change is committed already: a failed announcement is
// logged, and the other caches forget the entry within their TTL.
func (s *Server) keysChanged(ctx context.Context) {
	if s.KeyCache == nil {
		return
	}
	if err := s.KeyCache.Changed(ctx); err != nil {
		s.Logger.Error("key cache: change not announced; other dispatchers see it within the cache's TTL", "err", err)
	}
}

// adminRoute checks the admin token (counting failures per client address)
// and refuses what a browser sends from another site and a write whose body
// is not declared JSON (a bodiless POST or DELETE needs no type), then runs h.
//
// The admin token works as the password of basic auth, which a browser
// sends by itself once the operator has logged in to the dashboard: any
// page the operator opens could make the browser send requests with it. No
// plain form or cross-site fetch can send JSON without a CORS preflight,
// which llmq never grants.
func (s *Server) adminRoute(h handlerFunc) http.Handler {
	return s.plain(func(w http.ResponseWriter, r *http.Request) error {
		if !s.IsAdmin(r) {
			return s.authFailed(w, r, errAdminUnauthorized)
		}
		if IsCrossSite(r) {
			return errCrossSite
		}
		ct, hasBody := r.Header.Get("Content-Type"), r.ContentLength != 0 || len(r.TransferEncoding) > 0
		if mt, _, err := mime.ParseMediaType(ct); hasBody && !readOnly(r) && (err != nil || mt != "application/json") {
			return wire.Errorf(http.StatusUnsupportedMediaType, wire.TypeInvalidRequest, client.CodeUnsupportedMediaType, "Content-Type",
				"Admin requests with a body must be JSON: send 'Content-Type: application/json' (got '%.100s').", ct)
		}
		return h(w, r)
	})
}

// IsAdmin reports whether r carries the admin token. The dispatcher uses it
// to guard the dashboard and monitoring UI too.
func (s *Server) IsAdmin(r *http.Request) bool {
	token := bearer(r)
	if token == "" {
		// Browsers reach the dashboard with basic auth (any user name).
		_, token, _ = r.BasicAuth()
	}
	if s.opts.AdminToken == "" || token == "" {
		return false
	}
	// Both are compared, so the time taken says nothing of which matched.
	a := sha256.Sum256([]byte(token))
	cur := sha256.Sum256([]byte(s.opts.AdminToken))
	ok := subtle.ConstantTimeCompare(a[:], cur[:])
	if s.opts.AdminTokenPrevious != "" {
		prev := sha256.Sum256([]byte(s.opts.AdminTokenPrevious))
		ok |= subtle.ConstantTimeCompare(a[:], prev[:])
	}
	return ok == 1
}

var errCrossSite = wire.Errorf(http.StatusForbidden, wire.TypePermission, client.CodeCrossSiteRequest, "",
	"Cross-site request refused: the admin API, the dashboard and the monitor answer requests from their own pages and from programs, not from other sites' pages.")

// IsCrossSite reports whether a browser sent r for a page of another site
// (or another origin of the same site). A top-level navigation that only
// reads (a link to the dashboard in a runbook) is not refused. Requests
// that are not a browser's (curl, Prometheus, the Go client) carry neither
// header and pass.
func IsCrossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return false
	case "":
		// A browser too old to send Sec-Fetch-Site still sends Origin on
		// cross-origin writes.
	default: // cross-site, same-site, or a value no browser sends
		dest := r.Header.Get("Sec-Fetch-Dest")
		return !(readOnly(r) && r.Header.Get("Sec-Fetch-Mode") == "navigate" && (dest == "document" || dest == ""))
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return true // "null": a sandboxed frame, a file, a redirect across origins
	}
	return !strings.EqualFold(u.Host, r.Host)
}

func readOnly(r *http.Request) bool {
	return r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions
}
