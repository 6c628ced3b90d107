package budget

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

//go:embed *.lua
var lua embed.FS

// script is one script of prelude and the Lua files named, in order:
// reservations.lua holds the functions of the scripts that touch a day, and
// day.lua is the prelude of Reserve's and Status's (its header lists what it
// does, the keys and arguments they share and the day hash's fields).
func script(prelude string, files ...string) *redis.Script {
	for _, f := range files {
		src, err := lua.ReadFile(f + ".lua")
		if err != nil {
			panic(err) // a name without its file, which every test shows
		}
		prelude += string(src)
	}
	return redis.NewScript(prelude)
}

var reserveScript = script(redisclock.Lua, "reservations", "day", "reserve")

// Reserve holds amount (the job's worst-case cost) for reservation id (the
// job id) against the tenant's budget and the global cap of today, one
// script each in one round trip: when one refuses, the other's hold is
// released at once, so a refused job holds nothing. When allowed it returns
// the Reservation to Settle or Release; when denied, a nil Reservation and
// a Decision saying which cap denied and when it resets. Reserving an id
// that already holds a reservation today returns that reservation and holds
// no more. The reservation lapses after ReservationTTL unless extended.
//
// A denial only by what others hold (Decision.Held) is room that comes back
// as they settle. Such a reservation waits on its tenant's day: a later
// reservation of another id is refused while it would take room the earlier
// waiters need, provided they try again within WaitTTL. Only the oldest 100
// waiters are read. The global day keeps no order (see reserve.lua).
func (b *Budgets) Reserve(ctx context.Context, acct Account, id string, amount money.Micros) (*Reservation, *Decision, error) {
	if err := acct.validate(); err != nil {
		return nil, nil, err
	}
	if id == "" {
		return nil, nil, errors.New("budget: Reserve: empty reservation id")
	}
	if amount < 0 {
		return nil, nil, fmt.Errorf("budget: Reserve %s: negative amount %s", id, amount)
	}
	limit := int64(acct.Budget)
	if acct.Unlimited {
		limit = -1
	}
	ttl, wait := b.resTTL.Microseconds(), WaitTTL.Microseconds()
	days := []onDay{{waiters: true, extra: []any{id, int64(amount), limit, acct.softThreshold(), ttl, wait}}}
	if acct.Global > 0 {
		member := globalMember(acct.TenantID, id)
		days = append(days, onDay{global: true, extra: []any{member, int64(amount), int64(acct.Global), 0, ttl, wait}})
	}
	rs, sp, err := b.eval(ctx, reserveScript, acct, days...)
	if err != nil {
		return nil, nil, fmt.Errorf("budget: Reserve %s: %w", id, err)
	}
	// Each day's allowed, now, spent, reserved, amount held, soft crossed;
	// and its refusal. Without a global cap the global day allows.
	n, refusal := [2][]int64{nil, {1, 0, 0, 0, 0, 0}}, [2]string{}
	for i, r := range rs {
		if n[i], err = r.ints(6); err == nil {
			refusal[i], err = r.str(7)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("budget: Reserve %s: %w", id, err)
		}
	}
	t, g, trefusal, grefusal := n[0], n[1], refusal[0], refusal[1]
	tallowed, gallowed := t[0] == 1, g[0] == 1
	res := &Reservation{ID: id, TenantID: acct.TenantID, Day: sp.day, GlobalDay: sp.gday, Amount: money.Micros(t[4]), Global: len(rs) > 1}
	if !tallowed || !gallowed {
		// The day that held lets go: a refused job holds nothing.
		if _, err := b.settleDays(ctx, res, 0, false, tallowed, gallowed && res.Global); err != nil {
			return nil, nil, fmt.Errorf("budget: Reserve %s: %w", id, err)
		}
		if tallowed {
			t[3] -= t[4]
		}
		if gallowed && res.Global {
			g[3] -= g[4]
		}
	}
	d := b.decision(acct, sp, time.UnixMicro(t[1]), money.Micros(t[2]), money.Micros(t[3]), money.Micros(g[2]), money.Micros(g[3]))
	d.Allowed = tallowed && gallowed
	d.SoftLimitCrossed = t[5] == 1
	if d.SoftLimitCrossed {
		b.log.Warn("budget: tenant passed its soft limit", "tenant", acct.TenantID, "day", sp.day,
			"spent_usd", d.Spent.USD(), "reserved_usd", d.Reserved.USD(), "budget_usd", acct.Budget.USD())
	}
	if !d.Allowed {
		// Held when no cap refuses for spend: every refusal is room others hold.
		held := trefusal != "spent" && grefusal != "spent"
		if !held && trefusal == "held" {
			// The tenant's day made it wait; it will not come back today.
			if err := b.unwait(ctx, acct, sp.day, id); err != nil {
				return nil, nil, fmt.Errorf("budget: Reserve %s: %w", id, err)
			}
		}
		n := d.refusal(!tallowed, !gallowed, amount, held)
		d.DeniedBy, d.ResetsAt, d.RetryAfter, d.TooLarge, d.Held = n.By, n.ResetsAt, n.RetryAfter, n.TooLarge, n.Held
		return nil, d, nil
	}
	return res, d, nil
}

// unwaitScript takes a reservation out of its tenant day's waiters.
var unwaitScript = script("", "unwait")

// StopWaiting takes reservation id out of the waiters of the tenant's day
// when its caller gives up on it, so those behind it need not wait WaitTTL
// for it to lapse. Stopping a reservation that does not wait does nothing.
func (b *Budgets) StopWaiting(ctx context.Context, acct Account, id string) error {
	if err := acct.validate(); err != nil {
		return err
	}
	if err := b.unwait(ctx, acct, b.spanAt(b.guessNow(), acct.location()).day, id); err != nil {
		return fmt.Errorf("budget: StopWaiting %s: %w", id, err)
	}
	return nil
}

func (b *Budgets) unwait(ctx context.Context, acct Account, day, id string) error {
	keys := []string{b.keys.BudgetTenant(day, acct.TenantID), b.keys.BudgetTenantWaiters(day, acct.TenantID)}
	return unwaitScript.Run(ctx, b.rdb, keys, id).Err()
}

// decision fills in what Reserve and Status report alike.
func (b *Budgets) decision(acct Account, sp span, now time.Time, spent, reserved, gspent, greserved money.Micros) *Decision {
	d := &Decision{
		Day: sp.day, Spent: spent, Reserved: reserved, Unlimited: acct.Unlimited,
		ResetsAt: sp.end, GlobalDay: sp.gday, GlobalSpent: gspent, GlobalReserved: greserved, GlobalBudget: acct.Global,
		now: now, tenantEnd: sp.end, globalEnd: sp.gend,
	}
	if !acct.Unlimited {
		d.Budget = acct.Budget
		d.Remaining = max(0, acct.Budget-spent-reserved)
	}
	if th := acct.softThreshold(); th > 0 && int64(spent+reserved) >= th {
		d.SoftLimitReached = true
	}
	return d
}

// refusal is the Denial of the caps that refuse amount: when both do, the
// one that resets later, since only then can the job run. held says that
// no cap refuses for spend: the room comes back within HeldRetryAfter.
func (d *Decision) refusal(tdeny, gdeny bool, amount money.Micros, held bool) *Denial {
	n := &Denial{By: DeniedByGlobal, Spent: d.GlobalSpent, Reserved: d.GlobalReserved, Budget: d.GlobalBudget, ResetsAt: d.globalEnd}
	if tdeny && (!gdeny || !d.globalEnd.After(d.tenantEnd)) {
		n = &Denial{By: DeniedByTenant, Spent: d.Spent, Reserved: d.Reserved, Budget: d.Budget, ResetsAt: d.tenantEnd}
	}
	n.RetryAfter = n.ResetsAt.Sub(d.now)
	n.TooLarge = (tdeny && amount > d.Budget) || (gdeny && amount > d.GlobalBudget)
	if held && !n.TooLarge {
		n.Held, n.RetryAfter = true, HeldRetryAfter
	}
	return n
}

// Denial returns the cap that denied a Reserve or Status, with its own
// numbers and reset; nil when allowed.
func (d *Decision) Denial() *Denial {
	if d.Allowed || d.DeniedBy == "" {
		return nil
	}
	n := d.refusal(d.DeniedBy == DeniedByTenant, d.DeniedBy == DeniedByGlobal, 0, d.Held)
	n.TooLarge = d.TooLarge
	return n
}

// Check says whether amount would fit in what both caps have left as of d
// (a Status), without reserving it: nil when it fits, else the cap that
// refuses it, Held when only what reservations hold stands in the way.
func (d *Decision) Check(amount money.Micros) *Denial {
	tspent := !d.Unlimited && d.Spent+amount > d.Budget
	gspent := d.GlobalBudget > 0 && d.GlobalSpent+amount > d.GlobalBudget
	tdeny := !d.Unlimited && d.Spent+d.Reserved+amount > d.Budget
	gdeny := d.GlobalBudget > 0 && d.GlobalSpent+d.GlobalReserved+amount > d.GlobalBudget
	if !tdeny && !gdeny {
		return nil
	}
	return d.refusal(tdeny, gdeny, amount, !tspent && !gspent)
}

// onDay is one day a day script runs on: the tenant's day, or the global
// day; extra is the script's ARGV from 6 on; waiters adds the day's
// waiters as KEYS[3] (Reserve's).
type onDay struct {
	global, waiters bool
	extra           []any
}

// eval runs a day script on each of days, in one round trip, until each
// answers "ok": it moves to the day Redis's clock says when the guess was
// wrong, rebuilds a lost day from the ledger, and raises to the ledger a
// day last checked on another Redis server, then runs them all again (the
// scripts are idempotent by member). It returns the days' replies in order.
func (b *Budgets) eval(ctx context.Context, s *redis.Script, acct Account, days ...onDay) ([]reply, span, error) {
	loc, guess := acct.location(), b.guessNow()
	calls, refs := make([]scripts.Call, len(days)), make([]dayRef, len(days))
	for range maxAttempts {
		arg := redisclock.Arg(b.clock)
		sp := b.spanAt(guess, loc)
		token := rand.Text()
		for i, d := range days {
			ref, start, end := dayRef{acct.TenantID, sp.day}, sp.start, sp.end
			if d.global {
				ref, start, end = dayRef{"", sp.gday}, sp.gstart, sp.gend
			}
			keys := b.dayKeys(ref)
			if d.waiters {
				keys = append(keys, b.keys.BudgetTenantWaiters(sp.day, acct.TenantID))
			}
			refs[i] = ref
			calls[i] = scripts.Call{Script: s, Keys: keys,
				Args: append([]any{arg, start.UnixMicro(), end.UnixMicro(), keySlack.Milliseconds(), token}, d.extra...)}
		}
		replies, ok := make([]reply, len(days)), true
		for i, cmd := range b.scripts.RunAll(ctx, calls...) {
			v, err := cmd.Slice()
			if err != nil {
				return nil, sp, err
			}
			r := reply(v)
			kind, err := r.str(0)
			switch kind {
			case "ok":
			case "wrongday":
				var n int64
				if n, err = r.int(1); err == nil {
					b.wrongDays.Add(1)
					guess = time.UnixMicro(n)
					if b.clock == nil {
						b.offset.Store(n - time.Now().UnixMicro())
					}
				}
			case "rebuild": // r[1] is the new hash's token
				var tok string
				if tok, err = r.str(1); err == nil {
					err = b.rebuild(ctx, refs[i], tok)
				}
			case "raise": // r[1] is this server's run id
				var run string
				if run, err = r.str(1); err == nil {
					err = b.raiseForRun(ctx, refs[i], run)
				}
			default:
				err = cmp.Or(err, fmt.Errorf("unexpected script reply %q", kind))
			}
			if err != nil {
				return nil, sp, err
			}
			replies[i], ok = r, ok && kind == "ok"
		}
		if ok {
			return replies, sp, nil
		}
	}
	return nil, span{}, fmt.Errorf("no stable budget day after %d attempts", maxAttempts)
}

// statusScript reads a day without reserving.
var statusScript = script(redisclock.Lua, "reservations", "day", "status")

// Status reports the tenant's day so far without reserving. Allowed says
// whether both caps still have room; when not, DeniedBy and RetryAfter say
// which and until when; Check says whether an amount would still fit.
//
// Concurrent calls for one account share a read, but never one that began
// before the call (coalesce.Group).
func (b *Budgets) Status(ctx context.Context, acct Account) (*Decision, error) {
	if err := acct.validate(); err != nil {
		return nil, err
	}
	r, _, err := b.statuses.Do(ctx, acct, func(ctx context.Context, _ int) statusRead {
		d, err := b.readStatus(ctx, acct)
		return statusRead{d, err}
	})
	if err := cmp.Or(err, r.err); err != nil {
		return nil, err
	}
	d := *r.d // each caller its own copy
	return &d, nil
}

// statusRead is one read's answer, shared by the calls it answers.
type statusRead struct {
	d   *Decision
	err error
}

// readStatus is one read of the account's day, and of the global day
// under a global cap.
func (b *Budgets) readStatus(ctx context.Context, acct Account) (*Decision, error) {
	days := []onDay{{}}
	if acct.Global > 0 {
		days = append(days, onDay{global: true})
	}
	rs, sp, err := b.eval(ctx, statusScript, acct, days...)
	if err != nil {
		return nil, fmt.Errorf("budget: Status of tenant %s: %w", acct.TenantID, err)
	}
	n := [2][]int64{nil, {0, 0, 0}} // each day's now, spent, reserved
	for i, r := range rs {
		if n[i], err = r.ints(3); err != nil {
			return nil, fmt.Errorf("budget: Status of tenant %s: %w", acct.TenantID, err)
		}
	}
	t, g := n[0], n[1]
	d := b.decision(acct, sp, time.UnixMicro(t[0]), money.Micros(t[1]), money.Micros(t[2]), money.Micros(g[1]), money.Micros(g[2]))
	if n := d.Check(1); n != nil { // full: not a micro-dollar more fits
		d.DeniedBy, d.ResetsAt, d.RetryAfter, d.Held = n.By, n.ResetsAt, n.RetryAfter, n.Held
	}
	d.Allowed = d.DeniedBy == ""
	return d, nil
}
