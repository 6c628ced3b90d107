package limiter

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/llmq/llmq/internal/redisclock"
)

// maxBatch bounds the reservations of one script run, so that one run never
// blocks Redis for long.
const maxBatch = 64

// call is one reservation of a script run.
type call struct {
	mode  string
	scope Scope
	cost  Cost
	id    string
}

// reserve decides one reservation on scope. The reservations of one scope
// that come while a script run of it is under way go together in the next
// run: a scope is one Redis key, so its reservations run one after the
// other anyway, and a run for many saves each its round trip. A caller
// whose context ends while it waits still gets its run's answer.
func (tb *TokenBucket) reserve(ctx context.Context, mode string, scope Scope, cost Cost) (*Result, error) {
	if err := scope.validate(cost); err != nil {
		return nil, err
	}
	c := &call{mode: mode, scope: scope, cost: cost}
	if mode != modeState {
		c.id = newID()
	}
	return tb.reserves.Do(ctx, scope.Name, c)
}

// runReserves is tb.reserves' call: the reservations of the scope called
// name decided in order in one script run.
func (tb *TokenBucket) runReserves(ctx context.Context, name string, batch []*call) ([]*Result, []error) {
	res, errs := make([]*Result, len(batch)), make([]error, len(batch))
	// The batch's distinct bucket lists go once; usually there is one.
	var lists [][]Bucket
	list := make([]int, len(batch))
	size := 4
	for i, c := range batch {
		list[i] = slices.IndexFunc(lists, func(l []Bucket) bool { return slices.Equal(l, c.scope.Buckets) })
		if list[i] < 0 {
			list[i] = len(lists)
			lists = append(lists, c.scope.Buckets)
			size += 1 + 4*len(c.scope.Buckets)
		}
		size += 3 + len(c.scope.Buckets)
	}
	args := make([]any, 0, size)
	args = append(args, redisclock.Arg(tb.opts.Clock), tb.opts.ProbeTimeout.Microseconds(),
		probeRetry.Microseconds(), len(lists))
	for _, l := range lists {
		args = append(args, len(l))
		for _, b := range l {
			args = append(args, b.Name, b.Limit, b.Period.Microseconds(), b.Burst.Microseconds())
		}
	}
	for i, c := range batch {
		args = append(args, list[i]+1, c.mode, c.id)
		for _, b := range c.scope.Buckets {
			args = append(args, c.cost.Of(b.Unit))
		}
	}
	// Each call's part of the reply is checked below.
	a, err := ints(reserveScript.Run(ctx, tb.rdb, []string{tb.opts.Keys.LimiterScope(name)}, args...), 1)
	if err != nil {
		for i := range batch {
			errs[i] = fmt.Errorf("limiter: reserve on scope %q: %w", name, err)
		}
		return res, errs
	}
	now, a := time.UnixMicro(a[0]), a[1:]
	for i, c := range batch {
		n := 3 + 6*len(c.scope.Buckets)
		if len(a) < n {
			errs[i] = fmt.Errorf("limiter: reserve on scope %q: short script reply", name)
			continue
		}
		res[i] = tb.result(c, now, a[:n])
		a = a[n:]
	}
	return res, errs
}
