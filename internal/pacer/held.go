package queue

import (
	"context"
	_ "embed" // the scripts' Lua
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// A synchronous request that finds its model's buckets empty holds the room
// it needs in the scope's fair queue: the scheduler releases no async job
// into that room, so the request gets the next permit the buckets can give
// ahead of every async job still waiting (docs/ARCHITECTURE.md).

// The holds' scripts, each in its .lua file with its KEYS and ARGV.
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
func (c *Client) Hold(ctx context.Context, scope, id, priority string, tokens, requests int64, ttl time.Duration) error {
	if c.fair == nil {
		return nil
	}
	return holdScript.Run(ctx, c.fair.rdb, []string{c.fair.keys.FairHeld(scope)},
		redisclock.Arg(nil), id, ttl.Milliseconds(), tokens, requests, weights[priority]).Err()
}

// HeldAbove reports whether a synchronous request of a higher priority than
// priority holds room in scope: a permit a lower one got goes to it.
func (c *Client) HeldAbove(ctx context.Context, scope, priority string) (bool, error) {
	if c.fair == nil {
		return false, nil
	}
	n, err := heldAboveScript.Run(ctx, c.fair.rdb, []string{c.fair.keys.FairHeld(scope)}, redisclock.Arg(nil), weights[priority]).Int()
	return n == 1, err
}

// Unhold gives a hold's room back to the scope's async jobs.
func (c *Client) Unhold(ctx context.Context, scope, id string) error {
	if c.fair == nil {
		return nil
	}
	return c.fair.rdb.HDel(ctx, c.fair.keys.FairHeld(scope), id).Err()
}

// Held returns the room scope's synchronous requests hold.
func (c *Client) Held(ctx context.Context, scope string) (tokens, requests float64, err error) {
	if c.fair == nil {
		return 0, 0, nil
	}
	v, err := heldScript.Run(ctx, c.fair.rdb, []string{c.fair.keys.FairHeld(scope)}, redisclock.Arg(nil)).StringSlice()
	if err != nil {
		return 0, 0, err
	}
	if len(v) != 2 {
		return 0, 0, fmt.Errorf("queue: held room: %d values, want 2", len(v))
	}
	if _, err := fmt.Sscan(v[0]+" "+v[1], &tokens, &requests); err != nil {
		return 0, 0, fmt.Errorf("queue: held room: %w", err)
	}
	return tokens, requests, nil
}

// Holding reports whether scope has holds (one EXISTS: the worker asks it
// before every permit it keeps). The workers of a process that ask while
// an EXISTS of the scope is under way share the next one (coalesce.Group):
// each answer is as fresh as a call of its own. A hold that expired counts
// until the scheduler's next look at the scope drops it, a few seconds at
// most.
func (c *Client) Holding(ctx context.Context, scope string) (bool, error) {
	if c.fair == nil {
		return false, nil
	}
	a, _, err := c.fair.holding.Do(ctx, scope, func(ctx context.Context, _ int) holdingAnswer {
		n, err := c.fair.rdb.Exists(ctx, c.fair.keys.FairHeld(scope)).Result()
		return holdingAnswer{n > 0, err}
	})
	if err != nil {
		return false, err
	}
	return a.held, a.err
}

// holdingAnswer is one EXISTS of Holding.
type holdingAnswer struct {
	held bool
	err  error
}
