package limiter

import (
	"context"
	_ "embed" // the scripts' Lua
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// slidingCounterScript checks cost against every window and counts it in
// all of them, or in none (sliding_counter.lua).
//
//go:embed sliding_counter.lua
var slidingCounterLua string
var slidingCounterScript = redis.NewScript(redisclock.Lua + windowExtendLua + slidingCounterLua)

// slidingCounterGiveBackScript takes back what a lease counted and did not
// spend: from the window it was counted in while that is current, or from
// the previous-window count once it has become that
// (sliding_counter_give_back.lua).
//
//go:embed sliding_counter_give_back.lua
var slidingCounterGiveBackLua string
var slidingCounterGiveBackScript = redis.NewScript(redisclock.Lua + slidingCounterGiveBackLua)

// runSlidingCounter runs slidingCounterScript on windows (field suffixes
// suffixes) and returns the decision and each window's start.
func runSlidingCounter(ctx context.Context, rdb redis.Scripter, opts Options, rkey, key string,
	windows []NamedWindow, suffixes []string, cost int64) (*Result, []int64, error) {
	args := make([]any, 0, 2+3*len(windows))
	args = append(args, redisclock.Arg(opts.Clock), cost)
	for i, w := range windows {
		args = append(args, suffixes[i], w.Limit, w.Period.Microseconds())
	}
	v, err := slidingCounterScript.Run(ctx, rdb, []string{rkey}, args...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("limiter: sliding counter %q: %w", key, err)
	}
	a, err := ints(v, 2+4*len(windows))
	if err != nil {
		return nil, nil, err
	}
	bs := make([]BucketState, len(windows))
	starts := make([]int64, len(windows))
	for i, w := range windows {
		x := a[2+4*i:]
		bs[i] = BucketState{Name: w.Name, Unit: UnitRequests, Limit: w.Limit,
			Remaining: x[0], RetryAfter: us(x[1]), ResetAfter: us(x[2])}
		starts[i] = x[3]
	}
	return windowResult(a[0] == 1, a[1], bs), starts, nil
}
