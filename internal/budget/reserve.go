package budget

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/redisclock"
)

// luaDay is shared by the scripts that read or write a day (Reserve and
// Status). The four keys and the first seven arguments are the same for both:
//
// KEYS[1] -> tenant day hash: gen, rb, spent, reserved, soft, r:<id>, c:<id>
// KEYS[2] -> tenant reservations: sorted set of ids, scored by expiry (Unix µs)
// KEYS[3] -> global day hash: the same fields, for the members <tenant>:<id>
// KEYS[4] -> global reservations: sorted set of <tenant>:<id> by expiry
// ARGV[1] -> now in Unix µs, or "" to read Redis TIME
// ARGV[2], ARGV[3] -> the tenant's day [start, end) in Unix µs
// ARGV[4], ARGV[5] -> the UTC day [start, end) in Unix µs
// ARGV[6] -> how long keys outlive their day, in ms
// ARGV[7] -> a fresh generation token, for a day hash this call must create
//
// Hash fields: gen names this incarnation of the hash (a new one after Redis
// lost it); rb is set while spent still waits for the ledger's sum; r:<id> is
// an open reservation's amount; c:<id> marks a job whose cost spent counts,
// so that however often a job settles it is charged once (see Settle).
//
// Lua numbers are doubles: every amount and time stays an integer below 2^53,
// and numbers handed back to Redis go through int(), because Redis would
// format them with only 14 significant digits.
const luaDay = redisclock.Lua + `
local function int(n) return string.format("%d", n) end

if now < tonumber(ARGV[2]) or now >= tonumber(ARGV[3]) or now < tonumber(ARGV[4]) or now >= tonumber(ARGV[5]) then
  return {"wrongday", int(now)}
end
local tttl = int((tonumber(ARGV[3]) - now) / 1000 + tonumber(ARGV[6]))
local gttl = int((tonumber(ARGV[5]) - now) / 1000 + tonumber(ARGV[6]))

-- ensure returns "" when the day hash is ready, else the generation token of
-- a hash whose spent still waits for the ledger (creating it when absent, so
-- settlements from now on count in it).
local function ensure(h, ttl)
  local f = redis.call("HMGET", h, "gen", "rb")
  if not f[1] then
    redis.call("HSET", h, "gen", ARGV[7], "rb", "1", "spent", "0", "reserved", "0")
    redis.call("PEXPIRE", h, ttl)
    return ARGV[7]
  end
  if f[2] then return f[1] end
  return ""
end

-- expire drops reservations whose holder stopped extending them (a crashed
-- worker), at most 100 a call; any left over count until a later call: the
-- safe side. A late Settle of one still charges it (no c:<id> yet).
local function expire(h, z)
  local gone = redis.call("ZRANGEBYSCORE", z, "-inf", int(now), "LIMIT", 0, 100)
  for _, m in ipairs(gone) do
    local a = redis.call("HGET", h, "r:" .. m)
    if a then
      redis.call("HDEL", h, "r:" .. m)
      redis.call("HINCRBY", h, "reserved", int(-tonumber(a)))
    end
    redis.call("ZREM", z, m)
  end
end

local tneed, gneed = ensure(KEYS[1], tttl), ensure(KEYS[3], gttl)
if tneed ~= "" or gneed ~= "" then
  return {"rebuild", tneed, gneed}
end
expire(KEYS[1], KEYS[2])
expire(KEYS[3], KEYS[4])
`

// reserveScript holds an amount for one reservation id against the tenant's
// day and the global day together, all or nothing.
//
// KEYS and ARGV[1..7] -> as in luaDay
// ARGV[8] -> reservation id; ARGV[9] -> its global member (<tenant>:<id>)
// ARGV[10] -> amount (µ$); ARGV[11] -> tenant budget, -1 = unlimited
// ARGV[12] -> global cap, 0 = none; ARGV[13] -> soft-limit threshold, 0 = none
// ARGV[14] -> reservation TTL in µs
// Returns {"wrongday", now} when now is outside either day,
// {"rebuild", tenant token, global token} when a day hash (token not "")
// waits for the ledger, else {"ok", allowed, tenant denied, global denied,
// now, spent, reserved, amount held, soft crossed, global spent, global
// reserved}, all after the call.
var reserveScript = redis.NewScript(luaDay + `
local id, member, amount = ARGV[8], ARGV[9], tonumber(ARGV[10])
local budget, cap, soft = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local exp = int(now + tonumber(ARGV[14]))
local t = redis.call("HMGET", KEYS[1], "spent", "reserved", "r:" .. id)
local g = redis.call("HMGET", KEYS[3], "spent", "reserved")
local spent, reserved = tonumber(t[1]), tonumber(t[2])
local gspent, greserved = tonumber(g[1]), tonumber(g[2])
local allowed, tdeny, gdeny, crossed = 1, 0, 0, 0
if t[3] then
  -- The same id again (a redelivered job): hold what it holds, a while longer.
  amount = tonumber(t[3])
  redis.call("ZADD", KEYS[2], "XX", exp, id)
  redis.call("ZADD", KEYS[4], "XX", exp, member)
else
  if budget >= 0 and spent + reserved + amount > budget then tdeny = 1 end
  if cap > 0 and gspent + greserved + amount > cap then gdeny = 1 end
  if tdeny == 1 or gdeny == 1 then
    allowed = 0
  else
    redis.call("ZADD", KEYS[2], exp, id)
    redis.call("PEXPIRE", KEYS[2], tttl)
    redis.call("HSET", KEYS[1], "r:" .. id, ARGV[10])
    redis.call("HINCRBY", KEYS[1], "reserved", ARGV[10])
    redis.call("ZADD", KEYS[4], exp, member)
    redis.call("PEXPIRE", KEYS[4], gttl)
    redis.call("HSET", KEYS[3], "r:" .. member, ARGV[10])
    redis.call("HINCRBY", KEYS[3], "reserved", ARGV[10])
    reserved, greserved = reserved + amount, greserved + amount
    if soft > 0 and spent + reserved >= soft then
      crossed = redis.call("HSETNX", KEYS[1], "soft", "1")
    end
  end
end
return {"ok", allowed, tdeny, gdeny, int(now), int(spent), int(reserved), int(amount), crossed,
  int(gspent), int(greserved)}
`)

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

// eval runs a day script (luaDay + script) until it answers "ok": it moves
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
		v, err := s.Run(ctx, b.rdb, keys, args...).Slice()
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
