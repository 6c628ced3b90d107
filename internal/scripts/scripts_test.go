package scripts

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/testutil"
)

// redisDB is the limiter's database: these tests' keys carry their own
// prefix (docs/ARCHITECTURE.md).
const redisDB = 1

var incrBy = redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

// Concurrent callers each get their own call's reply, in fewer round trips
// than calls.
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, redisDB)
	prefix := testutil.Prefix(t)
	r := New(rdb)
	const callers = 200
	var wg sync.WaitGroup
	got := make([]int64, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			key := fmt.Sprintf("%s:n:%d", prefix, i%10)
			got[i], errs[i] = r.Run(t.Context(), Call{Script: incrBy, Keys: []string{key}, Args: []any{i}}).Int64()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got[i] < int64(i) {
			t.Fatalf("call %d answered %d, less than its own increment", i, got[i])
		}
	}
	// Each key holds the sum of its calls' increments: every call ran once.
	for k := range 10 {
		want := int64(0)
		for i := k; i < callers; i += 10 {
			want += int64(i)
		}
		if n := testutil.Must(rdb.Get(t.Context(), fmt.Sprintf("%s:n:%d", prefix, k)).Int64()); n != want {
			t.Errorf("key %d = %d, want %d", k, n, want)
		}
	}
	if p := r.Pipelines(); p >= callers {
		t.Errorf("%d calls took %d round trips, want fewer", callers, p)
	} else {
		t.Logf("%d calls in %d round trips", callers, p)
	}
}

// In one pipeline, a script Redis has never seen is loaded and run, and a
// call that fails fails alone.
func TestPipelineLoadsScriptsAndKeepsErrorsApart(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, redisDB)
	prefix := testutil.Prefix(t)
	r := New(rdb)
	// Its text is new to this server: its hash is unknown (NOSCRIPT).
	fresh := redis.NewScript(fmt.Sprintf(`-- %s
return redis.call('INCRBY', KEYS[1], ARGV[1])`, prefix))
	fails := redis.NewScript(`return redis.error_reply('ERR refused')`)
	key := prefix + ":n"
	out, _ := r.pipeline(context.Background(), struct{}{}, [][]Call{
		{{Script: fresh, Keys: []string{key}, Args: []any{2}}},
		{{Script: fails, Keys: []string{key}}, {Script: fresh, Keys: []string{key}, Args: []any{3}}},
	})
	cmds := append(out[0], out[1]...)
	if n, err := cmds[0].Int64(); err != nil || n != 2 {
		t.Errorf("first call = %d, %v; want 2", n, err)
	}
	if err := cmds[1].Err(); err == nil || err.Error() != "ERR refused" {
		t.Errorf("failing call's error = %v, want ERR refused", err)
	}
	if n, err := cmds[2].Int64(); err != nil || n != 5 {
		t.Errorf("third call = %d, %v; want 5", n, err)
	}
	if n := testutil.Must(rdb.Get(t.Context(), key).Int64()); n != 5 {
		t.Errorf("key = %d, want 5: each call runs once", n)
	}
}

// One caller's calls go in one round trip, and each gets its own reply in
// its order.
func TestRunAllTakesOneRoundTrip(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, redisDB)
	prefix := testutil.Prefix(t)
	r := New(rdb)
	_ = r.Run(t.Context(), Call{Script: incrBy, Keys: []string{prefix + ":warm"}, Args: []any{1}}) // loads the script
	before := r.Pipelines()
	cmds := r.RunAll(t.Context(),
		Call{Script: incrBy, Keys: []string{prefix + ":a"}, Args: []any{4}},
		Call{Script: incrBy, Keys: []string{prefix + ":b"}, Args: []any{7}},
		Call{Script: incrBy, Keys: []string{prefix + ":a"}, Args: []any{1}})
	want := []int64{4, 7, 5}
	for i, c := range cmds {
		if n, err := c.Int64(); err != nil || n != want[i] {
			t.Errorf("call %d = %d, %v; want %d", i, n, err, want[i])
		}
	}
	if p := r.Pipelines() - before; p != 1 {
		t.Errorf("three calls of one caller took %d round trips, want 1", p)
	}
}
