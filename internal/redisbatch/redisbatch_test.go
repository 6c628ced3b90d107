package redisbatch_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/redisbatch"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests only ECHO: they share Redis DB 14 with internal/redisclock,
// whose scripts write nothing either.
const redisDB = 14

// trips counts what reaches the server of the tests' ECHOs: single
// commands and pipelines (a new connection's handshake is not counted).
type trips struct{ single, pipelines atomic.Int64 }

func (c *trips) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, n, a string) (net.Conn, error) { return next(ctx, n, a) }
}
func (c *trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "echo" {
			c.single.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "echo" {
			c.pipelines.Add(1)
		}
		return next(ctx, cmds)
	}
}

func setup(t *testing.T) (*redis.Client, *trips) {
	rdb := testutil.Redis(t, redisDB)
	redisbatch.Attach(rdb)
	c := &trips{}
	rdb.AddHook(c) // after Attach: sees what is sent, not what is held
	return rdb, c
}

func echo(ctx context.Context, t *testing.T, rdb *redis.Client, msg string) {
	if got, err := rdb.Echo(ctx, msg).Result(); err != nil || got != msg {
		t.Errorf("ECHO %q = %q, %v", msg, got, err)
	}
}

// TestFirstCommandsShareAPipeline: each step's first command goes in one
// pipeline, its second on its own, every answer to its own command.
func TestFirstCommandsShareAPipeline(t *testing.T) {
	t.Parallel()
	rdb, c := setup(t)
	step := func(name string) func(context.Context) {
		return func(ctx context.Context) {
			echo(ctx, t, rdb, name+"-1")
			echo(ctx, t, rdb, name+"-2")
		}
	}
	redisbatch.Run(t.Context(), step("a"), step("b"), step("c"))
	if p, s := c.pipelines.Load(), c.single.Load(); p != 1 || s != 3 {
		t.Fatalf("%d pipelines and %d single commands, want 1 and 3", p, s)
	}
}

// TestStepWithoutRedis: a step that sends nothing does not hold the other's
// command, which goes alone as soon as that step has returned.
func TestStepWithoutRedis(t *testing.T) {
	t.Parallel()
	rdb, c := setup(t)
	redisbatch.Run(t.Context(), func(ctx context.Context) { echo(ctx, t, rdb, "x") }, func(context.Context) {})
	if p, s := c.pipelines.Load(), c.single.Load(); p != 0 || s != 1 {
		t.Fatalf("%d pipelines and %d single commands, want 0 and 1", p, s)
	}
}

// TestOutsideRun: commands outside a Run pass straight through.
func TestOutsideRun(t *testing.T) {
	t.Parallel()
	rdb, c := setup(t)
	echo(t.Context(), t, rdb, "plain")
	if p, s := c.pipelines.Load(), c.single.Load(); p != 0 || s != 1 {
		t.Fatalf("%d pipelines and %d single commands, want 0 and 1", p, s)
	}
}

// TestLeave: a step that leaves while it waits for something else does not
// hold the others' first commands, which go in one pipeline at once (the
// step waits for them here: were they held for it, they would wait the
// whole hold); what it sends afterwards goes on its own.
func TestLeave(t *testing.T) {
	t.Parallel()
	rdb, c := setup(t)
	sent := make(chan struct{}, 2)
	other := func(name string) func(context.Context) {
		return func(ctx context.Context) {
			echo(ctx, t, rdb, name)
			sent <- struct{}{}
		}
	}
	began := time.Now()
	redisbatch.Run(t.Context(), func(ctx context.Context) {
		redisbatch.Leave(ctx)
		<-sent
		<-sent
		echo(ctx, t, rdb, "after")
	}, other("a"), other("b"))
	if p, s := c.pipelines.Load(), c.single.Load(); p != 1 || s != 1 {
		t.Fatalf("%d pipelines and %d single commands, want 1 and 1", p, s)
	}
	if d := time.Since(began); d >= 20*time.Millisecond {
		t.Fatalf("the others waited %v for the step that left", d)
	}
}

// TestErrorOfACommandSentAlone: a held command sent alone (the other step
// left or returned) carries its error back, so a script not yet loaded
// falls back from EVALSHA to EVAL, and a command Redis refuses fails.
func TestErrorOfACommandSentAlone(t *testing.T) {
	t.Parallel()
	rdb, _ := setup(t)
	ctx := t.Context()
	key := testutil.Prefix(t) + "str"
	if err := rdb.Set(ctx, key, "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	word := "never-loaded-" + testutil.RandomHex(8)
	script := redis.NewScript("return '" + word + "'")
	var got string
	var scriptErr, incrErr error
	redisbatch.Run(ctx,
		func(ctx context.Context) { redisbatch.Leave(ctx) },
		func(ctx context.Context) { got, scriptErr = script.Run(ctx, rdb, nil).Text() })
	redisbatch.Run(ctx,
		func(context.Context) {},
		func(ctx context.Context) { incrErr = rdb.Incr(ctx, key).Err() })
	if scriptErr != nil || got != word {
		t.Fatalf("script sent alone = %q, %v; want %q (EVALSHA's NOSCRIPT, then EVAL)", got, scriptErr, word)
	}
	if incrErr == nil || !strings.Contains(incrErr.Error(), "not an integer") {
		t.Fatalf("INCR of a string sent alone: err = %v, want Redis's refusal", incrErr)
	}
}
