package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/loop"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// ServerOptions configure the asynq servers that run jobs and deliver
// webhooks.
type ServerOptions struct {
	// Concurrency is how many jobs run at once, over all the dequeuers.
	// Defaults to 50.
	Concurrency int
	// Dequeuers is how many asynq servers share Concurrency, each with its
	// own dequeue loop: asynq's processor takes one task at a time, so one
	// loop bounds how fast tasks start. At most Concurrency. Defaults to
	// one per 16 of Concurrency, at least one.
	Dequeuers int
	// WebhookConcurrency is how many webhook deliveries run at once, in a
	// server of their own, so a slow receiver never holds a job's slot.
	// Defaults to 10.
	WebhookConcurrency int
	// Namespace prefixes queue names. Defaults to none.
	Namespace queue.Namespace
	// ShutdownTimeout is the grace period in-flight calls get on SIGTERM;
	// unfinished jobs then go back to their queue. Defaults to 30s.
	ShutdownTimeout time.Duration
	// PollInterval is how often the first job dequeuer looks for new tasks
	// when idle (asynq's default, 1s, adds latency); the others poll at
	// asynq's defaults, a backstop that costs Redis little. Defaults to 50ms.
	PollInterval time.Duration
	// Logger receives asynq's log lines (warn and above). Defaults to none.
	Logger *slog.Logger
	// Heartbeat is the handler's Options.Heartbeat: Start starts it,
	// Shutdown ends it after the last job. Defaults to none.
	Heartbeat *Heartbeat
}

// Server is the asynq servers of one worker process, started and stopped
// together: Concurrency split between Dequeuers of them for the jobs queue,
// and one for the webhooks queue.
type Server struct {
	servers       []*asynq.Server // the job dequeuers, then the webhook server
	jobs          int             // how many of servers are job dequeuers
	heartbeat     *Heartbeat
	stopHeartbeat func()
}

const (
	// How often a dequeuer other than the first looks for new tasks when
	// idle and moves due delayed tasks (asynq's defaults).
	backstopTaskCheck    = time.Second
	backstopDelayedCheck = 5 * time.Second
	// minDelayedCheck is the shortest interval at which the first dequeuer
	// moves due delayed tasks, and the webhook server looks for deliveries.
	minDelayedCheck = 200 * time.Millisecond
)

// NewServer returns the asynq servers over rdb configured for llmq: the jobs
// queue, a webhook server apart, 429s and waits that are not failures, short
// polling. Run it with Mux. The caller keeps ownership of rdb.
func NewServer(rdb redis.UniversalClient, opts ServerOptions) *Server {
	opts.Concurrency = cmp.Or(opts.Concurrency, 50)
	opts.Dequeuers = min(cmp.Or(opts.Dequeuers, max(1, opts.Concurrency/16)), opts.Concurrency)
	opts.WebhookConcurrency = cmp.Or(opts.WebhookConcurrency, 10)
	opts.ShutdownTimeout = cmp.Or(opts.ShutdownTimeout, 30*time.Second)
	opts.PollInterval = cmp.Or(opts.PollInterval, 50*time.Millisecond)
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	s := &Server{jobs: opts.Dequeuers, heartbeat: opts.Heartbeat}
	add := func(concurrency int, q string, poll, delayed time.Duration) {
		s.servers = append(s.servers, asynq.NewServerFromRedisClient(rdb, asynq.Config{
			Concurrency:              concurrency,
			Queues:                   map[string]int{opts.Namespace.Queue(q): 1},
			IsFailure:                queue.IsFailure,
			RetryDelayFunc:           queue.RetryDelay,
			ShutdownTimeout:          opts.ShutdownTimeout,
			TaskCheckInterval:        poll,
			DelayedTaskCheckInterval: delayed,
			Logger:                   asynqLogger{opts.Logger},
			LogLevel:                 asynq.WarnLevel,
		}))
	}
	for i := range opts.Dequeuers {
		// Concurrency spread as evenly as it divides: 50 over 3 is 17, 17, 16.
		n := opts.Concurrency / opts.Dequeuers
		if i < opts.Concurrency%opts.Dequeuers {
			n++
		}
		poll, delayed := opts.PollInterval, max(opts.PollInterval, minDelayedCheck)
		if i > 0 {
			poll, delayed = max(poll, backstopTaskCheck), max(delayed, backstopDelayedCheck)
		}
		add(n, queue.Jobs, poll, delayed)
	}
	// A delivery starts within minDelayedCheck of its task; its retries
	// wait seconds anyway, so they are moved at the backstop's pace.
	add(opts.WebhookConcurrency, queue.Webhooks, max(opts.PollInterval, minDelayedCheck),
		max(opts.PollInterval, backstopDelayedCheck))
	return s
}

// Dequeuers is how many asynq servers s runs for the jobs queue (the
// webhook server aside).
func (s *Server) Dequeuers() int { return s.jobs }

// Start starts every dequeuer with handler h. Should one fail to start, the
// ones started are shut down and the error returned.
func (s *Server) Start(h asynq.Handler) error {
	if s.heartbeat != nil {
		stop, err := s.heartbeat.Start(context.Background())
		if err != nil {
			return err
		}
		s.stopHeartbeat = stop
	}
	for i, srv := range s.servers {
		if err := srv.Start(h); err != nil {
			for _, started := range s.servers[:i] {
				started.Shutdown()
			}
			s.endHeartbeat()
			return err
		}
	}
	return nil
}

// Shutdown stops every dequeuer, in parallel, each giving its in-flight
// jobs the grace period (asynq's Shutdown).
func (s *Server) Shutdown() {
	var wg sync.WaitGroup
	for _, srv := range s.servers {
		wg.Go(srv.Shutdown)
	}
	wg.Wait()
	s.endHeartbeat()
}

// endHeartbeat removes the worker from the store once no job runs here.
func (s *Server) endHeartbeat() {
	if s.stopHeartbeat != nil {
		s.stopHeartbeat()
		s.stopHeartbeat = nil
	}
}

// Stop makes every dequeuer stop taking new tasks (asynq's Stop); Shutdown
// then ends them.
func (s *Server) Stop() {
	for _, srv := range s.servers {
		srv.Stop()
	}
}

// Mux routes llmq's task types to their handlers.
func Mux(jobs, webhooks asynq.Handler) *asynq.ServeMux {
	mux := asynq.NewServeMux()
	mux.Handle(queue.TypeJob, jobs)
	mux.Handle(queue.TypeWebhook, webhooks)
	return mux
}

// asynqLogger sends asynq's log lines to slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) log(level slog.Level, args []any) {
	a.l.Log(context.Background(), level, "asynq: "+fmt.Sprint(args...))
}

func (a asynqLogger) Debug(args ...any) { a.log(slog.LevelDebug, args) }
func (a asynqLogger) Info(args ...any)  { a.log(slog.LevelInfo, args) }
func (a asynqLogger) Warn(args ...any)  { a.log(slog.LevelWarn, args) }
func (a asynqLogger) Error(args ...any) { a.log(slog.LevelError, args) }
func (a asynqLogger) Fatal(args ...any) {
	a.log(slog.LevelError, args)
	os.Exit(1)
}

// Heartbeat is a worker process's presence in the store, which the jobs it
// starts name: the reconciler hands a process's running jobs on once
// store.WorkerDeadAfter passed without a beat (asynq's own recovery takes a
// minute or more). A process whose beats fail starts no provider call once
// its last beat is half that old, so no job handed off still starts here.
type Heartbeat struct {
	id     string
	store  *store.DB
	logger *slog.Logger
	last   atomic.Int64 // unix nanoseconds of the last beat the store took
}

// NewHeartbeat returns the heartbeat of this process, named after its host,
// pid and a random part (a restarted process is a new worker).
func NewHeartbeat(db *store.DB, logger *slog.Logger) *Heartbeat {
	host, _ := os.Hostname()
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	return &Heartbeat{id: fmt.Sprintf("%s:%d:%s", host, os.Getpid(), ids.New("w")), store: db, logger: logger}
}

// ID is the worker's id in the store; "" for none.
func (hb *Heartbeat) ID() string {
	if hb == nil {
		return ""
	}
	return hb.id
}

// Beat records one beat.
func (hb *Heartbeat) Beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, store.WorkerBeatInterval)
	defer cancel()
	at := time.Now()
	if err := hb.store.WorkerBeat(ctx, hb.id); err != nil {
		return err
	}
	hb.last.Store(at.UnixNano())
	return nil
}

// Fresh reports whether the store took a beat recently enough that no
// reconciler can have taken this process for dead; none (nil) always is.
func (hb *Heartbeat) Fresh() bool {
	if hb == nil {
		return true
	}
	return time.Since(time.Unix(0, hb.last.Load())) < store.WorkerDeadAfter/2
}

// Start beats once (so the process starts only with a heartbeat) and then
// every store.WorkerBeatInterval until the returned stop is called, which
// removes the worker from the store: its jobs, if any, are handed on at
// once.
func (hb *Heartbeat) Start(ctx context.Context) (stop func(), err error) {
	if err := hb.Beat(ctx); err != nil {
		return nil, fmt.Errorf("worker heartbeat: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop.Every(ctx, store.WorkerBeatInterval, false, hb.Beat, hb.logger, "worker heartbeat: beat failed")
	}()
	return func() {
		cancel()
		<-done
		gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer gcancel()
		if err := hb.store.WorkerGone(gctx, hb.id); err != nil {
			hb.logger.Warn("worker heartbeat: remove", "err", err)
		}
	}, nil
}

// Providers holds one llm.Provider per provider of the policy in force and
// rebuilds them when the policy changes. Provider API keys are read from the
// environment variable each provider names.
type Providers struct {
	mu        sync.RWMutex
	byName    map[string]llm.Provider
	digest    string
	lookupEnv func(string) (string, bool)
}

// NewProviders returns the providers of p. lookupEnv reads API keys
// (os.LookupEnv in production).
func NewProviders(p *config.Policy, lookupEnv func(string) (string, bool)) *Providers {
	ps := &Providers{lookupEnv: lookupEnv}
	ps.Update(p)
	return ps
}

// Update rebuilds the providers when p differs from the policy they were
// built from.
func (ps *Providers) Update(p *config.Policy) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.byName != nil && p.Digest != "" && p.Digest == ps.digest {
		return
	}
	m := make(map[string]llm.Provider, len(p.Providers))
	for _, cp := range p.Providers {
		key := ""
		if cp.APIKeyEnv != "" {
			key, _ = ps.lookupEnv(cp.APIKeyEnv)
		}
		if cp.Kind == config.ProviderAnthropic {
			m[cp.Name] = llm.NewAnthropic(llm.AnthropicConfig{Name: cp.Name, BaseURL: cp.BaseURL, APIKey: key, Version: cp.APIVersion,
				Timeout: cp.Timeout, MaxResponseBytes: cp.MaxResponseBytes})
			continue
		}
		m[cp.Name] = llm.NewOpenAI(llm.OpenAIConfig{Name: cp.Name, BaseURL: cp.BaseURL, APIKey: key, Timeout: cp.Timeout,
			MaxResponseBytes: cp.MaxResponseBytes, Azure: cp.Kind == config.ProviderAzure, APIVersion: cp.APIVersion})
	}
	ps.byName, ps.digest = m, p.Digest
}

// Get returns the provider named name.
func (ps *Providers) Get(name string) (llm.Provider, bool) {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	p, ok := ps.byName[name]
	return p, ok
}
