package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/pacer"
)

// router is the routes one run of a job may take: its model's deployments
// in the order this run tries them (by order, then at random by weight),
// then its fallbacks' deployments, and those that failed it on this run.
type router struct {
	primary, fallbacks []config.Route
	failed             map[string]bool
	onFallback         bool // the model's own deployments cannot serve the job
	allDown            bool // every route failed the job for a reason of its deployment
}

// newRouter is the router of a job of m of shape s whose own fallbacks are
// own (none: m's): the routes that can serve s.
func newRouter(p *config.Policy, m *config.Model, own []string, s *admission.Shape) *router {
	rt := &router{primary: ordered(admission.Serving(m.Routes(), s)), failed: map[string]bool{}}
	for _, name := range admission.Fallbacks(m, own) {
		if f, ok := p.Model(name); ok {
			rt.fallbacks = append(rt.fallbacks, ordered(admission.Serving(f.Routes(), s))...)
		}
	}
	return rt
}

// ordered sorts routes by their deployment's order and, among equals, at
// random by weight (Efraimidis and Spirakis's key u^(1/w)).
func ordered(routes []config.Route) []config.Route {
	if len(routes) < 2 {
		return routes
	}
	keys := make(map[string]float64, len(routes))
	for _, r := range routes {
		keys[r.Deployment.Name()] = math.Pow(rand.Float64(), 1/float64(r.Weight))
	}
	slices.SortStableFunc(routes, func(a, b config.Route) int {
		return cmp.Or(cmp.Compare(a.Order, b.Order), cmp.Compare(keys[b.Deployment.Name()], keys[a.Deployment.Name()]))
	})
	return routes
}

// candidates are the routes to try now: the model's deployments that have
// not failed this run, else the fallbacks' that have not.
func (rt *router) candidates() []config.Route {
	if !rt.onFallback {
		if c := rt.usable(rt.primary); len(c) > 0 {
			return c
		}
	}
	return rt.usable(rt.fallbacks)
}

func (rt *router) usable(routes []config.Route) []config.Route {
	return slices.DeleteFunc(slices.Clone(routes), func(r config.Route) bool { return rt.failed[r.Deployment.Name()] })
}

// several reports whether the job has more than one route to move to
// after a fault or a 429.
func (rt *router) several() bool { return len(rt.primary)+len(rt.fallbacks) > 1 }

// fail marks route failed for this run and reports whether another route
// is left to try.
func (rt *router) fail(route config.Route) bool {
	rt.failed[route.Deployment.Name()] = true
	return len(rt.candidates()) > 0
}

// toFallbacks moves the run to its fallbacks, if it has any left.
func (rt *router) toFallbacks() bool {
	if rt.onFallback || len(rt.usable(rt.fallbacks)) == 0 {
		return false
	}
	rt.onFallback = true
	return true
}

// pass is what one pass over a run's routes for a permit found when no
// route granted one.
type pass struct {
	wait        time.Duration // the shortest RetryAfter of the routes asked
	held        *pacer.Call   // the call of that route
	unavailable bool          // every route asked is paused or its breaker open
	tooLarge    error         // every route asked can never hold the cost
}

// reservePass asks each candidate route in order for the job's permit and
// takes the first granted (r.call and r.permit are then set); a permit
// given back (yield) sends the pass on to the next route.
func (r *run) reservePass(ctx context.Context) (granted bool, p pass, err error) {
	p = pass{wait: time.Duration(math.MaxInt64), unavailable: true}
	routes, large := r.routes.candidates(), 0
	for _, route := range routes {
		call := r.h.Pacer.Plan(ctx, route, &r.shape, r.job.EstPromptTokens, r.job.EstMaxTokens)
		res, err := r.h.Pacer.Reserve(ctx, call)
		if errors.Is(err, limiter.ErrCostExceedsCapacity) {
			large++
			p.tooLarge = cmp.Or(p.tooLarge, err)
			continue
		}
		if err != nil {
			return false, p, fmt.Errorf("rate limiter of %s: %w", call.Scope.Name, err)
		}
		if res.Allowed && r.yield(ctx, call.Scope.Name, res) {
			res.Allowed, res.RetryAfter = false, syncYield
		}
		if res.Allowed {
			if ok, wait := r.h.breakers.Allow(call.Scope.Name); !ok {
				if err := r.h.Pacer.Release(ctx, res.Reservation); err != nil {
					r.log.Warn("release rate limit", "err", err)
				}
				res.Allowed, res.RetryAfter, res.Penalized = false, wait, true
			}
		}
		if res.Allowed {
			r.call, r.permit = call, res.Reservation
			return true, p, nil
		}
		if !res.Penalized {
			p.unavailable = false
		}
		if res.RetryAfter < p.wait {
			p.wait, p.held = res.RetryAfter, call
		}
	}
	if large < len(routes) {
		p.tooLarge = nil
	}
	if p.held == nil {
		p.wait = 0
	}
	return false, p, nil
}

// failover decides, after a call on r.call ended with pe (its permit not yet
// settled), whether the run tries another route now instead of counting the
// failure: after a fault or 429 when another route is left, after a
// context-length refusal when the model has fallbacks (a longer context may
// serve it). A faulty deployment is paused for every worker first; a
// provider's overload (Anthropic's 529) is its platform's, not the
// account's, and pauses nothing.
func (r *run) failover(ctx context.Context, pe *llm.Error) bool {
	if ctx.Err() != nil {
		return false
	}
	route := r.call.Route
	switch {
	case pe.Class == llm.ClassPermanent && pe.Code == client.CodeContextLengthExceeded:
		return r.routes.toFallbacks()
	case pe.Class != llm.ClassRetryable && pe.Class != llm.ClassRateLimited || !r.routes.several():
		return false
	}
	if pe.Class == llm.ClassRetryable && !pe.Overloaded() {
		r.h.Pacer.PauseFault(ctx, r.call)
	}
	if !r.routes.fail(route) {
		r.routes.allDown = true
		return false
	}
	r.log.Debug("failing over", "deployment", route.Deployment.Name(), "status", pe.StatusCode, "err", pe.Message)
	r.h.Observer.Failover(route.Model.Name, route.Deployment.Name())
	return true
}
