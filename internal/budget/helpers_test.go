package budget_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
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
	mu    sync.Mutex
	rows  []ledgerRow
	reads atomic.Int64
	// onRead, when set, runs inside a tenant read; the sum is taken before it
	// when after is false and after it when true.
	onRead func()
	after  bool
	// down makes every read fail, as a store that cannot be reached.
	down atomic.Bool
}

// ledgerRow is one job's row.
type ledgerRow struct {
	tenantID, jobID, day, gday string
	cost                       money.Micros
	written                    time.Time
}

var errLedgerDown = errors.New("ledger unreachable")

func newLedger() *ledger { return &ledger{} }

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
	s := l.tenant(tenantID, day)
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
	return l.sum(func(r ledgerRow) bool { return r.gday == day }), nil
}

func (l *ledger) UsageStreamByTenantDay(_ context.Context, tenantID, day string, since time.Time,
	fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error {
	return l.stream(since, func(r ledgerRow) bool { return r.tenantID == tenantID && r.day == day }, fn)
}

func (l *ledger) UsageStreamByDay(_ context.Context, day string, since time.Time,
	fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error {
	return l.stream(since, func(r ledgerRow) bool { return r.gday == day }, fn)
}

func (l *ledger) stream(since time.Time, match func(ledgerRow) bool, fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error {
	l.reads.Add(1)
	if l.down.Load() {
		return errLedgerDown
	}
	l.mu.Lock()
	var rows []ledgerRow
	for _, r := range l.rows {
		if match(r) && !r.written.Before(since) {
			rows = append(rows, r)
		}
	}
	l.mu.Unlock()
	for _, r := range rows {
		if err := fn(r.tenantID, r.jobID, r.cost, r.written); err != nil {
			return err
		}
	}
	return nil
}

// record writes a job's ledger row, as the worker does before Settle.
func (l *ledger) record(res *budget.Reservation, cost money.Micros) {
	l.addRow(ledgerRow{tenantID: res.TenantID, jobID: res.ID, day: res.Day, gday: res.GlobalDay, cost: cost, written: time.Now()})
}

// add writes a row of a job no test settles.
func (l *ledger) add(tenantID, day, gday string, cost money.Micros) {
	l.addRow(ledgerRow{tenantID: tenantID, jobID: "row_" + newID(), day: day, gday: gday, cost: cost, written: time.Now()})
}

func (l *ledger) addRow(r ledgerRow) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rows = append(l.rows, r)
}

func (l *ledger) sum(match func(ledgerRow) bool) money.Micros {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s money.Micros
	for _, r := range l.rows {
		if match(r) {
			s += r.cost
		}
	}
	return s
}

func (l *ledger) tenant(tenantID, day string) money.Micros {
	return l.sum(func(r ledgerRow) bool { return r.tenantID == tenantID && r.day == day })
}

var rowIDs atomic.Int64

func newID() string { return strconv.FormatInt(rowIDs.Add(1), 10) }

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

// check runs Budgets.Check over every day the ledger has rows of, as the
// reconciler does.
func (e *env) check(reason string, inFlight time.Time) budget.CheckReport {
	e.t.Helper()
	e.ledger.mu.Lock()
	sums := map[budget.DaySpend]money.Micros{}
	for _, r := range e.ledger.rows {
		sums[budget.DaySpend{TenantID: r.tenantID, Day: r.day}] += r.cost
		sums[budget.DaySpend{Day: r.gday}] += r.cost
	}
	e.ledger.mu.Unlock()
	p := budget.CheckParams{Reason: reason, InFlight: inFlight}
	for d, sum := range sums {
		d.Ledger = sum
		p.Days = append(p.Days, d)
	}
	rep, err := e.b.Check(e.ctx, p)
	if err != nil {
		e.t.Fatalf("Check: %v", err)
	}
	return rep
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
