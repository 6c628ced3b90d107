// Package scripts runs the Lua script calls of concurrent callers together:
// the calls that come while a pipeline is under way go in the next one, one
// round trip for all of them. Each call stays its own script run, atomic on
// its own keys; only the trip is shared. llmq uses it for the scripts every
// job runs once or twice (a budget's reserve and settle, a permit's settle).
package scripts

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/coalesce"
)

// maxCalls bounds the calls of one pipeline, so that one pipeline never
// holds Redis for long.
const maxCalls = 64

// Call is one run of a script.
type Call struct {
	Script *redis.Script
	Keys   []string
	Args   []any
}

// Client is what a Runner needs of a Redis client; every go-redis client
// has it (redis.UniversalClient).
type Client interface {
	redis.Scripter
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// Runner runs calls on one Redis client (single node, Sentinel or Cluster:
// a cluster's pipeline goes to each node for its keys). A lone call goes at
// once, alone; calls that come meanwhile queue, and when it ends they go
// together in one pipeline (coalesce.Batch).
type Runner struct {
	rdb   Client
	calls coalesce.Batch[struct{}, Call, *redis.Cmd]
}

// New returns a Runner over rdb.
func New(rdb Client) *Runner {
	r := &Runner{rdb: rdb}
	r.calls = coalesce.Batch[struct{}, Call, *redis.Cmd]{Max: maxCalls, Fn: r.pipeline}
	return r
}

// Run runs c and returns its reply, as c.Script.Run would. The call runs
// to its end even when ctx ends first (its round trip may be other
// callers' too): the client's read and write timeouts bound it.
func (r *Runner) Run(ctx context.Context, c Call) *redis.Cmd {
	cmd, _ := r.calls.Do(ctx, struct{}{}, c) // pipeline answers every call with its own command
	return cmd
}

// Pipelines returns how many pipelines (round trips, save a script's load)
// the runner has made.
func (r *Runner) Pipelines() int { return r.calls.Calls() }

// pipeline is r.calls' call: calls by their scripts' hashes in one
// pipeline. A script Redis does not have (a restart, SCRIPT FLUSH) is
// loaded by running its call again alone (Script.Run sends its text).
func (r *Runner) pipeline(ctx context.Context, _ struct{}, calls []Call) ([]*redis.Cmd, []error) {
	if len(calls) == 1 {
		c := calls[0]
		return []*redis.Cmd{c.Script.Run(ctx, r.rdb, c.Keys, c.Args...)}, nil
	}
	cmds := make([]*redis.Cmd, len(calls))
	// Each command's error is its own, read below; Exec's is the first of them.
	_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = c.Script.EvalSha(ctx, p, c.Keys, c.Args...)
		}
		return nil
	})
	for i, c := range calls {
		if redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			cmds[i] = c.Script.Run(ctx, r.rdb, c.Keys, c.Args...)
		}
	}
	return cmds, nil
}
