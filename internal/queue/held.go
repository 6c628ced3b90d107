package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// A synchronous request that finds its model's buckets empty holds the room
// it needs in the scope's fair queue: the scheduler releases no async job
// into that room, so the request gets the next permit the buckets can give
// ahead of every async job still waiting (docs/ARCHITECTURE.md).

// holdScript records (or renews) a hold.
//
// KEYS[1] -> the scope's holds (rkeys.FairHeld)
// ARGV[1] -> now (redisclock.Arg)
// ARGV[2] -> the hold's id
// ARGV[3] -> its TTL in ms
// ARGV[4] -> tokens, ARGV[5] -> requests, ARGV[6] -> the request's priority
// weight (a higher one goes first)
// Returns 1.
var holdScript = redis.NewScript(redisclock.Lua + `
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[2], string.format('%d %s %s %s', math.floor(now / 1000) + ttl, ARGV[4], ARGV[5], ARGV[6]))
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
`)

// heldScript sums the holds in force, dropping the expired ones.
//
// KEYS[1] -> the scope's holds (rkeys.FairHeld)
// ARGV[1] -> now (redisclock.Arg)
// Returns {tokens, requests} held, as strings.
var heldScript = redis.NewScript(redisclock.Lua + `
local h = redis.call('HGETALL', KEYS[1])
local tokens, requests, ms = 0, 0, math.floor(now / 1000)
for i = 1, #h, 2 do
  local exp, t, r = string.match(h[i + 1], '^(%d+) (%d+) (%d+) %d+$')
  if exp == nil or tonumber(exp) <= ms then
    redis.call('HDEL', KEYS[1], h[i])
  else
    tokens, requests = tokens + tonumber(t), requests + tonumber(r)
  end
end
return {tostring(tokens), tostring(requests)}
`)

// aboveScript reports whether a hold in force outranks a priority.
//
// KEYS[1] -> the scope's holds (rkeys.FairHeld)
// ARGV[1] -> now (redisclock.Arg)
// ARGV[2] -> a priority's weight
// Returns 1 if a hold in force has a higher weight, else 0.
var aboveScript = redis.NewScript(redisclock.Lua + `
local h = redis.call('HVALS', KEYS[1])
local ms, w = math.floor(now / 1000), tonumber(ARGV[2])
for i = 1, #h do
  local exp, pw = string.match(h[i], '^(%d+) %d+ %d+ (%d+)$')
  if exp ~= nil and tonumber(exp) > ms and tonumber(pw) > w then
    return 1
  end
end
return 0
`)

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
	n, err := aboveScript.Run(ctx, c.fair.rdb, []string{c.fair.keys.FairHeld(scope)}, redisclock.Arg(nil), weights[priority]).Int()
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
// before every permit it keeps). A hold that expired counts until the
// scheduler's next look at the scope drops it, a few seconds at most.
func (c *Client) Holding(ctx context.Context, scope string) (bool, error) {
	if c.fair == nil {
		return false, nil
	}
	n, err := c.fair.rdb.Exists(ctx, c.fair.keys.FairHeld(scope)).Result()
	return n > 0, err
}
