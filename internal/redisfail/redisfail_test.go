package redisfail_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisfail"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// client is a client of the server at addr that tries each command once,
// so a stopped server fails it at once.
func client(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A stopped server, a replica refusing writes (as the old master does after
// a Sentinel failover) and a script writing on it are unavailable; Redis
// answering about the command itself, a cancelled caller and nil are not.
func TestUnavailableOnARealServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testutil.StartRedis(t)
	c := client(t, srv.Addr)

	if err := c.Set(ctx, "k", "v", 0).Err(); redisfail.Unavailable(err) {
		t.Fatalf("a served command: %v", err)
	}
	err := c.HGet(ctx, "k", "f").Err()
	if err == nil || redisfail.Unavailable(err) {
		t.Fatalf("WRONGTYPE is about the command, got %v", err)
	}
	if err := c.Eval(ctx, "return redis.call('NOSUCHCOMMAND')", nil).Err(); err == nil || redisfail.Unavailable(err) {
		t.Fatalf("a script's own error is about the script, got %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Get(cancelled, "k").Err(); !errors.Is(err, context.Canceled) || redisfail.Unavailable(err) {
		t.Fatalf("a caller that left is not an outage, got %v", err)
	}

	// A replica of a master that does not answer (nothing listens on port
	// 1): it still serves reads, and refuses writes and writing scripts
	// with READONLY.
	if err := c.ReplicaOf(ctx, "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	err = c.Set(ctx, "k", "w", 0).Err()
	if !redisfail.Unavailable(err) {
		t.Fatalf("SET on a replica: %v, want unavailable", err)
	}
	err = c.Eval(ctx, "return redis.call('SET', KEYS[1], 'w')", []string{"k"}).Err()
	if !redisfail.Unavailable(err) {
		t.Fatalf("a writing script on a replica: %v, want unavailable", err)
	}
	if err := c.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	err = c.Get(ctx, "k").Err()
	if !redisfail.Unavailable(err) {
		t.Fatalf("GET from a stopped server: %v, want unavailable", err)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Fatalf("GET from a stopped server: %T %v, want a dial error", err, err)
	}
	// Wrapped as llmq's packages wrap it.
	if err := fmt.Errorf("budget: Status of tenant t: %w", err); !redisfail.Unavailable(err) {
		t.Fatalf("a wrapped dial error: %v, want unavailable", err)
	}
	if redisfail.Unavailable(nil) {
		t.Fatal("nil is unavailable")
	}
}

// The replies of the states a test server cannot be put in at will
// (loading its data, a cluster without a majority...) are the server's own
// error replies, sent by a script, so go-redis reads them as it would read
// the state's; each is also tried wrapped, as llmq's packages wrap errors.
func TestUnavailableReplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := client(t, testutil.StartRedis(t).Addr)
	for _, r := range []struct {
		reply string
		want  bool
	}{
		{"LOADING Redis is loading the dataset in memory", true},
		{"READONLY You can't write against a read only replica.", true},
		{"CLUSTERDOWN The cluster is down", true},
		{"TRYAGAIN Multiple keys request during rehashing of slot", true},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", true},
		{"NOREPLICAS Not enough good replicas to write.", true},
		{"ERR max number of clients reached", true},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{"NOSCRIPT No matching script. Please use EVAL.", false},
		{"ERR unknown command 'FOO'", false},
	} {
		err := c.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, r.reply).Err()
		if err == nil {
			t.Fatalf("%s: the script answered no error", r.reply)
		}
		if got := redisfail.Unavailable(err); got != r.want {
			t.Errorf("Unavailable(%q) = %v, want %v", err, got, r.want)
		}
		if got := redisfail.Unavailable(fmt.Errorf("limiter: %w", err)); got != r.want {
			t.Errorf("Unavailable(wrapped %q) = %v, want %v", err, got, r.want)
		}
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{redis.ErrPoolTimeout, true},
		{fmt.Errorf("queue: %w", redis.ErrPoolTimeout), true},
		{context.DeadlineExceeded, true},
		{redis.Nil, false},
		{errors.New("budget: tenant t has no tier"), false},
	} {
		if got := redisfail.Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
