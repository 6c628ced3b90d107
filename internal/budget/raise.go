package budget

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/scripts"
)

// A job's ledger row is written before its settlement, so a day counts less
// than the ledger only when Redis lost settlements or one is in flight. A
// day behind is raised by settling the rows it does not count, one by one
// (settle.lua charges a job once), never by adding a difference of sums.

// Reasons a day was raised to the ledger, as the Observer and the metric
// llmq_budget_rebuilt_total name them.
const (
	// RaisedLost: Redis had lost the day; it was rebuilt from the ledger's sum.
	RaisedLost = "lost"
	// RaisedRestored: the day came from another Redis incarnation (a
	// restart, a restore, a failover) and counted less than the ledger.
	RaisedRestored = "restored"
	// RaisedPeriodic: the reconciler's check of today's days found it
	// behind the ledger.
	RaisedPeriodic = "periodic"
)

// Observer is told of the days raised to the ledger (the metrics recorder).
type Observer interface {
	// BudgetRaised reports one day whose spend was raised to the ledger's:
	// why (RaisedLost, RaisedRestored, RaisedPeriodic) and how much it added.
	BudgetRaised(reason string, added money.Micros)
}

// LedgerSlack bounds how long after its ledger row's time a job's
// settlement may still come, with room for the writers' clocks: rows
// younger than this may be in flight, so checks count them again later and
// the periodic check leaves them to their own settlements.
const LedgerSlack = time.Minute

// raiseBatch is how many ledger rows one round trip settles.
const raiseBatch = 500

// checkedScript records a check of a day against the ledger.
var checkedScript = script("", "reservations", "checked")

// dayRef names one day hash: a tenant's budget day, or the global (UTC) day
// when tenantID is empty.
type dayRef struct{ tenantID, day string }

// dayKeys are the keys of a day: its hash and its reservations.
func (b *Budgets) dayKeys(d dayRef) []string {
	if d.tenantID == "" {
		return []string{b.keys.BudgetGlobal(d.day), b.keys.BudgetGlobalReservations(d.day)}
	}
	return []string{b.keys.BudgetTenant(d.day, d.tenantID), b.keys.BudgetTenantReservations(d.day, d.tenantID)}
}

// member names a job's reservation in the day.
func (d dayRef) member(tenantID, jobID string) string {
	if d.tenantID == "" {
		return globalMember(tenantID, jobID)
	}
	return jobID
}

// ledgerSum is the ledger's spend on the day.
func (b *Budgets) ledgerSum(ctx context.Context, d dayRef) (money.Micros, error) {
	if d.tenantID == "" {
		return b.ledger.UsageSumByDay(ctx, d.day)
	}
	return b.ledger.UsageSumByTenantDay(ctx, d.tenantID, d.day)
}

// dayState is what a check reads of a day hash.
type dayState struct {
	exists, rebuilding bool
	gen                string
	spent              money.Micros
	counted            time.Time // rbt: every ledger row written before it is counted
}

func (b *Budgets) readDayStates(ctx context.Context, keys []string) ([]dayState, error) {
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, "gen", "rb", "spent", "rbt")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]dayState, len(keys))
	for i, c := range cmds {
		v := reply(c.Val())
		gen, err := v.str(0)
		if err != nil { // nil: no hash
			continue
		}
		st := dayState{exists: true, gen: gen, rebuilding: v[1] != nil}
		if !st.rebuilding {
			n, err := v.int(2)
			if err != nil {
				return nil, fmt.Errorf("day %s: spent: %w", keys[i], err)
			}
			st.spent = money.Micros(n)
			if v[3] != nil {
				t, err := v.int(3)
				if err != nil {
					return nil, fmt.Errorf("day %s: rbt: %w", keys[i], err)
				}
				st.counted = time.UnixMicro(t)
			}
		}
		out[i] = st
	}
	return out, nil
}

// raised is what raising one day did.
type raised struct {
	rows  int
	added money.Micros
}

// raiseRows charges the day's ledger rows from st.counted on that it does
// not count, leaving those written after inFlight (unless zero) to their own
// settlements; then it marks the day checked (on run's server, when set)
// and raises a spent still below sum less those rows (a hash edited by hand).
func (b *Budgets) raiseRows(ctx context.Context, d dayRef, st dayState, sum money.Micros, inFlight time.Time, run string) (raised, error) {
	var out raised
	keys := b.dayKeys(d)
	readAt := time.Now()
	var calls []scripts.Call
	var costs []money.Micros
	flush := func() error {
		ns, err := b.runInts(ctx, calls)
		for i, n := range ns {
			if n == 1 {
				out.rows++
				out.added += costs[i]
			}
		}
		calls, costs = calls[:0], costs[:0]
		return err
	}
	floor := sum
	row := func(tenantID, jobID string, cost money.Micros, written time.Time) error {
		if cost < 0 {
			return fmt.Errorf("ledger row of %s: negative cost %s", jobID, cost)
		}
		if !inFlight.IsZero() && written.After(inFlight) {
			floor -= cost
			return nil
		}
		calls = append(calls, scripts.Call{Script: settleScript, Keys: keys,
			Args: []any{d.member(tenantID, jobID), int64(cost), true, strconv.FormatInt(written.UnixMicro(), 10)}})
		costs = append(costs, cost)
		if len(calls) == raiseBatch {
			return flush()
		}
		return nil
	}
	var err error
	if d.tenantID == "" {
		err = b.ledger.UsageStreamByDay(ctx, d.day, st.counted, row)
	} else {
		err = b.ledger.UsageStreamByTenantDay(ctx, d.tenantID, d.day, st.counted, row)
	}
	if err == nil && len(calls) > 0 {
		err = flush()
	}
	if err != nil {
		return out, fmt.Errorf("raising the day's spend to the ledger: %w", err)
	}
	counted := readAt.Add(-LedgerSlack)
	if !inFlight.IsZero() && inFlight.Before(counted) {
		counted = inFlight
	}
	added, err := b.markChecked(ctx, keys[0], st.gen, counted, run, floor)
	if added > 0 {
		out.added += added
		b.log.Warn("budget: a day's spend was below the ledger's rows it counts; raised to their sum",
			"day", d.day, "added_usd", added.USD())
	}
	return out, err
}

// markChecked runs checked.lua on a day hash; zero counted or a negative
// floor is none. It returns what the floor added to spent.
func (b *Budgets) markChecked(ctx context.Context, key, gen string, counted time.Time, run string, floor money.Micros) (money.Micros, error) {
	c, f := "", ""
	if !counted.IsZero() {
		c = strconv.FormatInt(counted.UnixMicro(), 10)
	}
	if floor >= 0 {
		f = strconv.FormatInt(int64(floor), 10)
	}
	n, err := checkedScript.Run(ctx, b.rdb, []string{key}, gen, c, run, f).Int64()
	return money.Micros(max(n, 0)), err
}

// raiseForRun checks one day that the day script found last checked on
// another Redis server (run is this one's): its spent is read before the
// ledger's sum, so a sum no higher than it means every row is counted; a
// day behind is raised. Callers of one process share a check.
func (b *Budgets) raiseForRun(ctx context.Context, d dayRef, run string) error {
	key := b.dayKeys(d)[0]
	return b.once(ctx, key+"\x00raise\x00"+run, func() error {
		readAt := time.Now()
		sts, err := b.readDayStates(ctx, []string{key})
		if err != nil {
			return err
		}
		st := sts[0]
		if !st.exists || st.rebuilding {
			return nil // the day script rebuilds it from the ledger's sum
		}
		sum, err := b.ledgerSum(ctx, d)
		if err != nil {
			return fmt.Errorf("checking the day's spend against the ledger: %w", err)
		}
		if st.spent >= sum {
			// Every row committed before spent was read is counted.
			_, err := b.markChecked(ctx, key, st.gen, readAt.Add(-LedgerSlack), run, -1)
			return err
		}
		r, err := b.raiseRows(ctx, d, st, sum, time.Time{}, run)
		b.report(d, RaisedRestored, r)
		return err
	})
}

// report tells the observer and the log of a day raised.
func (b *Budgets) report(d dayRef, reason string, r raised) {
	if r.added == 0 {
		return
	}
	b.obs.BudgetRaised(reason, r.added)
	args := []any{"reason", reason, "day", d.day, "rows", r.rows, "added_usd", r.added.USD()}
	if d.tenantID != "" {
		args = append(args, "tenant", d.tenantID)
	}
	b.log.Warn("budget: raised a day's spend to the ledger: Redis had lost settlements", args...)
}

// DaySpend is what the ledger holds of one day: a tenant's budget day, or
// the global (UTC) day of all tenants when TenantID is empty.
type DaySpend struct {
	TenantID string
	Day      string
	Ledger   money.Micros
}

// CheckParams are the days Check compares with Redis.
type CheckParams struct {
	// Days are the days with spend and their ledger sums.
	Days []DaySpend
	// Reason names the check in what it reports.
	Reason string
	// InFlight, when set, leaves the ledger rows written after it to their
	// own settlements; zero charges every row the day does not count.
	InFlight time.Time
}

// CheckReport says what a Check did.
type CheckReport struct {
	Days   int          // days compared whose hash Redis holds
	Behind int          // of them, days whose spent was below the ledger's sum
	Raised int          // days raised: spend added from the ledger
	Rows   int          // ledger rows charged to them
	Added  money.Micros // what was added
}

// Check compares each day's spend in Redis with its ledger sum, all days
// in one round trip, and raises the days behind. A day Redis does not hold,
// or that waits for its rebuild, is left to the rebuild. The sums were read
// before the days, so a day behind may be missed for a check, never raised
// twice for one job.
func (b *Budgets) Check(ctx context.Context, p CheckParams) (CheckReport, error) {
	var rep CheckReport
	keys := make([]string, len(p.Days))
	for i, d := range p.Days {
		if d.Ledger < 0 {
			return rep, fmt.Errorf("budget: Check: day %s of %q: negative ledger sum %s", d.Day, d.TenantID, d.Ledger)
		}
		keys[i] = b.dayKeys(dayRef{d.TenantID, d.Day})[0]
	}
	sts, err := b.readDayStates(ctx, keys)
	if err != nil {
		return rep, fmt.Errorf("budget: Check: %w", err)
	}
	var errs []error
	for i, d := range p.Days {
		st := sts[i]
		if !st.exists || st.rebuilding {
			continue
		}
		rep.Days++
		if st.spent >= d.Ledger {
			continue
		}
		rep.Behind++
		ref := dayRef{d.TenantID, d.Day}
		r, err := b.raiseRows(ctx, ref, st, d.Ledger, p.InFlight, "")
		if err != nil {
			errs = append(errs, fmt.Errorf("day %s of %q: %w", d.Day, d.TenantID, err))
		}
		if r.added > 0 {
			rep.Raised++
			rep.Rows += r.rows
			rep.Added += r.added
		}
		b.report(ref, p.Reason, r)
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("budget: Check: %w", err)
	}
	return rep, nil
}
