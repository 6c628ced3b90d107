package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// Spacer spaces the events of a scope (the webhook deliveries of one tenant
// to one host) at least an interval apart, in the order they first ask: the
// leaky bucket as a queue. Each event gets a slot, the time it may go, and
// keeps it when it asks again (a task woken at its slot), so an event
// deferred is never overtaken by one that asked after it. Unlike a window
// limiter it never refuses: it says when.
type Spacer struct {
	rdb  SpacerClient
	opts Options
}

// SpacerClient is what a Spacer needs of Redis; every redis.UniversalClient
// fits.
type SpacerClient interface {
	redis.Scripter
	Del(ctx context.Context, keys ...string) *redis.IntCmd
}

// NewSpacer returns a Spacer over rdb. Of opts, it uses Keys and Clock.
func NewSpacer(rdb SpacerClient, opts Options) (*Spacer, error) {
	return &Spacer{rdb: rdb, opts: opts.withDefaults()}, nil
}

// slotHold is how long an event's slot is kept after it falls due, for the
// event to come back and take it (asynq may run a deferred task late).
const slotHold = 10 * time.Minute

var pacerSlotScript = redis.NewScript(redisclock.Lua + lua("spacer_slot.lua"))

// Slot returns how long event id of scope must wait for its slot (0 when it
// may go now), giving it the scope's next free slot unless it holds one.
// Call Done once the event went, so that a retry of it later takes a new
// slot behind those given meanwhile.
func (p *Spacer) Slot(ctx context.Context, scope, id string, interval time.Duration) (time.Duration, error) {
	switch {
	case scope == "" || id == "":
		return 0, errors.New("limiter: pacer scope and event id must not be empty")
	case interval < time.Microsecond:
		return 0, fmt.Errorf("limiter: pacer scope %q: interval %v must be at least 1µs", scope, interval)
	}
	keys := []string{p.opts.Keys.SpacerNext(scope), p.opts.Keys.SpacerSlot(scope, id)}
	args := []any{redisclock.Arg(p.opts.Clock), interval.Microseconds(), slotHold.Milliseconds()}
	a, err := ints(pacerSlotScript.Run(ctx, p.rdb, keys, args...), 2)
	if err != nil {
		return 0, fmt.Errorf("limiter: pacer scope %q: %w", scope, err)
	}
	return us(max(a[1]-a[0], 0)), nil
}

// Done forgets event id's slot.
func (p *Spacer) Done(ctx context.Context, scope, id string) error {
	if err := p.rdb.Del(ctx, p.opts.Keys.SpacerSlot(scope, id)).Err(); err != nil {
		return fmt.Errorf("limiter: pacer scope %q: %w", scope, err)
	}
	return nil
}
