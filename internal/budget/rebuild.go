package budget

import (
	"context"
	_ "embed" // the script's Lua
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/money"
)

// finishRebuildScript adds the ledger's sum to a day hash that waits for
// it, once per incarnation of the hash (finish_rebuild.lua).
//
//go:embed finish_rebuild.lua
var finishRebuildLua string
var finishRebuildScript = redis.NewScript(finishRebuildLua)

// rebuild fills the day hash the script found waiting (its token) with the
// spend the ledger holds: the tenant's day, or the global day. The script
// created the hash before this read, so a settlement either landed before
// (and is in the ledger, having been written first) or lands in the new
// hash: none is lost (see Settle).
func (b *Budgets) rebuild(ctx context.Context, tenantID string, sp span, global bool, key, token string) error {
	if global {
		return b.fill(ctx, key, token, func() (money.Micros, error) {
			return b.ledger.UsageSumByDay(ctx, sp.gday)
		}, "global_day", sp.gday)
	}
	return b.fill(ctx, key, token, func() (money.Micros, error) {
		return b.ledger.UsageSumByTenantDay(ctx, tenantID, sp.day)
	}, "tenant", tenantID, "day", sp.day)
}

func (b *Budgets) fill(ctx context.Context, key, token string, sum func() (money.Micros, error), logArgs ...any) error {
	// Callers of one process share one ledger read per hash incarnation.
	return b.once(ctx, key+"\x00"+token, func() error {
		// Rows written from here on may be missing from the sum; their
		// settlements land in the hash (an audit may charge them too).
		readAt := time.Now().UnixMicro()
		s, err := sum()
		if err != nil {
			return fmt.Errorf("rebuilding spend from the ledger: %w", err)
		}
		if s < 0 {
			return fmt.Errorf("rebuilding spend from the ledger: negative sum %s", s)
		}
		added, err := finishRebuildScript.Run(ctx, b.rdb, []string{key}, token, int64(s), readAt).Int64()
		if err != nil {
			return err
		}
		// A new day starts from an empty ledger; a sum means Redis lost the day.
		if added == 1 && s > 0 {
			b.obs.BudgetRaised(RaisedLost, s)
			b.log.Warn("budget: rebuilt spend Redis had lost from the ledger", append(logArgs, "spent_usd", s.USD())...)
		}
		return nil
	})
}

// flight is one in-process run of a function that callers share.
type flight struct{ done chan struct{} }

// once runs fn for key unless a run for key is already under way, in which
// case it waits for that run to end and returns nil: the caller runs its
// script again, which says whether the rebuild is done, and if the run
// failed (another caller's context, a ledger error) it leads the next one.
func (b *Budgets) once(ctx context.Context, key string, fn func() error) error {
	b.mu.Lock()
	if f, ok := b.flights[key]; ok {
		b.mu.Unlock()
		select {
		case <-f.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	b.flights[key] = f
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.flights, key)
		b.mu.Unlock()
		close(f.done)
	}()
	return fn()
}
