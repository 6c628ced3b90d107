package budget_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// testDB is this package's database on the shared test Redis.
const testDB = 2

const dollar = money.PerDollar

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

// ledger is an in-memory Ledger: what the store's usage ledger answers.
type ledger struct {
	mu       sync.Mutex
	byTenant map[string]money.Micros // tenant + " " + day
	byDay    map[string]money.Micros
	reads    atomic.Int64
	// onRead, when set, runs inside a tenant read; the sum is taken before it
	// when after is false and after it when true.
	onRead func()
	after  bool
	// down makes every read fail, as a store that cannot be reached.
	down atomic.Bool
}

var errLedgerDown = errors.New("ledger unreachable")

func newLedger() *ledger {
	return &ledger{byTenant: map[string]money.Micros{}, byDay: map[string]money.Micros{}}
}

func (l *ledger) UsageSumByTenantDay(_ context.Context, tenantID, day string) (money.Micros, error) {
	l.reads.Add(1)
	if l.down.Load() {
		return 0, errLedgerDown
	}
	l.mu.Lock()
	hook, after := l.onRead, l.after
	l.onRead = nil
	l.mu.Unlock()
	if hook != nil && after {
		hook()
	}
	l.mu.Lock()
	s := l.byTenant[tenantID+" "+day]
	l.mu.Unlock()
	if hook != nil && !after {
		hook()
	}
	return s, nil
}

func (l *ledger) UsageSumByDay(_ context.Context, day string) (money.Micros, error) {
	l.reads.Add(1)
	if l.down.Load() {
		return 0, errLedgerDown
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byDay[day], nil
}

// record writes a job's ledger row, as the worker does before Settle.
func (l *ledger) record(res *budget.Reservation, cost money.Micros) {
	l.add(res.TenantID, res.Day, res.GlobalDay, cost)
}

func (l *ledger) add(tenantID, day, gday string, cost money.Micros) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byTenant[tenantID+" "+day] += cost
	l.byDay[gday] += cost
}

func (l *ledger) tenant(tenantID, day string) money.Micros {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byTenant[tenantID+" "+day]
}

// env is what one test needs: Budgets over rdb under a prefix of its own,
// with an injected clock and an in-memory ledger.
type env struct {
	t      *testing.T
	ctx    context.Context
	rdb    redis.UniversalClient
	keys   rkeys.Builder
	clock  *testutil.Clock
	ledger *ledger
	logs   *testutil.SyncBuffer
	b      *budget.Budgets
}

func setup(t *testing.T, rdb redis.UniversalClient, start time.Time) *env {
	t.Helper()
	e := &env{
		t: t, ctx: t.Context(), rdb: rdb, keys: rkeys.New(testutil.Prefix(t)),
		clock: testutil.NewClock(start), ledger: newLedger(), logs: &testutil.SyncBuffer{},
	}
	e.b = e.budgets(rdb)
	return e
}

// budgets returns another Budgets sharing e's keys, clock, ledger and logs
// (another worker process, in effect).
func (e *env) budgets(rdb redis.UniversalClient) *budget.Budgets {
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return testutil.Must(budget.New(rdb, e.ledger, budget.Options{Keys: e.keys, Clock: e.clock.Now, Logger: log}))
}

func (e *env) reserve(acct budget.Account, id string, amount money.Micros) (*budget.Reservation, *budget.Decision) {
	e.t.Helper()
	res, d, err := e.b.Reserve(e.ctx, acct, id, amount)
	if err != nil {
		e.t.Fatalf("Reserve %s: %v", id, err)
	}
	if (res != nil) != d.Allowed {
		e.t.Fatalf("Reserve %s: reservation %v with Allowed=%v", id, res, d.Allowed)
	}
	return res, d
}

func (e *env) mustReserve(acct budget.Account, id string, amount money.Micros) *budget.Reservation {
	e.t.Helper()
	res, d := e.reserve(acct, id, amount)
	if !d.Allowed {
		e.t.Fatalf("Reserve %s of %s denied by %s: %+v", id, amount, d.DeniedBy, d)
	}
	return res
}

func (e *env) mustDeny(acct budget.Account, id string, amount money.Micros, by string) *budget.Decision {
	e.t.Helper()
	_, d := e.reserve(acct, id, amount)
	if d.Allowed || d.DeniedBy != by {
		e.t.Fatalf("Reserve %s of %s: Allowed=%v DeniedBy=%q, want denied by %q (%+v)", id, amount, d.Allowed, d.DeniedBy, by, d)
	}
	return d
}

// charge writes the ledger row and settles, as the worker does on success.
func (e *env) charge(res *budget.Reservation, cost money.Micros) {
	e.t.Helper()
	e.ledger.record(res, cost)
	if err := e.b.Settle(e.ctx, res, cost, true); err != nil {
		e.t.Fatalf("Settle %s: %v", res.ID, err)
	}
}

func (e *env) status(acct budget.Account) *budget.Decision {
	e.t.Helper()
	d, err := e.b.Status(e.ctx, acct)
	if err != nil {
		e.t.Fatalf("Status: %v", err)
	}
	return d
}

// wantSpend checks the tenant's spent and reserved.
func (e *env) wantSpend(acct budget.Account, spent, reserved money.Micros) *budget.Decision {
	e.t.Helper()
	d := e.status(acct)
	if d.Spent != spent || d.Reserved != reserved {
		e.t.Fatalf("tenant %s: spent %s reserved %s, want %s and %s", acct.TenantID, d.Spent, d.Reserved, spent, reserved)
	}
	return d
}

// scanKeys returns every key under e's prefix, on every master of a cluster.
func (e *env) scanKeys() []string {
	e.t.Helper()
	var mu sync.Mutex
	var out []string
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, e.keys.Prefix()+":*", 1000).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			out = append(out, it.Val())
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	switch c := e.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(e.ctx, scan)
	case *redis.Client:
		err = scan(e.ctx, c)
	default:
		e.t.Fatalf("scanKeys: unexpected client %T", e.rdb)
	}
	if err != nil {
		e.t.Fatalf("scan: %v", err)
	}
	return out
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("timezone %s: %v", name, err)
	}
	return loc
}

func containsCount(s, sub string) int { return strings.Count(s, sub) }
