package queue

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// asynq's processor takes a task by trying the job queues one at a time,
// in weighted random order, one script and one round trip per queue: a
// task of the default queue costs 2.2 tries on average, and an idle poll
// four. A job dequeuer's client (DequeueClient) answers asynq's first try
// with one script that tries every job queue in the same kind of order,
// the tried queue first, and answers the tries that follow an empty
// answer from what that script saw, without a round trip: one round trip
// a task, and one an idle poll.

// asynqDequeueScript is asynq's dequeue script (internal/rdb, v0.26), kept
// here only to recognize its calls by their hash: should asynq change it,
// its calls are no longer recognized and go to Redis as they are (a test
// fails, so that dequeueScript is brought in line).
var asynqDequeueScript = redis.NewScript(`
if redis.call("EXISTS", KEYS[2]) == 0 then
	local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
	if id then
		local key = ARGV[2] .. id
		redis.call("HSET", key, "state", "active")
		redis.call("HDEL", key, "pending_since")
		redis.call("ZADD", KEYS[4], ARGV[1], id)
		return redis.call("HGET", key, "msg")
	end
end
return nil`)

// dequeueScript is asynq's dequeue script over several queues, tried in
// the order given: the first task of the first queue not paused and not
// empty is made active, as asynq's script does it.
//
// KEYS, four per queue -> its pending list, its paused flag, its active
// list, its lease set (asynq's keys)
// ARGV[1] -> the lease's expiry, in Unix seconds
// ARGV[2..] -> per queue, the prefix of its task keys
// Returns the task's encoded message, or nil when every queue was paused
// or empty.
var dequeueScript = redis.NewScript(`
for i = 1, #ARGV - 1 do
  local k = (i - 1) * 4
  if redis.call('EXISTS', KEYS[k + 2]) == 0 then
    local id = redis.call('RPOPLPUSH', KEYS[k + 1], KEYS[k + 3])
    if id then
      local key = ARGV[i + 1] .. id
      redis.call('HSET', key, 'state', 'active')
      redis.call('HDEL', key, 'pending_since')
      redis.call('ZADD', KEYS[k + 4], ARGV[1], id)
      return redis.call('HGET', key, 'msg')
    end
  end
end
return nil`)

// DequeueClient returns the client to give the asynq server of one job
// dequeuer, whose Config.Queues is ns.JobWeights(): it takes a task in one
// round trip whichever job queue holds it. Each dequeuer needs its own (it
// keeps what its processor's last try saw); everything else the server
// sends goes to rdb as it is. A Cluster or Ring client, whose queues live
// in different slots, is returned as it is.
func (ns Namespace) DequeueClient(rdb redis.UniversalClient) redis.UniversalClient {
	if _, single := rdb.(*redis.Client); !single {
		return rdb
	}
	weights := ns.JobWeights()
	d := &dequeueClient{UniversalClient: rdb, weights: make(map[string]int, len(weights))}
	for q, w := range weights {
		d.weights[q] = w
	}
	return d
}

// dequeueClient is a job dequeuer's client (DequeueClient).
type dequeueClient struct {
	redis.UniversalClient
	weights map[string]int // the job queues (asynq names) and their weights

	mu sync.Mutex
	// empty is how many of the tries that follow an empty answer are
	// still to come: asynq tries every queue before it gives up.
	empty int
}

// EvalSha answers asynq's dequeue tries of the job queues; other scripts go
// to Redis.
func (d *dequeueClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	q, ok := d.jobQueueTry(sha, keys, args)
	if !ok {
		return d.UniversalClient.EvalSha(ctx, sha, keys, args...)
	}
	d.mu.Lock()
	if d.empty > 0 {
		d.empty--
		d.mu.Unlock()
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(redis.Nil)
		return cmd
	}
	d.mu.Unlock()
	order := d.order(q)
	allKeys := make([]string, 0, 4*len(order))
	allArgs := make([]any, 0, 1+len(order))
	allArgs = append(allArgs, args[0])
	for _, o := range order {
		allKeys = append(allKeys, queueKeys(keys, q, o)...)
		allArgs = append(allArgs, strings.Replace(args[1].(string), "{"+q+"}", "{"+o+"}", 1))
	}
	cmd := dequeueScript.Run(ctx, d.UniversalClient, allKeys, allArgs...)
	if cmd.Err() == redis.Nil {
		d.mu.Lock()
		d.empty = len(order) - 1
		d.mu.Unlock()
	}
	return cmd
}

// jobQueueTry reports whether a script call is asynq's dequeue try of one
// of the job queues, and which.
func (d *dequeueClient) jobQueueTry(sha string, keys []string, args []any) (string, bool) {
	if sha != asynqDequeueScript.Hash() || len(keys) != 4 || len(args) != 2 {
		return "", false
	}
	if _, ok := args[1].(string); !ok {
		return "", false
	}
	q, ok := hashTag(keys[0])
	if !ok {
		return "", false
	}
	_, job := d.weights[q]
	return q, job
}

// hashTag returns the queue name in an asynq key, "asynq:{name}:...".
func hashTag(key string) (string, bool) {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return "", false
	}
	n := strings.IndexByte(key[open:], '}')
	if n < 0 {
		return "", false
	}
	return key[open+1 : open+n], true
}

// queueKeys returns asynq's four dequeue keys of queue o, given those of q.
func queueKeys(keys []string, q, o string) []string {
	if o == q {
		return keys
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = strings.Replace(k, "{"+q+"}", "{"+o+"}", 1)
	}
	return out
}

// order returns the job queues in the order to try them: first, as
// asynq's processor chose it, then the others in weighted random order,
// as asynq orders them (a queue comes next with a probability in
// proportion to its weight among those left).
func (d *dequeueClient) order(first string) []string {
	order := make([]string, 0, len(d.weights))
	order = append(order, first)
	left, total := make([]string, 0, len(d.weights)-1), 0
	for q, w := range d.weights {
		if q != first {
			left = append(left, q)
			total += w
		}
	}
	for len(left) > 0 {
		r := rand.IntN(total)
		for i, q := range left {
			if r -= d.weights[q]; r < 0 {
				order = append(order, q)
				total -= d.weights[q]
				left = append(left[:i], left[i+1:]...)
				break
			}
		}
	}
	return order
}
