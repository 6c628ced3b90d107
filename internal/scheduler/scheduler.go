// Package scheduler releases the jobs waiting in the fair queue (see
// internal/queue) into asynq's queues: fairly between tenants (their
// tiers' shares, counted in tokens) and priorities, and per model only as
// fast as the model's rate limits admit them, so asynq's queues stay short,
// a tenant's backlog never holds another's work back, and jobs for a model
// at its limits neither hold up other models nor spin through the workers.
// One process of the installation schedules at a time (a Redis lease);
// every dispatcher and worker runs a Scheduler, so one takes over when the
// holder stops.
package scheduler

import (
	"context"
	_ "embed" // the lease's scripts
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
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

// Options tune a Scheduler. The zero value is ready to use.
type Options struct {
	// Tick is how often the holder looks at the scopes with waiting jobs.
	// Defaults to 10ms.
	Tick time.Duration
	// Lookahead is how much of the limits' refill a release counts on: jobs
	// are released this long before the limiter has room for them, so a
	// worker has one in hand when it does. Defaults to 1s.
	Lookahead time.Duration
	// MaxOutstanding bounds a scope's jobs released and not yet started.
	// Defaults to 256.
	MaxOutstanding int
	// LeaseTTL is how long the holder's lease lives unrenewed; another
	// process takes over within it when the holder stops. Defaults to 5s.
	LeaseTTL time.Duration
	// StaleAfter is how long a released job may stay unstarted before its
	// task is enqueued again (the holder stopped between taking it and
	// enqueueing it). Defaults to 30s.
	StaleAfter time.Duration
}

func (o *Options) validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Tick", o.Tick}, {"Lookahead", o.Lookahead}, {"LeaseTTL", o.LeaseTTL}, {"StaleAfter", o.StaleAfter}} {
		if f.d < 0 {
			return fmt.Errorf("scheduler: Options.%s must not be negative, got %v", f.name, f.d)
		}
	}
	if o.MaxOutstanding < 0 {
		return fmt.Errorf("scheduler: Options.MaxOutstanding must not be negative, got %d", o.MaxOutstanding)
	}
	if o.Tick == 0 {
		o.Tick = 10 * time.Millisecond
	}
	if o.Lookahead == 0 {
		o.Lookahead = time.Second
	}
	if o.MaxOutstanding == 0 {
		o.MaxOutstanding = 256
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 5 * time.Second
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = 30 * time.Second
	}
	return nil
}

// Deps are what a Scheduler works with.
type Deps struct {
	Queue  *queue.Client
	Pacer  *pacer.Pacer
	Policy *config.PolicyHolder
	Redis  redis.UniversalClient
	Keys   rkeys.Builder
	Logger *slog.Logger
	// Observer defaults to none.
	Observer Observer
}

// Scheduler releases waiting jobs while it holds the installation's lease.
type Scheduler struct {
	d  Deps
	o  Options
	id string // this process's lease value
}

// New returns a Scheduler.
func New(d Deps, o Options) (*Scheduler, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if d.Queue == nil || d.Pacer == nil || d.Policy == nil || d.Redis == nil {
		return nil, errors.New("scheduler: Deps.Queue, Pacer, Policy and Redis are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Observer == nil {
		d.Observer = nopObserver{}
	}
	return &Scheduler{d: d, o: o, id: strconv.FormatUint(rand.Uint64(), 36)}, nil
}

// renewScript renews the scheduler's lease if this process holds it, or
// takes it when free (lease_renew.lua).
//
//go:embed lease_renew.lua
var renewLua string
var renewScript = redis.NewScript(renewLua)

// releaseScript gives the lease up if this process holds it
// (lease_release.lua).
//
//go:embed lease_release.lua
var releaseLua string
var releaseScript = redis.NewScript(releaseLua)

// Run schedules until ctx ends: it takes the lease when free and, while it
// holds it, releases jobs every Tick. It gives the lease up on return.
func (s *Scheduler) Run(ctx context.Context) {
	lease := s.d.Keys.Lock("scheduler")
	defer func() {
		_ = releaseScript.Run(context.WithoutCancel(ctx), s.d.Redis, []string{lease}, s.id).Err()
	}()
	var renewed time.Time
	holder := false
	lastStale := time.Now()
	for {
		if time.Since(renewed) >= s.o.LeaseTTL/5 || !holder {
			ok, err := renewScript.Run(ctx, s.d.Redis, []string{lease}, s.id, s.o.LeaseTTL.Milliseconds()).Bool()
			if err != nil && ctx.Err() == nil {
				s.d.Logger.Warn("scheduler: lease", "err", err)
			}
			if ok && !holder {
				s.d.Logger.Debug("scheduler: holding the lease")
			}
			holder, renewed = ok && err == nil, time.Now()
		}
		if holder {
			stale := time.Since(lastStale) >= s.o.StaleAfter/3
			if stale {
				lastStale = time.Now()
			}
			if err := s.Tick(ctx, stale); err != nil && ctx.Err() == nil {
				s.d.Logger.Warn("scheduler: release", "err", err)
			}
		}
		wait := s.o.Tick
		if !holder {
			wait = s.o.LeaseTTL / 5
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// Tick releases, for every scope with waiting jobs, those its limits have
// room for; with stale, it first enqueues again the tasks of jobs released
// long ago and never started. Run calls it; tests call it to step.
func (s *Scheduler) Tick(ctx context.Context, stale bool) error {
	scopes, err := s.d.Queue.Scopes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, scope := range scopes {
		if stale {
			if _, err := s.d.Queue.RequeueStale(ctx, scope, s.o.StaleAfter); err != nil {
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
// within Lookahead: the sum of each deployment's room (routeRoom), or, when
// every deployment is paused, the sum of its fallbacks' (where its jobs go
// then). A queue no model of the policy names any more releases
// everything: its workers fail the jobs, saying so.
func (s *Scheduler) room(ctx context.Context, scope string) (queue.Room, error) {
	p := s.d.Policy.Current()
	m := modelOf(p, scope)
	if m == nil {
		return queue.Room{Tokens: math.Inf(1), Requests: math.Inf(1), MaxOutstanding: s.o.MaxOutstanding}, nil
	}
	room, paused, err := s.sumRoom(ctx, m.Routes())
	if err != nil || !paused {
		return room, err
	}
	var fallbacks []config.Route
	for _, name := range m.Fallbacks {
		if f, ok := p.Model(name); ok {
			fallbacks = append(fallbacks, f.Routes()...)
		}
	}
	if len(fallbacks) == 0 {
		return room, nil
	}
	room, _, err = s.sumRoom(ctx, fallbacks)
	return room, err
}

// sumRoom is the room of routes together; paused is true when every one of
// them is paused.
func (s *Scheduler) sumRoom(ctx context.Context, routes []config.Route) (room queue.Room, paused bool, err error) {
	room, paused = queue.Room{MaxOutstanding: s.o.MaxOutstanding}, true
	for i, r := range routes {
		rr, err := s.routeRoom(ctx, r)
		if err != nil {
			return room, false, err
		}
		if i == 0 {
			room.Factor = rr.Factor
		}
		room.Tokens += rr.Tokens
		room.Requests += rr.Requests
		room.Force = room.Force || rr.Force
		paused = paused && rr.paused
	}
	return room, paused, nil
}

// routeRoom is what one deployment's buckets admit now and within
// Lookahead: the least over its token buckets of what each lets out now
// (what it holds, bounded by its burst) plus its refill in Lookahead, and
// likewise for requests; none while a 429 or a fault pauses it. Room that
// synchronous requests hold is not released to async jobs.
func (s *Scheduler) routeRoom(ctx context.Context, r config.Route) (routeRoom, error) {
	room := routeRoom{Room: queue.Room{Tokens: math.Inf(1), Requests: math.Inf(1)}}
	sc := s.d.Pacer.Scope(ctx, r)
	st, err := s.d.Pacer.Limiter().State(ctx, sc)
	if err != nil {
		return room, err
	}
	room.Factor = s.d.Pacer.Calibration(ctx, sc.Name).Factor
	if st.Penalized {
		room.Tokens, room.Requests, room.paused = 0, 0, true
		return room, nil
	}
	full := true
	for i, b := range st.Buckets {
		lim := sc.Buckets[i]
		now := b.Remaining
		if b.Burst >= 0 {
			now = min(now, b.Burst)
		}
		ahead := float64(now) + float64(lim.Limit)*float64(s.o.Lookahead)/float64(lim.Period)
		if b.Unit == limiter.UnitTokens {
			room.Tokens = min(room.Tokens, ahead)
			full = full && b.Remaining >= lim.Limit/2
		} else {
			room.Requests = min(room.Requests, ahead)
		}
	}
	// A job larger than what the buckets ever hold at once still goes, one
	// at a time, once they are mostly free.
	room.Force = full
	// Synchronous requests waiting for this scope go first: their room is
	// not released to async jobs.
	tokens, requests, err := s.d.Queue.Held(ctx, sc.Name)
	if err != nil {
		return room, err
	}
	if tokens > 0 || requests > 0 {
		room.Tokens, room.Requests = max(room.Tokens-tokens, 0), max(room.Requests-requests, 0)
		room.Force = false
	}
	return room, nil
}

// routeRoom is one deployment's room; paused while a 429 or a fault
// pauses it.
type routeRoom struct {
	queue.Room
	paused bool
}

// modelOf returns the first model of p whose fair queue is scope.
func modelOf(p *config.Policy, scope string) *config.Model {
	for i := range p.Models {
		if p.Models[i].Queue() == scope {
			return &p.Models[i]
		}
	}
	return nil
}
