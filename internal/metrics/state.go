package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"golang.org/x/sync/errgroup"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// StateDeps are what State reads.
type StateDeps struct {
	Policy  *config.PolicyHolder
	Limiter *limiter.TokenBucket
	Budgets *budget.Budgets
	Store   *store.DB
	// Asynq lists the worker servers; nil leaves the worker count out.
	Asynq     *asynq.Inspector
	Namespace queue.Namespace
	// Queue reads the fair queues. Defaults to nil: no waiting jobs shown.
	Queue *queue.Client
	// Scope is a route's limiter scope as the workers take permits from it.
	// Defaults to admission.Scope.
	Scope func(ctx context.Context, r config.Route) limiter.Scope
}

// StateOptions configure State.
type StateOptions struct {
	// MaxTenants caps the tenants whose budgets are read per refresh (newest
	// first): each is one Redis script run, and llmq_budget_* carries one
	// series per tenant read. Past the cap, llmq_budget_tenants_truncated is
	// 1. Defaults to 1000.
	MaxTenants int
}

const (
	// stateCacheTTL is how long a read is reused, so a dashboard refresh
	// and every Prometheus replica's scrape cost one read.
	stateCacheTTL = 5 * time.Second
	// budgetReaders is how many budget reads run at once.
	budgetReaders = 8
)

// State reads what llmq's shared state holds now — bucket levels, tenants'
// budgets, live workers — for the scrape (Collector) and the dashboard. It
// is safe for concurrent use.
type State struct {
	d    StateDeps
	o    StateOptions
	mods cached[[]ModelLevel]
	wait cached[[]Waiting]
	tens cached[*Tenants]
	wrks cached[int]
}

// NewState returns a State over d.
func NewState(d StateDeps, o StateOptions) *State {
	o.MaxTenants = cmp.Or(o.MaxTenants, 1000)
	return &State{d: d, o: o}
}

// cached holds one read for stateCacheTTL; concurrent callers wait for the
// read in progress.
type cached[T any] struct {
	mu  sync.Mutex
	at  time.Time
	val T
}

func (c *cached[T]) get(read func() (T, error)) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < stateCacheTTL {
		return c.val, nil
	}
	v, err := read()
	if err != nil {
		var zero T
		return zero, err
	}
	c.val, c.at = v, time.Now()
	return v, nil
}

// ModelLevel is the state of one model's rate-limit buckets.
type ModelLevel struct {
	Model   string
	Scope   string // the limiter scope
	Buckets []limiter.BucketState
	// Paused is set while a 429's penalty or a fault's pause holds the
	// deployment; PausedFor is how long it still does.
	Paused    bool
	PausedFor time.Duration
	// Learned is what the buckets learned from the provider's answers; nil
	// when it could not be read.
	Learned *limiter.ScopeLearning
}

// Models returns the bucket levels of every deployment of every model of
// the policy (one row each), in the policy's order.
func (s *State) Models(ctx context.Context) ([]ModelLevel, error) {
	return s.mods.get(func() ([]ModelLevel, error) {
		p := s.d.Policy.Current()
		type read struct {
			res     *limiter.Result
			learned *limiter.ScopeLearning
		}
		byScope := map[string]read{}
		out := make([]ModelLevel, 0, len(p.Models))
		for i := range p.Models {
			for _, m := range p.Models[i].Routes() {
				sc := admission.Scope(m)
				if s.d.Scope != nil {
					sc = s.d.Scope(ctx, m)
				}
				rd, ok := byScope[sc.Name]
				if !ok {
					var err error
					if rd.res, err = s.d.Limiter.State(ctx, sc); err != nil {
						return nil, fmt.Errorf("limiter state of model %s: %w", m.Model.Name, err)
					}
					rd.learned, _ = s.d.Limiter.Inspect(ctx, sc)
					byScope[sc.Name] = rd
				}
				ml := ModelLevel{Model: m.Model.Name, Scope: sc.Name, Buckets: rd.res.Buckets, Paused: rd.res.Penalized,
					Learned: rd.learned}
				if ml.Paused {
					ml.PausedFor = rd.res.RetryAfter
				}
				out = append(out, ml)
			}
		}
		return out, nil
	})
}

// TenantBudget is one tenant's budget day so far, as budget.Status read it.
type TenantBudget struct {
	ID, Name, Tier string
	budget.Decision
	// SoftMark is the soft limit in dollars (SoftLimit × Budget); 0 when off.
	SoftMark money.Micros
	// Exhausted is set when the tenant's own cap denies new work.
	Exhausted bool
}

// Used is the fraction of the budget spent or reserved; 0 when unlimited.
func (t *TenantBudget) Used() float64 {
	if t.Unlimited || t.Budget <= 0 {
		return 0
	}
	return float64(t.Spent+t.Reserved) / float64(t.Budget)
}

// Tenants is a read of tenants' budgets.
type Tenants struct {
	// List is sorted by Used, highest first; unlimited tenants last, by spend.
	List []TenantBudget
	// Truncated is set when more tenants exist than StateOptions.MaxTenants.
	Truncated bool
	// Failed counts tenants whose budget could not be read.
	Failed int
}

// Tenants returns the budget days of up to MaxTenants tenants.
func (s *State) Tenants(ctx context.Context) (*Tenants, error) {
	return s.tens.get(func() (*Tenants, error) { return s.readTenants(ctx) })
}

func (s *State) readTenants(ctx context.Context) (*Tenants, error) {
	var (
		all   []*store.Tenant
		after string
		out   = &Tenants{}
	)
	for len(all) < s.o.MaxTenants {
		page, more, err := s.d.Store.TenantList(ctx, &store.TenantListParams{After: after, Limit: min(1000, s.o.MaxTenants-len(all))})
		if err != nil {
			return nil, fmt.Errorf("list tenants: %w", err)
		}
		all = append(all, page...)
		if !more || len(page) == 0 {
			break
		}
		after = page[len(page)-1].ID
		out.Truncated = len(all) >= s.o.MaxTenants
	}

	p := s.d.Policy.Current()
	results := make([]*TenantBudget, len(all))
	errs := make([]error, len(all))
	var readers errgroup.Group
	readers.SetLimit(budgetReaders)
	for i, t := range all {
		readers.Go(func() error {
			results[i], errs[i] = s.readBudget(ctx, p, t)
			return nil
		})
	}
	_ = readers.Wait() // every error is in errs
	var firstErr error
	for i, r := range results {
		if r == nil {
			out.Failed++
			firstErr = cmp.Or(firstErr, errs[i])
		} else {
			out.List = append(out.List, *r)
		}
	}
	if len(out.List) == 0 && firstErr != nil {
		return nil, firstErr
	}
	sort.SliceStable(out.List, func(i, j int) bool {
		a, b := &out.List[i], &out.List[j]
		if a.Unlimited != b.Unlimited {
			return !a.Unlimited
		}
		if ua, ub := a.Used(), b.Used(); ua != ub {
			return ua > ub
		}
		return a.Spent > b.Spent
	})
	return out, nil
}

func (s *State) readBudget(ctx context.Context, p *config.Policy, t *store.Tenant) (*TenantBudget, error) {
	acct, _, err := admission.Account(p, t)
	if err != nil {
		return nil, err
	}
	d, err := s.d.Budgets.Status(ctx, acct)
	if err != nil {
		return nil, err
	}
	tb := &TenantBudget{ID: t.ID, Name: t.Name, Tier: t.Tier, Decision: *d, Exhausted: !d.Allowed && d.DeniedBy == "tenant"}
	if !d.Unlimited && acct.SoftLimit > 0 {
		tb.SoftMark = money.Micros(acct.SoftLimit * float64(d.Budget))
	}
	return tb, nil
}

// Waiting is what one tenant has waiting for a model at a priority in the
// fair queue.
type Waiting struct {
	TenantID, Priority, Model string
	Jobs                      int64
	// OldestWait is how long its oldest waiting job has waited.
	OldestWait time.Duration
}

// Waiting returns the jobs waiting in the fair queues per tenant, priority
// and model, most waiting first.
func (s *State) Waiting(ctx context.Context) ([]Waiting, error) {
	if s.d.Queue == nil {
		return nil, nil
	}
	return s.wait.get(func() ([]Waiting, error) {
		scopes, err := s.d.Queue.Scopes(ctx)
		if err != nil {
			return nil, fmt.Errorf("fair queues: %w", err)
		}
		p := s.d.Policy.Current()
		now := time.Now()
		var out []Waiting
		for _, scope := range scopes {
			model := scope
			if i := slices.IndexFunc(p.Models, func(m config.Model) bool { return m.Queue() == scope }); i >= 0 {
				model = p.Models[i].Name
			}
			ws, _, err := s.d.Queue.Waiting(ctx, scope)
			if err != nil {
				return nil, err
			}
			for _, w := range ws {
				out = append(out, Waiting{TenantID: w.TenantID, Priority: w.Priority, Model: model, Jobs: w.Jobs, OldestWait: max(now.Sub(w.Oldest), 0)})
			}
		}
		sort.SliceStable(out, func(i, j int) bool { return out[i].Jobs > out[j].Jobs })
		return out, nil
	})
}

var errNoInspector = errors.New("metrics: no asynq inspector to count workers with")

// Workers returns how many worker processes of this installation are alive;
// a process's several asynq servers count once.
func (s *State) Workers(ctx context.Context) (int, error) {
	if s.d.Asynq == nil {
		return 0, errNoInspector
	}
	return s.wrks.get(func() (int, error) {
		servers, err := s.d.Asynq.Servers()
		if err != nil {
			return 0, fmt.Errorf("list worker servers: %w", err)
		}
		ours := s.d.Namespace.Queue(queue.Jobs)
		alive := map[string]bool{} // host:pid
		for _, srv := range servers {
			if _, ok := srv.Queues[ours]; ok {
				alive[fmt.Sprintf("%s:%d", srv.Host, srv.PID)] = true
			}
		}
		return len(alive), nil
	})
}
