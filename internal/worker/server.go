package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/queue"
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
	config := func(concurrency int, queues map[string]int, poll, delayed time.Duration) asynq.Config {
		return asynq.Config{
			Concurrency:              concurrency,
			Queues:                   queues,
			IsFailure:                queue.IsFailure,
			RetryDelayFunc:           queue.RetryDelay,
			ShutdownTimeout:          opts.ShutdownTimeout,
			TaskCheckInterval:        poll,
			DelayedTaskCheckInterval: delayed,
			Logger:                   asynqLogger{opts.Logger},
			LogLevel:                 asynq.WarnLevel,
		}
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
		s.servers = append(s.servers, asynq.NewServerFromRedisClient(rdb,
			config(n, map[string]int{opts.Namespace.Queue(queue.Jobs): 1}, poll, delayed)))
	}
	// A delivery starts within minDelayedCheck of its task; its retries
	// wait seconds anyway, so they are moved at the backstop's pace.
	s.servers = append(s.servers, asynq.NewServerFromRedisClient(rdb, config(opts.WebhookConcurrency,
		map[string]int{opts.Namespace.Queue(queue.Webhooks): 1}, max(opts.PollInterval, minDelayedCheck), max(opts.PollInterval, backstopDelayedCheck))))
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
