// Package scripts runs the Lua script calls of concurrent callers together:
// the calls that come while a pipeline is under way go in the next one, one
// round trip for all of them. Each call stays its own script run, atomic on
// its own keys; only the trip is shared.
package scripts

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/coalesce"
)

// maxCallers bounds the callers of one pipeline.
const maxCallers = 64

// Call is one run of a script.
type Call struct {
	Script *redis.Script
	Keys   []string
	Args   []any
}

// Client is what a Runner needs of a Redis client.
type Client interface {
	redis.Scripter
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// Runner runs calls on one Redis client, coalesced by a coalesce.Batch.
type Runner struct {
	rdb   Client
	calls coalesce.Batch[struct{}, []Call, []*redis.Cmd]
}

// New returns a Runner over rdb.
func New(rdb Client) *Runner {
	r := &Runner{rdb: rdb}
	r.calls = coalesce.Batch[struct{}, []Call, []*redis.Cmd]{Max: maxCallers, Fn: r.pipeline}
	return r
}

// Run runs c and returns its reply, as c.Script.Run would. The call runs
// to its end even when ctx ends first: the client's timeouts bound it.
func (r *Runner) Run(ctx context.Context, c Call) *redis.Cmd {
	return r.RunAll(ctx, c)[0]
}

// RunAll runs calls in one round trip and returns their replies in their
// order. Each call is atomic on its own keys, not the calls together.
func (r *Runner) RunAll(ctx context.Context, calls ...Call) []*redis.Cmd {
	cmds, _ := r.calls.Do(ctx, struct{}{}, calls) // pipeline answers every call with its own command
	return cmds
}

// Pipelines returns how many pipelines the runner has made.
func (r *Runner) Pipelines() int { return r.calls.Calls() }

// pipeline sends the callers' calls by their scripts' hashes; a script
// Redis does not have is loaded by running its call again alone.
func (r *Runner) pipeline(ctx context.Context, _ struct{}, callers [][]Call) ([][]*redis.Cmd, []error) {
	if len(callers) == 1 && len(callers[0]) == 1 {
		c := callers[0][0]
		return [][]*redis.Cmd{{c.Script.Run(ctx, r.rdb, c.Keys, c.Args...)}}, nil
	}
	out := make([][]*redis.Cmd, len(callers))
	// Each command's error is its own, read below; Exec's is the first of them.
	_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, calls := range callers {
			out[i] = make([]*redis.Cmd, len(calls))
			for j, c := range calls {
				out[i][j] = c.Script.EvalSha(ctx, p, c.Keys, c.Args...)
			}
		}
		return nil
	})
	for i, calls := range callers {
		for j, c := range calls {
			if redis.HasErrorPrefix(out[i][j].Err(), "NOSCRIPT") {
				out[i][j] = c.Script.Run(ctx, r.rdb, c.Keys, c.Args...)
			}
		}
	}
	return out, nil
}
