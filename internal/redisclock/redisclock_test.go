package redisclock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
	"github.com/llmq/llmq/internal/testutil"
)

var nowScript = redis.NewScript(redisclock.Lua + `return now`)

// A script's now is Redis TIME unless a clock is injected, and then it is
// that clock's time to the microsecond.
func TestScriptNow(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t, 14)
	ctx := context.Background()
	before := time.Now()
	n, err := nowScript.Run(ctx, rdb, nil, redisclock.Arg(nil)).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if got := time.UnixMicro(n); got.Before(before.Add(-time.Second)) || got.After(time.Now().Add(time.Second)) {
		t.Fatalf("Redis TIME gave %v, want about %v", got, before)
	}
	fixed := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	n, err = nowScript.Run(ctx, rdb, nil, redisclock.Arg(func() time.Time { return fixed })).Int64()
	if err != nil || !time.UnixMicro(n).Equal(fixed) {
		t.Fatalf("injected clock: %v, %v; want %v", time.UnixMicro(n), err, fixed)
	}
	if redisclock.Arg(nil) != "" {
		t.Fatal("Arg(nil) is not empty")
	}
}
