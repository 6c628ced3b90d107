package pacer

import (
	"context"
	_ "embed" // the scripts' Lua
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/redisclock"
)

// A synchronous request that finds its scope's buckets empty holds the room
// it needs: Room leaves it out of what the scheduler releases to async jobs,
// so the request gets the next permit ahead of them.
var (
	//go:embed hold.lua
	holdLua    string
	holdScript = redis.NewScript(redisclock.Lua + holdLua)

	//go:embed held.lua
	heldLua    string
	heldScript = redis.NewScript(redisclock.Lua + heldLua)

	//go:embed held_above.lua
	heldAboveLua    string
	heldAboveScript = redis.NewScript(redisclock.Lua + heldAboveLua)
)

// Hold keeps tokens and requests of scope's room for the synchronous request
// id of priority (a queue name) for ttl, until Unhold.
func (p *Pacer) Hold(ctx context.Context, scope, id, priority string, tokens, requests int64, ttl time.Duration) error {
	return holdScript.Run(ctx, p.rdb, []string{p.keys.FairHeld(scope)},
		redisclock.Arg(nil), id, ttl.Milliseconds(), tokens, requests, queue.Weight(priority)).Err()
}

// HeldAbove reports whether a synchronous request of a higher priority than
// priority holds room in scope: a permit a lower one got goes to it.
func (p *Pacer) HeldAbove(ctx context.Context, scope, priority string) (bool, error) {
	n, err := heldAboveScript.Run(ctx, p.rdb, []string{p.keys.FairHeld(scope)}, redisclock.Arg(nil), queue.Weight(priority)).Int()
	return n == 1, err
}

// Unhold gives a hold's room back to the scope's async jobs.
func (p *Pacer) Unhold(ctx context.Context, scope, id string) error {
	return p.rdb.HDel(ctx, p.keys.FairHeld(scope), id).Err()
}

// Held returns the room scope's synchronous requests hold.
func (p *Pacer) Held(ctx context.Context, scope string) (tokens, requests float64, err error) {
	v, err := heldScript.Run(ctx, p.rdb, []string{p.keys.FairHeld(scope)}, redisclock.Arg(nil)).Float64Slice()
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("pacer: held room: %d values, want 2", len(v))
	}
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// Holding reports whether scope has holds: one EXISTS before every permit
// a worker keeps, shared (coalesce.Group) by the callers of a process. A
// hold that expired counts until the scheduler's next Room drops it.
func (p *Pacer) Holding(ctx context.Context, scope string) (bool, error) {
	a, _, err := p.holding.Do(ctx, scope, func(ctx context.Context, _ int) holdingAnswer {
		n, err := p.rdb.Exists(ctx, p.keys.FairHeld(scope)).Result()
		return holdingAnswer{n > 0, err}
	})
	if err != nil {
		return false, err
	}
	return a.held, a.err
}

type holdingAnswer struct {
	held bool
	err  error
}
