package limiter

import (
	"context"
	_ "embed" // the scripts' Lua
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// slidingLogScript drops, from the log of every window given, the entries
// older than that window, and adds one for cost to every log when each
// leaves room, or to none (sliding_log.lua).
//
//go:embed sliding_log.lua
var slidingLogLua string
var slidingLogScript = redis.NewScript(redisclock.Lua + slidingLogLua)

// slidingLogGiveBackScript replaces a lease's entry, counted at its whole
// slice, by one of what was spent of it, in every window's log that still
// holds it (sliding_log_give_back.lua).
//
//go:embed sliding_log_give_back.lua
var slidingLogGiveBackLua string
var slidingLogGiveBackScript = redis.NewScript(redisclock.Lua + slidingLogGiveBackLua)

// runSlidingLog runs slidingLogScript on windows, whose logs and totals are
// keys, for an entry id.
func runSlidingLog(ctx context.Context, rdb redis.Scripter, opts Options, keys []string, key string,
	windows []NamedWindow, cost int64, id string) (*Result, error) {
	args := make([]any, 0, 3+2*len(windows))
	args = append(args, redisclock.Arg(opts.Clock), cost, id)
	for _, w := range windows {
		args = append(args, w.Limit, w.Period.Microseconds())
	}
	v, err := slidingLogScript.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("limiter: sliding log %q: %w", key, err)
	}
	a, err := ints(v, 2+3*len(windows))
	if err != nil {
		return nil, err
	}
	bs := make([]BucketState, len(windows))
	for i, w := range windows {
		x := a[2+3*i:]
		bs[i] = BucketState{Name: w.Name, Unit: UnitRequests, Limit: w.Limit, Remaining: w.Limit - x[0],
			RetryAfter: us(x[1]), ResetAfter: us(x[2])}
	}
	return windowResult(a[0] == 1, a[1], bs), nil
}
