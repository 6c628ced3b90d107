package queue

import (
	"context"
	_ "embed" // the scripts' Lua
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/coalesce"
	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/rkeys"
)

// The fair queue of a model (a limiter scope) is one FIFO list per priority
// and tenant: start-time fair queuing counted in tokens (docs/ARCHITECTURE.md).

// fairTTL is how long a scope's fair-queue state outlives its last job.
const fairTTL = 7 * 24 * time.Hour

var fairWeights = func() string {
	parts := make([]string, 0, len(Priorities))
	for _, p := range Priorities {
		parts = append(parts, p+"="+strconv.Itoa(weights[p]))
	}
	return strings.Join(parts, ",")
}()

var (
	//go:embed fair_push.lua
	fairPushLua    string
	fairPushScript = redis.NewScript(redisclock.Lua + fairPushLua)

	//go:embed fair_release.lua
	fairReleaseLua    string
	fairReleaseScript = redis.NewScript(redisclock.Lua + fairReleaseLua)

	//go:embed fair_forget.lua
	fairForgetLua    string
	fairForgetScript = redis.NewScript(fairForgetLua)

	//go:embed fair_stale.lua
	fairStaleLua    string
	fairStaleScript = redis.NewScript(redisclock.Lua + fairStaleLua)

	//go:embed fair_waiting.lua
	fairWaitingLua    string
	fairWaitingScript = redis.NewScript(fairWaitingLua)
)

// fair is a Client's fair queue; nil when the client has no Redis client.
type fair struct {
	rdb   redis.UniversalClient
	keys  rkeys.Builder
	clock func() time.Time // tests' time instead of Redis TIME

	// Pushes of single jobs and forgets of one scope go together.
	pushes  coalesce.Batch[string, JobRef, bool]
	forgets coalesce.Batch[string, string, struct{}]
}

// fairChunk is the most jobs one push or forget script run takes, within
// what Lua's unpack takes.
const fairChunk = 500

// groupTimeout bounds a grouped script run, which no caller cancels.
const groupTimeout = 10 * time.Second

func newFair(rdb redis.UniversalClient, keys rkeys.Builder) *fair {
	f := &fair{rdb: rdb, keys: keys}
	f.pushes.Fn = func(ctx context.Context, scope string, refs []JobRef) ([]bool, []error) {
		ctx, cancel := context.WithTimeout(ctx, groupTimeout)
		defer cancel()
		added, err := f.pushAll(ctx, scope, refs)
		return added, sameErr(len(refs), err)
	}
	f.forgets.Fn = func(ctx context.Context, scope string, ids []string) ([]struct{}, []error) {
		ctx, cancel := context.WithTimeout(ctx, groupTimeout)
		defer cancel()
		return nil, sameErr(len(ids), f.forgetAll(ctx, scope, ids))
	}
	return f
}

func sameErr(n int, err error) []error {
	if err == nil {
		return nil
	}
	return slices.Repeat([]error{err}, n)
}

func (c *Client) fairRef(ref JobRef) bool {
	return c.fair != nil && ref.In <= 0 && ref.Scope != ""
}

// push adds refs of one scope and returns how many it added.
func (f *fair) push(ctx context.Context, scope string, refs []JobRef) (int, error) {
	if len(refs) == 1 {
		added, err := f.pushes.Do(ctx, scope, refs[0])
		if added {
			return 1, err
		}
		return 0, err
	}
	added, err := f.pushAll(ctx, scope, refs)
	n := 0
	for _, a := range added {
		if a {
			n++
		}
	}
	return n, err
}

// pushAll adds refs of one scope and says which it added, then lists the
// scope (after its jobs are in: see Release). On one Redis server the last
// script run and the listing share one pipeline.
func (f *fair) pushAll(ctx context.Context, scope string, refs []JobRef) ([]bool, error) {
	added := make([]bool, 0, len(refs))
	_, cluster := f.rdb.(*redis.ClusterClient)
	keys := []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairMembers(scope)}
	for len(refs) > 0 {
		n := min(len(refs), fairChunk)
		args := make([]any, 0, 3+5*n)
		args = append(args, redisclock.Arg(f.clock), f.keys.FairQueue(scope), fairTTL.Milliseconds())
		for _, r := range refs[:n] {
			share := ""
			if r.Share > 0 {
				share = strconv.FormatFloat(r.Share, 'g', -1, 64)
			}
			args = append(args, r.ID, r.Priority, r.TenantID, max(r.Cost, 1), share)
		}
		refs = refs[n:]
		listed := len(refs) == 0 && !cluster
		var v []int64
		var err error
		if listed {
			v, err = f.pushAndList(ctx, scope, keys, args)
		} else {
			v, err = fairPushScript.Run(ctx, f.rdb, keys, args...).Int64Slice()
		}
		if err != nil {
			return added, fmt.Errorf("fair queue of %s: %w", scope, err)
		}
		for _, x := range v {
			added = append(added, x == 1)
		}
		if listed {
			return added, nil
		}
	}
	if err := f.rdb.SAdd(ctx, f.keys.FairScopes(), scope).Err(); err != nil {
		return added, fmt.Errorf("fair queue scopes: %w", err)
	}
	return added, nil
}

// pushAndList runs the push script and lists the scope in one pipeline; on
// NOSCRIPT both run again, the script loaded.
func (f *fair) pushAndList(ctx context.Context, scope string, keys []string, args []any) ([]int64, error) {
	var push *redis.Cmd
	var list *redis.IntCmd
	_, err := f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		push = fairPushScript.EvalSha(ctx, p, keys, args...)
		list = p.SAdd(ctx, f.keys.FairScopes(), scope)
		return nil
	})
	if err != nil && redis.HasErrorPrefix(push.Err(), "NOSCRIPT") {
		v, err := fairPushScript.Run(ctx, f.rdb, keys, args...).Int64Slice()
		if err != nil {
			return nil, err
		}
		return v, f.rdb.SAdd(ctx, f.keys.FairScopes(), scope).Err()
	}
	if err != nil {
		return nil, err
	}
	if err := list.Err(); err != nil {
		return nil, err
	}
	return push.Int64Slice()
}

// Room is what a scope's limits admit now, for Release: tokens and requests
// (math.Inf(1) for none), before what is released and not yet started.
type Room struct {
	Tokens, Requests float64
	// Factor is what the limiter counts per estimated token. Defaults to 1.
	Factor float64
	// MaxOutstanding bounds the jobs released and not yet started.
	MaxOutstanding int
	// Force releases the next job, when nothing is outstanding, even if it
	// does not fit: a job larger than the limits ever show room for.
	Force bool
}

// Released is a job the fair queue released into asynq's queue.
type Released struct {
	ID, Priority, TenantID string
	Cost                   int64
	Waited                 time.Duration
}

// Scopes returns the scopes whose fair queue holds jobs.
func (c *Client) Scopes(ctx context.Context) ([]string, error) {
	if c.fair == nil {
		return nil, nil
	}
	return c.fair.rdb.SMembers(ctx, c.fair.keys.FairScopes()).Result()
}

// Release takes from scope's fair queue the jobs room has space for, in
// fair order, and enqueues their tasks; a job whose task exists is
// forgotten at once. empty reports that nothing waits; the scope then
// leaves Scopes once no job it released waits to start either.
func (c *Client) Release(ctx context.Context, scope string, room Room) (released []Released, empty bool, err error) {
	if c.fair == nil {
		return nil, true, nil
	}
	f := c.fair
	if room.Factor <= 0 {
		room.Factor = 1
	}
	num := func(v float64) string {
		if v > 1e15 {
			return "inf"
		}
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	keys := []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairMembers(scope), f.keys.FairOut(scope)}
	// go-redis sends a bool as 1 or 0.
	v, err := fairReleaseScript.Run(ctx, f.rdb, keys, redisclock.Arg(f.clock), f.keys.FairQueue(scope), fairTTL.Milliseconds(),
		num(room.Tokens), num(room.Requests), max(room.MaxOutstanding, 1),
		strconv.FormatFloat(room.Factor, 'g', -1, 64), room.Force, fairWeights).Slice()
	if err != nil {
		return nil, false, fmt.Errorf("release the fair queue of %s: %w", scope, err)
	}
	if len(v) == 0 || (len(v)-1)%5 != 0 {
		return nil, false, fmt.Errorf("release the fair queue of %s: unexpected reply %v", scope, v)
	}
	empty = v[0] == int64(1)
	var refs []JobRef
	for i := 1; i+4 < len(v); i += 5 {
		id, _ := v[i].(string)
		q, _ := v[i+1].(string)
		tenant, _ := v[i+2].(string)
		cost, _ := v[i+3].(int64)
		waited, _ := v[i+4].(int64)
		released = append(released, Released{ID: id, Priority: q, TenantID: tenant, Cost: cost, Waited: time.Duration(waited) * time.Millisecond})
		refs = append(refs, JobRef{ID: id, Priority: q})
	}
	// The script took these jobs: enqueue them even if the caller stops.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	enqueued, err := c.enqueueTasks(ectx, refs)
	if err != nil {
		// Those left released are enqueued again by RequeueStale.
		return released, false, err
	}
	for i, r := range released {
		if !enqueued[i] {
			if err := c.Started(ectx, scope, r.ID); err != nil {
				return released, false, err
			}
		}
	}
	if empty {
		// Jobs released and not started keep the scope listed, for the
		// stale check should their tasks be lost.
		if n, err := f.rdb.ZCard(ctx, f.keys.FairOut(scope)).Result(); err != nil || n > 0 {
			return released, empty, err
		}
		if err := f.rdb.SRem(ctx, f.keys.FairScopes(), scope).Err(); err != nil {
			return released, empty, fmt.Errorf("fair queue scopes: %w", err)
		}
		// A job pushed meanwhile listed the scope before: look again.
		if n, err := f.rdb.ZCard(ctx, f.keys.FairClasses(scope)).Result(); err == nil && n > 0 {
			return released, false, f.rdb.SAdd(ctx, f.keys.FairScopes(), scope).Err()
		}
	}
	return released, empty, nil
}

// Started forgets job id of scope in the fair queue: a worker has it.
func (c *Client) Started(ctx context.Context, scope, id string) error {
	if c.fair == nil || scope == "" {
		return nil
	}
	return c.fair.forget(ctx, scope, id)
}

func (f *fair) forget(ctx context.Context, scope, id string) error {
	if _, err := f.forgets.Do(ctx, scope, id); err != nil {
		return fmt.Errorf("fair queue of %s: forget %s: %w", scope, id, err)
	}
	return nil
}

// forgetAll forgets ids of scope, at most fairChunk a script run.
func (f *fair) forgetAll(ctx context.Context, scope string, ids []string) error {
	keys := []string{f.keys.FairState(scope), f.keys.FairMembers(scope), f.keys.FairOut(scope)}
	for len(ids) > 0 {
		n := min(len(ids), fairChunk)
		if err := fairForgetScript.Run(ctx, f.rdb, keys, ids[:n]).Err(); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// Placement says where job id of scope is in the fair queue: "waiting",
// "released" (no worker has it yet), or "" (in neither).
func (c *Client) Placement(ctx context.Context, scope, id string) (string, error) {
	if c.fair == nil || scope == "" {
		return "", nil
	}
	f := c.fair
	member, err := f.rdb.SIsMember(ctx, f.keys.FairMembers(scope), id).Result()
	if err != nil || !member {
		return "", err
	}
	if err := f.rdb.ZScore(ctx, f.keys.FairOut(scope), id).Err(); err == nil {
		return "released", nil
	} else if !errors.Is(err, redis.Nil) {
		return "", err
	}
	return "waiting", nil
}

// Dequeue takes job id, cancelled, out of scope's fair queue.
func (c *Client) Dequeue(ctx context.Context, scope, id string) error {
	return c.Started(ctx, scope, id)
}

// RequeueStale enqueues again the tasks of jobs released longer than age
// ago and not yet started, and returns how many it looked at.
func (c *Client) RequeueStale(ctx context.Context, scope string, age time.Duration) (int, error) {
	if c.fair == nil {
		return 0, nil
	}
	f := c.fair
	v, err := fairStaleScript.Run(ctx, f.rdb, []string{f.keys.FairState(scope), f.keys.FairOut(scope)},
		redisclock.Arg(f.clock), age.Milliseconds(), 100).StringSlice()
	if err != nil {
		return 0, fmt.Errorf("fair queue of %s: stale jobs: %w", scope, err)
	}
	if len(v)%2 != 0 {
		return 0, fmt.Errorf("fair queue of %s: unexpected stale reply %v", scope, v)
	}
	for i := 0; i+1 < len(v); i += 2 {
		id, o := v[i], v[i+1]
		_, q, ok := strings.Cut(o, "|")
		if !ok || !ValidPriority(q) {
			q = Default
		}
		if _, err := c.enqueueTask(ctx, JobRef{ID: id, Priority: q}, id); err != nil {
			return i / 2, err
		}
		if err := c.Started(ctx, scope, id); err != nil {
			return i / 2, err
		}
	}
	return len(v) / 2, nil
}

// TenantWaiting is what one tenant has waiting for a model at a priority.
type TenantWaiting struct {
	Priority, TenantID string
	Jobs               int64
	Oldest             time.Time
}

// Waiting returns what waits in scope's fair queue, per priority and
// tenant, and how many jobs are released and not yet started.
func (c *Client) Waiting(ctx context.Context, scope string) ([]TenantWaiting, int64, error) {
	if c.fair == nil {
		return nil, 0, nil
	}
	f := c.fair
	v, err := fairWaitingScript.Run(ctx, f.rdb, []string{f.keys.FairState(scope), f.keys.FairClasses(scope), f.keys.FairOut(scope)},
		f.keys.FairQueue(scope)).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("fair queue of %s: %w", scope, err)
	}
	if len(v) == 0 || (len(v)-1)%4 != 0 {
		return nil, 0, errors.New("fair queue: unexpected waiting reply")
	}
	out, _ := v[0].(int64)
	var ws []TenantWaiting
	for i := 1; i+3 < len(v); i += 4 {
		q, _ := v[i].(string)
		tenant, _ := v[i+1].(string)
		n, _ := v[i+2].(int64)
		at, _ := v[i+3].(int64)
		ws = append(ws, TenantWaiting{Priority: q, TenantID: tenant, Jobs: n, Oldest: time.UnixMilli(at)})
	}
	return ws, out, nil
}
