// Package scheduler releases the jobs waiting in the fair queue into asynq's
// queues, per model only as fast as the room its routes have (pacer.Room),
// so jobs for a model at its limits neither hold up other models nor spin
// through the workers. One process leads at a time; every dispatcher and
// worker runs a Scheduler, so one takes over when the leader stops.
package scheduler

import (
	"cmp"
	"context"
	_ "embed" // the leadership's scripts
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/pacer"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/rkeys"
)

// Observer is told what the scheduler releases, for metrics.
type Observer interface {
	// Released reports a job that waited d in the fair queue at priority q.
	Released(priority string, d time.Duration)
}

type nopObserver struct{}

func (nopObserver) Released(string, time.Duration) {}

// Options tune a Scheduler: none is settable, its pace is the constants
// below. The zero value is the one to pass.
type Options struct{}

const (
	tick = 10 * time.Millisecond // how often the leader looks at the scopes with waiting jobs
	// lookahead is how much of the limits' refill a release counts on: jobs
	// are released this long before the limiter has room for them, so a
	// worker has one in hand when it does.
	lookahead      = time.Second
	maxOutstanding = 256             // a scope's jobs released and not yet started
	leadershipTTL  = 5 * time.Second // how long the leadership lives unrenewed
	// staleAfter is how long a released job may stay unstarted before its
	// task is enqueued again (the leader stopped between taking it and
	// enqueueing it).
	staleAfter = 30 * time.Second
)

// Deps are what a Scheduler works with; Logger and Observer may be nil.
type Deps struct {
	Queue    *queue.Client
	Pacer    *pacer.Pacer
	Policy   *config.PolicyHolder
	Redis    redis.UniversalClient
	Keys     rkeys.Builder
	Logger   *slog.Logger
	Observer Observer
}

// Scheduler releases waiting jobs while it leads the installation.
type Scheduler struct {
	d  Deps
	id string // this process's value of the leadership key
}

// New returns a Scheduler.
func New(d Deps, _ Options) (*Scheduler, error) {
	d.Logger = cmp.Or(d.Logger, slog.New(slog.DiscardHandler))
	if d.Observer == nil {
		d.Observer = nopObserver{}
	}
	return &Scheduler{d: d, id: strconv.FormatUint(rand.Uint64(), 36)}, nil
}

// The leadership's scripts: renew it, or take it when nobody leads; give it
// up if this process leads.
var (
	//go:embed leadership_renew.lua
	renewLua    string
	renewScript = redis.NewScript(renewLua)
	//go:embed leadership_release.lua
	resignLua    string
	resignScript = redis.NewScript(resignLua)
)

// Run schedules until ctx ends: it takes the leadership when nobody leads
// and, while it leads, releases jobs every tick. It resigns on return.
func (s *Scheduler) Run(ctx context.Context) {
	leadership := s.d.Keys.Lock("scheduler")
	defer func() {
		_ = resignScript.Run(context.WithoutCancel(ctx), s.d.Redis, []string{leadership}, s.id).Err()
	}()
	var renewed time.Time
	leader := false
	lastStale := time.Now()
	for {
		if time.Since(renewed) >= leadershipTTL/5 || !leader {
			ok, err := renewScript.Run(ctx, s.d.Redis, []string{leadership}, s.id, leadershipTTL.Milliseconds()).Bool()
			if err != nil && ctx.Err() == nil {
				s.d.Logger.Warn("scheduler: leadership", "err", err)
			}
			if ok && !leader {
				s.d.Logger.Debug("scheduler: leading")
			}
			leader, renewed = ok && err == nil, time.Now()
		}
		if leader {
			stale := time.Since(lastStale) >= staleAfter/3
			if stale {
				lastStale = time.Now()
			}
			if err := s.Tick(ctx, stale); err != nil && ctx.Err() == nil {
				s.d.Logger.Warn("scheduler: release", "err", err)
			}
		}
		wait := tick
		if !leader {
			wait = leadershipTTL / 5
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Tick releases, for every scope with waiting jobs, those its limits have
// room for; with stale, it first enqueues again the tasks of jobs released
// long ago and never started.
func (s *Scheduler) Tick(ctx context.Context, stale bool) error {
	scopes, err := s.d.Queue.Scopes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, scope := range scopes {
		if stale {
			if _, err := s.d.Queue.RequeueStale(ctx, scope, staleAfter); err != nil {
				errs = append(errs, err)
			}
		}
		room, err := s.room(ctx, scope)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		released, _, err := s.d.Queue.Release(ctx, scope, room)
		for _, r := range released {
			s.d.Observer.Released(r.Priority, r.Waited)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// room is what the routes of the fair queue scope's model admit now and
// within lookahead: the sum of each deployment's room, or, when every
// deployment is paused, the sum of its fallbacks' (where its jobs go then).
// A queue no model of the policy names any more releases everything: its
// workers fail the jobs, saying so.
func (s *Scheduler) room(ctx context.Context, scope string) (queue.Room, error) {
	p := s.d.Policy.Current()
	i := slices.IndexFunc(p.Models, func(m config.Model) bool { return m.Queue() == scope })
	if i < 0 {
		return queue.Room{Tokens: math.Inf(1), Requests: math.Inf(1), MaxOutstanding: maxOutstanding}, nil
	}
	m := &p.Models[i]
	room, paused, err := s.sumRoom(ctx, m.Routes())
	if err != nil || !paused {
		return room, err
	}
	fallbacks := admission.FallbackRoutes(p, m.Fallbacks)
	if len(fallbacks) == 0 {
		return room, nil
	}
	room, _, err = s.sumRoom(ctx, fallbacks)
	return room, err
}

// sumRoom is the room of routes together; paused when every one is.
func (s *Scheduler) sumRoom(ctx context.Context, routes []config.Route) (room queue.Room, paused bool, err error) {
	room, paused = queue.Room{MaxOutstanding: maxOutstanding}, true
	for i, r := range routes {
		rr, err := s.d.Pacer.Room(ctx, r, lookahead)
		if err != nil {
			return room, false, err
		}
		if i == 0 {
			room.Factor = rr.Factor
		}
		room.Tokens += rr.Tokens
		room.Requests += rr.Requests
		room.Force = room.Force || rr.Force
		paused = paused && rr.Paused
	}
	return room, paused, nil
}
