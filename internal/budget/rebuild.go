package budget

import (
	"context"
	"fmt"
	"time"
)

// finishRebuildScript adds the ledger's sum to a day hash that waits for
// it, once per incarnation of the hash.
var finishRebuildScript = script("", "finish_rebuild")

// rebuild fills the day hash the script found waiting (its token) with the
// spend the ledger holds. The script created the hash before this read, so a
// settlement either landed before (and is in the ledger, having been written
// first) or lands in the new hash: none is lost (see Settle). Callers of one
// process share one ledger read per hash incarnation.
func (b *Budgets) rebuild(ctx context.Context, d dayRef, token string) error {
	key := b.dayKeys(d)[0]
	return b.once(ctx, key+"\x00"+token, func() error {
		// Rows written from here on may be missing from the sum; their
		// settlements land in the hash.
		readAt := time.Now().UnixMicro()
		s, err := b.ledgerSum(ctx, d)
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
			logArgs := []any{"tenant", d.tenantID, "day", d.day}
			if d.tenantID == "" {
				logArgs = []any{"global_day", d.day}
			}
			b.log.Warn("budget: rebuilt spend Redis had lost from the ledger", append(logArgs, "spent_usd", s.USD())...)
		}
		return nil
	})
}

// flight is one in-process run of a function that callers share.
type flight struct{ done chan struct{} }

// once runs fn for key unless a run for key is already under way, in which
// case it waits for that run to end and returns nil: the caller runs its
// script again, which says whether the work is done, and if the run failed
// it leads the next one.
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
