package budget

import (
	"context"
	_ "embed" // the scripts' Lua
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/scripts"
)

// dayLua is the prelude of the scripts that read or write a day (Reserve
// and Status), after the clock's (day.lua): it checks that now lies in the
// tenant's day and the UTC day, creates a day hash Redis lost (its spend
// then waits for the ledger's sum, see rebuild) and drops reservations
// whose holders stopped extending them. Its header lists the four keys and
// seven arguments both scripts share, and the day hash's fields.
//
//go:embed day.lua
var dayLua string

// reservationsLua is the functions the scripts that touch a day share,
// before dayLua or a script's own Lua.
//
//go:embed reservations.lua
var reservationsLua string

// reserveScript holds an amount for one reservation id against the
// tenant's day and the global day together, all or nothing (reserve.lua).
//
//go:embed reserve.lua
var reserveLua string
var reserveScript = redis.NewScript(redisclock.Lua + reservationsLua + dayLua + reserveLua)

// Reserve holds amount (the job's worst-case cost) for reservation id (the
// job id) against the tenant's budget and the global cap of today, all or
// nothing. When allowed it returns the Reservation to Settle or Release;
// when denied it returns a nil Reservation and a Decision saying which cap
// denied and when it resets (defer the job until then, or fail it when
// TooLarge). Reserving an id that already holds a reservation today returns
// that reservation, with its first amount, and does not hold more. The
// reservation lapses after ReservationTTL unless its holder calls Extend.
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
	member := globalMember(acct.TenantID, id)
	r, sp, err := b.eval(ctx, reserveScript, acct,
		[]any{id, member, int64(amount), limit, int64(acct.Global), acct.softThreshold(), b.resTTL.Microseconds()})
	if err != nil {
		return nil, nil, fmt.Errorf("budget: Reserve %s: %w", id, err)
	}
	n, err := r.ints(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	if err != nil {
		return nil, nil, fmt.Errorf("budget: Reserve %s: %w", id, err)
	}
	allowed, tdeny, gdeny, now := n[0] == 1, n[1] == 1, n[2] == 1, time.UnixMicro(n[3])
	d := b.decision(acct, sp, now, money.Micros(n[4]), money.Micros(n[5]), money.Micros(n[8]), money.Micros(n[9]))
	d.Allowed = allowed
	d.SoftLimitCrossed = n[7] == 1
	if !allowed {
		d.deny(tdeny, gdeny, amount)
		return nil, d, nil
	}
	if d.SoftLimitCrossed {
		b.log.Warn("budget: tenant passed its soft limit", "tenant", acct.TenantID, "day", sp.day,
			"spent_usd", d.Spent.USD(), "reserved_usd", d.Reserved.USD(), "budget_usd", acct.Budget.USD())
	}
	return &Reservation{ID: id, TenantID: acct.TenantID, Day: sp.day, GlobalDay: sp.gday, Amount: money.Micros(n[6])}, d, nil
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

// deny records a denial in d: which cap denied and when to come back.
func (d *Decision) deny(tdeny, gdeny bool, amount money.Micros) {
	n := d.refusal(tdeny, gdeny, amount)
	d.DeniedBy, d.ResetsAt, d.RetryAfter, d.TooLarge = n.By, n.ResetsAt, n.RetryAfter, n.TooLarge
}

// refusal is the Denial of the caps that refuse amount: when both do, the
// one that resets later, since only then can the job run.
func (d *Decision) refusal(tdeny, gdeny bool, amount money.Micros) *Denial {
	n := &Denial{By: DeniedByGlobal, Spent: d.GlobalSpent, Reserved: d.GlobalReserved, Budget: d.GlobalBudget, ResetsAt: d.globalEnd}
	if tdeny && (!gdeny || !d.globalEnd.After(d.tenantEnd)) {
		n = &Denial{By: DeniedByTenant, Spent: d.Spent, Reserved: d.Reserved, Budget: d.Budget, ResetsAt: d.tenantEnd}
	}
	n.RetryAfter = n.ResetsAt.Sub(d.now)
	n.TooLarge = (tdeny && amount > d.Budget) || (gdeny && amount > d.GlobalBudget)
	return n
}

// Denial returns the cap that denied a Reserve or Status, with its own
// numbers and reset; nil when allowed.
func (d *Decision) Denial() *Denial {
	if d.Allowed || d.DeniedBy == "" {
		return nil
	}
	n := d.refusal(d.DeniedBy == DeniedByTenant, d.DeniedBy == DeniedByGlobal, 0)
	n.TooLarge = d.TooLarge
	return n
}

// Check says whether amount would fit in what both caps have left as of d
// (a Status), without reserving it: nil when it fits, else the cap that
// refuses it. An API that rejects work answers with it at enqueue; only
// Reserve holds the room.
func (d *Decision) Check(amount money.Micros) *Denial {
	tdeny := !d.Unlimited && d.Spent+d.Reserved+amount > d.Budget
	gdeny := d.GlobalBudget > 0 && d.GlobalSpent+d.GlobalReserved+amount > d.GlobalBudget
	if !tdeny && !gdeny {
		return nil
	}
	return d.refusal(tdeny, gdeny, amount)
}

// eval runs a day script (the clock and day preludes, then its own) until it answers "ok": it moves
// to the day Redis's clock says when the guess was wrong, and rebuilds a
// lost day from the ledger. extra is the script's ARGV from 8 on.
func (b *Budgets) eval(ctx context.Context, s *redis.Script, acct Account, extra []any) (reply, span, error) {
	loc := acct.location()
	_, guess := b.now()
	for range maxAttempts {
		arg, _ := b.now()
		sp := b.spanAt(guess, loc)
		keys := b.keysFor(acct.TenantID, sp.day, sp.gday)
		args := append([]any{arg, us(sp.start), us(sp.end), us(sp.gstart), us(sp.gend), keySlack.Milliseconds(), newToken()}, extra...)
		v, err := b.scripts.Run(ctx, scripts.Call{Script: s, Keys: keys, Args: args}).Slice()
		if err != nil {
			return nil, sp, err
		}
		r := reply(v)
		kind, err := r.str(0)
		if err != nil {
			return nil, sp, err
		}
		switch kind {
		case "ok":
			return r, sp, nil
		case "wrongday":
			n, err := r.int(1)
			if err != nil {
				return nil, sp, err
			}
			b.wrongDays.Add(1)
			guess = time.UnixMicro(n)
			if b.clock == nil {
				b.offset.Store(n - time.Now().UnixMicro())
			}
		case "rebuild":
			ttok, err := r.str(1)
			if err != nil {
				return nil, sp, err
			}
			gtok, err := r.str(2)
			if err != nil {
				return nil, sp, err
			}
			if err := b.rebuild(ctx, acct.TenantID, sp, keys, ttok, gtok); err != nil {
				return nil, sp, err
			}
		default:
			return nil, sp, fmt.Errorf("unexpected script reply %q", kind)
		}
	}
	return nil, span{}, fmt.Errorf("no stable budget day after %d attempts", maxAttempts)
}
