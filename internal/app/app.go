// Package app assembles llmq's parts from its configuration — Redis, the
// store, the policy, limiters, budgets, queues and providers — so that the
// dispatcher, the worker and the embedded default are built the same way.
package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/pacer"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/recovery"
	"github.com/llmq/llmq/internal/redisconn"
	"github.com/llmq/llmq/internal/retention"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/scheduler"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/webhook"
	"github.com/llmq/llmq/internal/worker"
)

// App is one process's set of llmq parts.
type App struct {
	Env    *config.Env
	Logger *slog.Logger
	Policy *config.PolicyHolder

	Redis redis.UniversalClient
	Store *store.DB
	Keys  rkeys.Builder

	Limiter    *limiter.TokenBucket
	APILimiter *limiter.Windows
	Budgets    *budget.Budgets
	Admission  *admission.Estimator

	Inspector *queue.Inspector
	Queue     *queue.Client
	Providers *worker.Providers
	Batches   *batch.Service
	Offload   *offload.Offloader
	// Observer and APIObserver receive the workers' and the API's events.
	Observer    worker.Observer
	APIObserver api.Observer

	Pacer *pacer.Pacer

	clock    func() time.Time
	keyCache *api.KeyCache
	closers  []func() error
	spacer   *limiter.Spacer // paces webhook deliveries
}

// Parts lets callers supply parts instead of having Open build them.
type Parts struct {
	// Redis replaces the client made from Env.RedisURL.
	Redis redis.UniversalClient
	// Policy replaces the holder made from Env.Policy.
	Policy *config.PolicyHolder
	// LookupEnv reads provider API keys. Defaults to os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Migrate applies the pending schema migrations before the store
	// opens; without it a schema not this binary's stops Open.
	Migrate bool
	// Clock replaces Redis TIME for budget days and the API's timestamps.
	Clock func() time.Time
	// SingleQueue leaves the fair queue out (bench/fairshare's baseline).
	SingleQueue bool
	// Offload tunes the offloader (tests poll the provider faster).
	Offload offload.Options
}

// Open connects to Redis and the store (applying migrations), loads the
// policy and builds every part. Close releases them.
func Open(ctx context.Context, env *config.Env, logger *slog.Logger, parts Parts) (a *App, err error) {
	a = &App{Env: env, Logger: logger, Keys: rkeys.New(env.KeyPrefix), clock: parts.Clock}
	built := a
	defer func() {
		if err != nil {
			built.Close()
		}
	}()
	if parts.LookupEnv == nil {
		parts.LookupEnv = os.LookupEnv
	}
	parts.LookupEnv = config.SecretLookup(parts.LookupEnv)

	a.Policy = parts.Policy
	if a.Policy == nil {
		if a.Policy, err = config.NewPolicyHolder(env.Policy, nil); err != nil {
			return nil, err
		}
	}

	a.Redis = parts.Redis
	if a.Redis == nil {
		opt, err := redisconn.Parse(env.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("LLMQ_REDIS_URL: %w", err)
		}
		a.Redis = opt.NewClient()
		a.closers = append(a.closers, a.Redis.Close)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.Redis.Ping(pingCtx).Err(); err != nil {
		return nil, fmt.Errorf("redis does not answer (LLMQ_REDIS_URL): %w", err)
	}

	openStore := store.Open
	if parts.Migrate {
		openStore = store.OpenMigrated
	}
	if a.Store, err = openStore(ctx, env.DatabaseURL, logger); err != nil {
		return nil, fmt.Errorf("open store (LLMQ_DATABASE_URL): %w", err)
	}
	a.closers = append(a.closers, a.Store.Close)

	if a.Limiter, err = limiter.NewTokenBucket(a.Redis, limiter.Options{Keys: a.Keys, HoldInFlight: true}); err != nil {
		return nil, err
	}
	if a.APILimiter, err = limiter.NewWindows(a.Redis, limiter.Options{Keys: a.Keys, Clock: parts.Clock}); err != nil {
		return nil, err
	}
	// Deliveries are sent in real time, even under a test clock.
	if a.spacer, err = limiter.NewSpacer(a.Redis, limiter.Options{Keys: a.Keys}); err != nil {
		return nil, err
	}
	if a.Budgets, err = budget.New(a.Redis, a.Store, budget.Options{Keys: a.Keys, Logger: logger, Clock: parts.Clock, Observer: appObserver{a}}); err != nil {
		return nil, err
	}
	if a.Pacer, err = pacer.New(a.Limiter, a.Redis, a.Keys, logger, appObserver{a}, pacer.Options{FaultPause: a.Env.FaultPause}); err != nil {
		return nil, err
	}
	a.Admission = admission.New(a.Pacer, a.Store)

	ac := asynq.NewClientFromRedisClient(a.Redis)
	a.closers = append(a.closers, ac.Close)
	ns := queue.Namespace(env.QueueNamespace)
	qo := queue.ClientOptions{Namespace: ns, Redis: a.Redis, Keys: a.Keys}
	if parts.SingleQueue {
		qo.Redis = nil
	}
	a.Queue = queue.NewClient(ac, qo)
	a.Inspector = queue.NewInspector(asynq.NewInspectorFromRedisClient(a.Redis), ns)
	a.Providers = worker.NewProviders(a.Policy.Current(), parts.LookupEnv)
	stop := a.Policy.OnChange(func(_, p *config.Policy) { a.Providers.Update(p) })
	a.closers = append(a.closers, func() error { stop(); return nil })

	a.Offload = offload.New(offload.Deps{Store: a.Store, Policy: a.Policy, Budgets: a.Budgets, Queue: a.Queue, Providers: a.Providers,
		Redis: a.Redis, Keys: a.Keys, Logger: logger}, parts.Offload)
	a.Batches = batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Admission: a.Admission, Queue: a.Queue,
		Offload: a.Offload, Logger: logger}, batch.Options{})
	a.closers = append(a.closers, a.Batches.Close)
	return a, nil
}

// Close releases everything Open made, in reverse order.
func (a *App) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		_ = a.closers[i]()
	}
	a.closers = nil
}

// Purger applies the current policy's retention to the store.
func (a *App) Purger() *retention.Purger {
	return &retention.Purger{Store: a.Store, Logger: a.Logger,
		Retention: func() config.Retention { return a.Policy.Current().Retention }}
}

// ReadyChecks are what /readyz asks, by name: Redis and the store.
func (a *App) ReadyChecks() []api.ReadyCheck {
	return []api.ReadyCheck{
		{Name: "redis", Check: func(ctx context.Context) error { return a.Redis.Ping(ctx).Err() }},
		{Name: "database", Check: a.Store.Ping},
	}
}

// API returns the HTTP API over the app's parts. The first call subscribes
// the app's key cache to key changes; if Redis refuses, the API reads the
// store for every key.
func (a *App) API() (*api.Server, error) {
	if a.keyCache == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		kc, err := api.NewKeyCache(ctx, a.Redis, a.Keys.KeyChanges(), api.KeyCacheOptions{Now: a.clock, Logger: a.Logger})
		cancel()
		if err != nil {
			a.Logger.Warn("key cache off: every request reads its key from the store", "err", err)
		} else {
			a.keyCache = kc
			a.closers = append(a.closers, kc.Close)
		}
	}
	proxies, _ := a.Env.TrustedProxyPrefixes()
	srv, err := api.New(api.Deps{
		Store: a.Store, Policy: a.Policy, Admission: a.Admission, Budgets: a.Budgets, Queue: a.Queue,
		APILimiter: a.APILimiter, Logger: a.Logger, ReadyChecks: a.ReadyChecks(), Observer: a.APIObserver, KeyCache: a.keyCache,
	}, api.Options{AdminToken: a.Env.AdminToken, AdminTokenPrevious: a.Env.AdminTokenPrevious, MaxBodyBytes: a.Env.MaxBodyBytes, WebhookAllowPrivate: a.Env.WebhookAllowPrivate,
		Now: a.clock, TrustedProxies: proxies})
	if err != nil {
		return nil, err
	}
	srv.EnableBatches(a.Batches, api.BatchOptions{MaxFileBytes: a.Env.MaxFileBytes, MaxFileLines: a.Env.MaxFileLines})
	h, err := a.JobHandler(worker.Options{})
	if err != nil {
		return nil, err
	}
	srv.EnableSync(h, api.SyncOptions{MaxWait: a.Env.SyncMaxWait})
	return srv, nil
}

// Reconciler returns the reconciler of the app's parts.
func (a *App) Reconciler(opts recovery.Options) *recovery.Reconciler {
	return recovery.New(recovery.Reconciler{
		Store: a.Store, Redis: a.Redis, Keys: a.Keys, Queue: a.Queue, Inspector: a.Inspector,
		Limiter: a.Limiter, Policy: a.Policy, Budgets: a.Budgets, Logger: a.Logger,
	}, opts)
}

// appObserver tells the pacer's and the budget's events to the app's
// Observer, set after Open.
type appObserver struct{ a *App }

func (o appObserver) Penalized(model string, d time.Duration) {
	if o.a.Observer != nil {
		o.a.Observer.Penalized(model, d)
	}
}

func (o appObserver) LimitsLearned(model string, rpm, tpm int64) {
	if o.a.Observer != nil {
		o.a.Observer.LimitsLearned(model, rpm, tpm)
	}
}

func (o appObserver) UnpredictedRateLimit(model string, buckets []string) {
	if o.a.Observer != nil {
		o.a.Observer.UnpredictedRateLimit(model, buckets)
	}
}

func (o appObserver) ShortWindowRateLimit(model string, buckets []string) {
	if o.a.Observer != nil {
		o.a.Observer.ShortWindowRateLimit(model, buckets)
	}
}

func (o appObserver) BudgetRaised(reason string, added money.Micros) {
	if obs, ok := o.a.Observer.(budget.Observer); ok { // the metrics recorder is one
		obs.BudgetRaised(reason, added)
	}
}

// JobHandler returns the handler of job tasks.
func (a *App) JobHandler(opts worker.Options) (*worker.Handler, error) {
	if opts.Now == nil {
		opts.Now = a.clock
	}
	return worker.NewHandler(worker.Deps{
		Store: a.Store, Policy: a.Policy, Pacer: a.Pacer, Budgets: a.Budgets,
		Providers: a.Providers, Queue: a.Queue, Logger: a.Logger, Observer: a.Observer,
	}, opts), nil
}

// Scheduler returns the scheduler of the app's parts.
func (a *App) Scheduler() *scheduler.Scheduler {
	obs, _ := a.Observer.(scheduler.Observer) // the metrics recorder is one
	s, err := scheduler.New(scheduler.Deps{Queue: a.Queue, Pacer: a.Pacer, Policy: a.Policy, Redis: a.Redis, Keys: a.Keys,
		Logger: a.Logger, Observer: obs}, scheduler.Options{})
	if err != nil {
		panic(err) // the options are code
	}
	return s
}

// WorkerServer returns the asynq servers that run jobs, and their mux.
func (a *App) WorkerServer(opts worker.Options) (*worker.Server, *asynq.ServeMux, error) {
	if opts.Heartbeat == nil {
		opts.Heartbeat = worker.NewHeartbeat(a.Store, a.Logger)
	}
	h, err := a.JobHandler(opts)
	if err != nil {
		return nil, nil, err
	}
	srv := worker.NewServer(a.Redis, worker.ServerOptions{
		Concurrency: a.Env.WorkerConcurrency, WebhookConcurrency: a.Env.WebhookConcurrency,
		Namespace: queue.Namespace(a.Env.QueueNamespace), ShutdownTimeout: a.Env.ShutdownTimeout, Logger: a.Logger,
		Heartbeat: opts.Heartbeat,
	})
	obs, _ := a.Observer.(webhook.Observer) // the metrics recorder is one
	wh := webhook.NewHandler(webhook.Deps{Store: a.Store, Logger: a.Logger, Observer: obs, Spacer: a.spacer, Policy: a.Policy},
		webhook.Options{AllowPrivate: a.Env.WebhookAllowPrivate})
	return srv, worker.Mux(h, wh), nil
}

// LoadEnv reads and validates the LLMQ_* environment for role and builds the
// process logger, warning of unknown LLMQ_* variables.
func LoadEnv(environ []string, role config.Role, stderr io.Writer) (*config.Env, *slog.Logger, error) {
	env, err := config.LoadEnv(environ)
	if err != nil {
		return nil, nil, err
	}
	if err := env.Validate(role); err != nil {
		return nil, nil, err
	}
	logger := env.Logger(stderr)
	for _, v := range env.Unrecognized {
		logger.Warn("unknown environment variable ignored", "var", v)
	}
	return env, logger, nil
}

// LookupIn returns an os.LookupEnv over environ.
func LookupIn(environ []string) func(string) (string, bool) {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}
