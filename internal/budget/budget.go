// Package budget holds every tenant to the daily dollar budget of its tier,
// and all tenants together to the optional global daily cap. It owns the live
// spend counters in Redis: a job reserves its worst-case cost before the
// provider call in a Lua script that checks spent + reserved + amount
// against the day's limit and holds it in the same step, so concurrent
// workers never overspend; it then settles the reservation to the real cost
// or releases it. A tenant's day and the global day are two hashes, one
// script each in one round trip: a tenant's keys carry its hash tag, the
// global day's {budget}. Budget days come from Redis TIME in the tier's
// timezone. A settlement charges a job once per day however often it is
// repeated; reservations of crashed workers expire. A day Redis lost is
// rebuilt from the durable ledger (rebuild.go), and one older than the
// ledger is raised to it (raise.go). Every key expires two days after its
// day ends; Redis should run with maxmemory-policy noeviction.
package budget

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/coalesce"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/scripts"
)

// Ledger is the durable record the Redis counters are rebuilt from and
// checked against (the store implements it). A charged job's ledger row
// carries the days of its Reservation.
type Ledger interface {
	// UsageSumByTenantDay returns what tenantID was charged on its budget
	// day (Reservation.Day).
	UsageSumByTenantDay(ctx context.Context, tenantID, day string) (money.Micros, error)
	// UsageSumByDay returns what all tenants were charged on the UTC day.
	UsageSumByDay(ctx context.Context, day string) (money.Micros, error)
	// UsageStreamByTenantDay calls fn with each ledger row of tenantID's
	// budget day written at or after since, oldest first; fn's error stops it.
	UsageStreamByTenantDay(ctx context.Context, tenantID, day string, since time.Time,
		fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error
	// UsageStreamByDay is UsageStreamByTenantDay for every tenant's rows of
	// the UTC day.
	UsageStreamByDay(ctx context.Context, day string, since time.Time,
		fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error
}

// Account is what one reservation is checked against: a tenant's budget as
// its tier (or a per-tenant override) sets it, and the global cap.
type Account struct {
	TenantID string
	// Budget is the tenant's daily budget; zero without Unlimited allows nothing.
	Budget money.Micros
	// Unlimited exempts the tenant from its own cap (its spend is still
	// recorded, and the global cap still applies).
	Unlimited bool
	// SoftLimit is the fraction of Budget past which responses warn; 0 is off.
	SoftLimit float64
	// Location is the tier's timezone, where its budget day starts. Defaults to UTC.
	Location *time.Location
	// Global is the daily cap across all tenants (the UTC day); 0 = none.
	Global money.Micros
}

func (a Account) validate() error {
	switch {
	case a.TenantID == "":
		return errors.New("budget: Account.TenantID is empty")
	case a.Budget < 0:
		return fmt.Errorf("budget: Account.Budget of tenant %s is negative (%s)", a.TenantID, a.Budget)
	case math.IsNaN(a.SoftLimit) || a.SoftLimit < 0 || a.SoftLimit > 1:
		return fmt.Errorf("budget: Account.SoftLimit of tenant %s is %v, want a fraction in [0, 1]", a.TenantID, a.SoftLimit)
	case a.Global < 0:
		return fmt.Errorf("budget: Account.Global is negative (%s)", a.Global)
	}
	return nil
}

// softThreshold is the spend (spent + reserved) at which the soft limit is
// reached, so the script compares integers only; 0 = off.
func (a Account) softThreshold() int64 {
	if a.Unlimited || a.SoftLimit == 0 || a.Budget == 0 {
		return 0
	}
	return int64(math.Ceil(a.SoftLimit * float64(a.Budget)))
}

func (a Account) location() *time.Location { return cmp.Or(a.Location, time.UTC) }

// Options configure Budgets.
type Options struct {
	Keys  rkeys.Builder    // Defaults to the zero Builder (prefix "llmq").
	Clock func() time.Time // replaces Redis TIME as the scripts' "now" (tests only)
	// ReservationTTL is how long a reservation nobody extends keeps
	// counting, so that one nobody settles expires. Defaults to 15m.
	ReservationTTL time.Duration
	Logger         *slog.Logger // soft-limit crossings, days raised. Defaults to discarding.
	Observer       Observer     // told of the days raised to the ledger. Defaults to none.
}

// DefaultReservationTTL is Options.ReservationTTL when unset.
const DefaultReservationTTL = 15 * time.Minute

// HeldRetryAfter is how soon a reservation refused only by what others
// hold should try again: holds settle as their calls end, within seconds.
const HeldRetryAfter = time.Second

// WaitTTL is how long a reservation refused by holds keeps its place among
// the day's waiters after its last try: one that went away stops holding
// back those behind it after this long.
const WaitTTL = 15 * time.Second

// keySlack is how long day keys outlive their day, for late settlements.
const keySlack = 48 * time.Hour

// maxAttempts bounds the wrong-day, rebuild and raise round trips of one
// call; three are expected at most.
const maxAttempts = 6

// Budgets reserves and settles spend against daily budgets. It is safe for
// concurrent use; any number of processes may share one Redis.
type Budgets struct {
	rdb     redis.UniversalClient
	scripts *scripts.Runner
	ledger  Ledger
	keys    rkeys.Builder
	clock   func() time.Time
	resTTL  time.Duration
	log     *slog.Logger
	obs     Observer

	// offset is how far Redis's clock is ahead of ours (µs), learnt from
	// wrong-day replies, so a skewed worker guesses the day right next time.
	offset atomic.Int64
	// guess replaces the first guess of the time (tests of the wrong-day path).
	guess     func() time.Time
	wrongDays atomic.Int64

	mu      sync.Mutex
	flights map[string]*flight

	statuses coalesce.Group[Account, statusRead]

	// spans holds the last span computed per *time.Location.
	spans sync.Map
}

// New returns Budgets over rdb (single node, Sentinel or Cluster). ledger is
// required: without it a Redis restart would reset the day's spend.
func New(rdb redis.UniversalClient, ledger Ledger, opts Options) (*Budgets, error) {
	switch {
	case rdb == nil:
		return nil, errors.New("budget: the Redis client is required")
	case ledger == nil:
		return nil, errors.New("budget: the Ledger is required")
	}
	return &Budgets{
		rdb: rdb, scripts: scripts.New(rdb), ledger: ledger, keys: opts.Keys, clock: opts.Clock,
		resTTL: cmp.Or(opts.ReservationTTL, DefaultReservationTTL), log: cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
		obs: cmp.Or[Observer](opts.Observer, nopObserver{}), flights: map[string]*flight{},
	}, nil
}

type nopObserver struct{}

func (nopObserver) BudgetRaised(string, money.Micros) {}

// ReservationTTL is how long a reservation counts unless extended.
func (b *Budgets) ReservationTTL() time.Duration { return b.resTTL }

// The caps a Decision or a Denial names.
const (
	DeniedByTenant = "tenant"
	DeniedByGlobal = "global"
)

// Decision is the state of a tenant's day after a Reserve (or at a Status).
type Decision struct {
	Allowed bool
	// DeniedBy is "" when allowed, else the cap that denied, or when both
	// did, the one that resets later.
	DeniedBy string
	// TooLarge is set on a denial when the amount alone exceeds the denying
	// cap: waiting for the reset will not help.
	TooLarge bool
	// Held is set on a denial by what other reservations hold (or the room
	// the reservations waiting before this one need) alone: spent + amount
	// fits every cap, and RetryAfter is HeldRetryAfter. Unset, a denial is
	// for spend: no settlement can make room before the reset.
	Held bool
	// Day is the tenant's budget day, YYYY-MM-DD in the account's timezone.
	Day string
	// Spent, Reserved, Budget and Remaining are the tenant's, after this
	// call. Remaining is Budget − Spent − Reserved, never below zero. For an
	// Unlimited account Budget and Remaining are 0.
	Spent, Reserved, Budget, Remaining money.Micros
	Unlimited                          bool
	// SoftLimitReached: Spent + Reserved is at or past SoftLimit × Budget.
	SoftLimitReached bool
	// SoftLimitCrossed is set on the one call per tenant and day that
	// crossed the soft limit.
	SoftLimitCrossed bool
	// ResetsAt is the start of the next day: of the tenant's day when
	// allowed, of the denying cap's day when denied.
	ResetsAt time.Time
	// RetryAfter is the time from Redis's now until ResetsAt when denied
	// (HeldRetryAfter when Held); 0 when allowed.
	RetryAfter time.Duration
	// GlobalDay is the UTC day. GlobalSpent and GlobalReserved are all
	// tenants' together, read only under a global cap.
	GlobalDay                   string
	GlobalSpent, GlobalReserved money.Micros
	// GlobalBudget is the global cap the decision was made against; 0 = none.
	GlobalBudget money.Micros

	// now is Redis's time at the decision; tenantEnd and globalEnd end the
	// tenant's and the UTC day.
	now, tenantEnd, globalEnd time.Time
}

// Denial is why an amount does not fit: the cap that refuses it, with that
// cap's own numbers as of the decision and its own reset.
type Denial struct {
	// By is DeniedByTenant or DeniedByGlobal.
	By string
	// Spent, Reserved and Budget are the tenant's, or all tenants'
	// together against the global cap.
	Spent, Reserved, Budget money.Micros
	// ResetsAt, RetryAfter, TooLarge and Held are as in Decision, for this cap.
	ResetsAt   time.Time
	RetryAfter time.Duration
	TooLarge   bool
	Held       bool
}

// Name is how messages name the refusing budget.
func (n *Denial) Name() string {
	if n.By == DeniedByGlobal {
		return "global daily budget (all tenants)"
	}
	return "tenant's daily budget"
}

// Reservation is budget held for one job until Settle or Release. Settling
// goes by the job's id and days alone, so one built from a job's ledger row
// settles it too.
type Reservation struct {
	ID        string // the job id
	TenantID  string
	Day       string // the tenant's budget day; the ledger row must carry it
	GlobalDay string // the UTC day; the ledger row must carry it
	Amount    money.Micros
	// Global is set when the amount is held on the global day too.
	Global bool
}

// span is one candidate budget day: the tenant's day in its timezone and the
// UTC day, each as [start, end).
type span struct {
	day, gday                string
	start, end, gstart, gend time.Time
}

// spanAt returns the span of the day of now in loc, from the last one
// computed for loc while now falls in it.
func (b *Budgets) spanAt(now time.Time, loc *time.Location) span {
	if v, ok := b.spans.Load(loc); ok {
		if sp := v.(*span); sp.holds(now) {
			return *sp
		}
	}
	sp := spanAt(now, loc)
	b.spans.Store(loc, &sp)
	return sp
}

// holds reports whether t falls in both of the span's days.
func (sp *span) holds(t time.Time) bool {
	return !t.Before(sp.start) && t.Before(sp.end) && !t.Before(sp.gstart) && t.Before(sp.gend)
}

func spanAt(now time.Time, loc *time.Location) span {
	day, start, end := dayOf(now, loc)
	gday, gstart, gend := dayOf(now, time.UTC)
	return span{day: day, gday: gday, start: start, end: end, gstart: gstart, gend: gend}
}

// dayOf returns the local date of t in loc and the instants it starts and ends.
func dayOf(t time.Time, loc *time.Location) (string, time.Time, time.Time) {
	y, m, d := t.In(loc).Date()
	return fmt.Sprintf("%04d-%02d-%02d", y, m, d), midnight(y, m, d, loc), midnight(y, m, d+1, loc)
}

// midnight is the first instant of the date in loc. Where a DST change skips
// midnight, time.Date may answer an instant of the previous date; the day
// then starts where that zone period ends.
func midnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if ty, tm, td := t.Date(); ty != y || tm != m || td != d {
		want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		if time.Date(ty, tm, td, 0, 0, 0, 0, time.UTC).Before(want) {
			_, end := t.ZoneBounds()
			return end
		}
	}
	return t
}

// globalMember names a reservation among all tenants' in the global set.
func globalMember(tenantID, id string) string { return tenantID + ":" + id }

// guessNow is a first guess of the scripts' time, to pick the candidate day.
func (b *Budgets) guessNow() time.Time {
	switch {
	case b.guess != nil:
		return b.guess()
	case b.clock != nil:
		return b.clock()
	}
	return time.Now().Add(time.Duration(b.offset.Load()) * time.Microsecond)
}

// reply reads a script's array reply with checked assertions.
type reply []any

func (r reply) str(i int) (string, error) {
	if i < len(r) {
		if s, ok := r[i].(string); ok {
			return s, nil
		}
	}
	return "", fmt.Errorf("budget: script reply %v has no string at %d", []any(r), i)
}

func (r reply) int(i int) (int64, error) {
	if i < len(r) {
		switch v := r[i].(type) {
		case int64:
			return v, nil
		case string:
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("budget: script reply %v has no integer at %d", []any(r), i)
}

// ints reads the integers at 1 to n, stopping at the first error.
func (r reply) ints(n int) ([]int64, error) {
	out := make([]int64, n)
	for i := range out {
		var err error
		if out[i], err = r.int(i + 1); err != nil {
			return nil, err
		}
	}
	return out, nil
}
