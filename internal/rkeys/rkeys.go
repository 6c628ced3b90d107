// Package rkeys builds every Redis key llmq writes, outside asynq's own;
// nobody else concatenates key strings. Each key carries a hash tag ({...})
// so that the keys one Lua script touches live in one Cluster slot: a
// limiter scope's, a tenant's (its budget days) or {budget} (the global day).
package rkeys

import (
	"cmp"
	"strings"
)

// DefaultPrefix is the prefix of every key when none is configured.
const DefaultPrefix = "llmq"

// Builder builds keys under one prefix. The zero value uses DefaultPrefix.
type Builder struct {
	prefix string
}

// New returns a Builder for prefix; an empty prefix means DefaultPrefix.
func New(prefix string) Builder {
	return Builder{prefix: strings.TrimSuffix(prefix, ":")}
}

// Prefix returns the prefix every key of b starts with (without the colon).
func (b Builder) Prefix() string { return cmp.Or(b.prefix, DefaultPrefix) }

func (b Builder) key(parts ...string) string { return b.Prefix() + ":" + strings.Join(parts, ":") }

func tag(s string) string { return "{" + s + "}" }

// LimiterScope is the hash of one token-bucket scope: its buckets and what
// they learned.
func (b Builder) LimiterScope(scope string) string { return b.key("tb", tag(scope)) }

// LimiterReconciled marks one reservation of scope as reconciled.
func (b Builder) LimiterReconciled(scope, reservationID string) string {
	return b.key("tb", tag(scope), "rec", reservationID)
}

// FairQueue is the prefix of the keys of one scope's fair queue, with the
// limiter scope's hash tag. Its scripts build from it the keys of each
// priority's tenants ("tenants:<priority>") and each tenant's jobs
// ("list:<priority>:<tenant>").
func (b Builder) FairQueue(scope string) string { return b.key("fq", tag(scope)) + ":" }

// FairState is the hash of a scope's fair queue's state.
func (b Builder) FairState(scope string) string { return b.FairQueue(scope) + "state" }

// FairClasses is the sorted set of a scope's priorities with waiting jobs.
func (b Builder) FairClasses(scope string) string { return b.FairQueue(scope) + "classes" }

// FairMembers is the set of a scope's job ids waiting or released.
func (b Builder) FairMembers(scope string) string { return b.FairQueue(scope) + "members" }

// FairOut is the sorted set (by release time) of a scope's jobs released to
// asynq and not yet started.
func (b Builder) FairOut(scope string) string { return b.FairQueue(scope) + "out" }

// FairHeld is the hash of the room a scope's synchronous requests hold;
// the key expires with its last hold.
func (b Builder) FairHeld(scope string) string { return b.FairQueue(scope) + "held" }

// FairScopes is the set of scopes whose fair queue holds jobs. It has no
// TTL: a scope leaves it when its queue empties.
func (b Builder) FairScopes() string { return b.key("fq", "scopes") }

// FixedWindow is the counter of a fixed-window limiter.
func (b Builder) FixedWindow(scope string) string { return b.key("fw", tag(scope)) }

// SlidingLogWindow is the sorted set of one named window of a scope's
// sliding-window-log set.
func (b Builder) SlidingLogWindow(scope, window string) string {
	return b.key("swl", tag(scope), "w", window)
}

// SlidingLogWindowTotal is the cost total beside SlidingLogWindow.
func (b Builder) SlidingLogWindowTotal(scope, window string) string {
	return b.key("swl", tag(scope), "w", window, "total")
}

// SlidingCounter is the hash of a sliding-window-counter limiter.
func (b Builder) SlidingCounter(scope string) string { return b.key("swc", tag(scope)) }

// SpacerNext is the next free slot of a limiter.Spacer scope.
func (b Builder) SpacerNext(scope string) string { return b.key("pace", tag(scope)) }

// SpacerSlot is the slot one event of a Spacer scope holds.
func (b Builder) SpacerSlot(scope, id string) string { return b.key("pace", tag(scope), "slot", id) }

// BudgetTenant is one tenant's spend for one budget day.
func (b Builder) BudgetTenant(day, tenantID string) string {
	return b.key("budget", tag(tenantID), day)
}

// BudgetTenantReservations is the sorted set (by expiry) of one tenant's
// open reservations of a day.
func (b Builder) BudgetTenantReservations(day, tenantID string) string {
	return b.key("budget", tag(tenantID), day, "res")
}

// BudgetTenantWaiters is the sorted set (by when each began waiting) of a
// tenant's reservations refused only because others held its day's room.
func (b Builder) BudgetTenantWaiters(day, tenantID string) string {
	return b.key("budget", tag(tenantID), day, "wait")
}

// BudgetGlobal is the spend of all tenants for one UTC day.
func (b Builder) BudgetGlobal(day string) string { return b.key(tag("budget"), day, "global") }

// BudgetGlobalReservations is the sorted set (by expiry) of the global
// day's open reservations.
func (b Builder) BudgetGlobalReservations(day string) string {
	return b.key(tag("budget"), day, "global", "res")
}

// Lock is a named mutual-exclusion lock.
func (b Builder) Lock(name string) string { return b.key("lock", tag(name)) }

// LearnedLimits holds the limits a provider announced for one scope.
func (b Builder) LearnedLimits(scope string) string { return b.key("learned", tag(scope)) }

// LearnedBatchQueue holds a deployment's batch queue limit as the
// provider's refusals showed it.
func (b Builder) LearnedBatchQueue(scope string) string {
	return b.key("learned", tag(scope), "batchq")
}

// Stats is a per-minute statistics hash for the dashboard's charts.
func (b Builder) Stats(minute string) string { return b.key("stats", tag(minute)) }

// Epoch marks that Redis still holds llmq's state. It has no TTL: its
// absence means Redis lost its data, which the reconciler then rebuilds.
func (b Builder) Epoch() string { return b.key("epoch") }

// KeyChanges is the Pub/Sub channel announcing a change to a tenant or its
// keys to every dispatcher's key cache.
func (b Builder) KeyChanges() string { return b.key("keychanges") }
