package testutil

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisconn"
)

func TestMain(m *testing.M) { VerifyNoLeaks(m) }

// connect returns a client of the Redis url names, through redisconn as
// llmq connects, closed when the test ends.
func connect(t *testing.T, url string) redis.UniversalClient {
	t.Helper()
	o, err := redisconn.Parse(url)
	if err != nil {
		t.Fatalf("redisconn.Parse(%q): %v", url, err)
	}
	c := o.NewClient()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// writeUntilOn sets key to value through c until the server at addr holds
// it, for at most timeout: a client following a failover may still reach
// the old master, or fail, for a moment.
func writeUntilOn(t *testing.T, c redis.UniversalClient, addr, key, value string, timeout time.Duration) time.Duration {
	t.Helper()
	ctx := context.Background()
	direct := redis.NewClient(&redis.Options{Addr: addr})
	defer direct.Close()
	start := time.Now()
	err := waitUntil(timeout, func() error {
		if err := c.Set(ctx, key, value, 0).Err(); err != nil {
			return err
		}
		if got, err := direct.Get(ctx, key).Result(); err != nil || got != value {
			return fmt.Errorf("%s holds %q (%v)", addr, got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set %s through the client did not reach %s within %v: %v", key, addr, timeout, err)
	}
	return time.Since(start)
}

// waitReplicated waits until the replica at replicaAddr has everything its
// master at masterAddr has written, so a failover loses nothing.
func waitReplicated(t *testing.T, masterAddr, replicaAddr string) {
	t.Helper()
	offset := func(addr, field string) int64 {
		var info string
		_ = withClient(addr, func(c *redis.Client) (err error) {
			info, err = c.Info(context.Background(), "replication").Result()
			return err
		})
		n, _ := strconv.ParseInt(infoField(info, field), 10, 64)
		return n
	}
	want := offset(masterAddr, "master_repl_offset")
	err := waitUntil(5*time.Second, func() error {
		if got := offset(replicaAddr, "slave_repl_offset"); got < want {
			return fmt.Errorf("replica %s at offset %d, master %s at %d", replicaAddr, got, masterAddr, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestSentinelGroupKillMaster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	g := StartSentinelGroup(t)
	t.Logf("group ready in %v", time.Since(start))
	if got := g.MasterAddr(); got != g.Master().Addr {
		t.Fatalf("the sentinels name %s as the master, want %s", got, g.Master().Addr)
	}
	c := connect(t, g.URL())
	ctx := context.Background()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitReplicated(t, g.Master().Addr, g.Replica().Addr)

	start = time.Now()
	old := g.KillMaster()
	if old != g.Master().Addr {
		t.Fatalf("KillMaster killed %s, want the master %s", old, g.Master().Addr)
	}
	promoted := g.WaitPromoted(t, old, 15*time.Second)
	t.Logf("replica promoted %v after the kill", time.Since(start))
	if promoted != g.Replica().Addr {
		t.Fatalf("promoted %s, want the replica %s", promoted, g.Replica().Addr)
	}
	if got := g.MasterAddr(); got != promoted {
		t.Errorf("MasterAddr is %s after the failover, want %s", got, promoted)
	}
	took := writeUntilOn(t, c, promoted, "k", "after", 10*time.Second)
	t.Logf("the client wrote to the new master %v after its promotion", took)
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "after" {
		t.Fatalf("get k: %q, %v", got, err)
	}
	if n, err := g.Replica().Client().DBSize(ctx).Result(); err != nil || n != 1 {
		t.Errorf("the promoted replica holds %d keys (%v), want the 1 written before the kill", n, err)
	}
}

func TestSentinelGroupPlannedFailover(t *testing.T) {
	t.Parallel()
	g := StartSentinelGroup(t)
	c := connect(t, g.URL())
	ctx := context.Background()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitReplicated(t, g.Master().Addr, g.Replica().Addr)

	start := time.Now()
	old := g.Failover()
	promoted := g.WaitPromoted(t, old, 10*time.Second)
	t.Logf("replica promoted %v after SENTINEL FAILOVER", time.Since(start))
	if old != g.Master().Addr || promoted != g.Replica().Addr {
		t.Fatalf("failover from %s to %s, want from %s to %s", old, promoted, g.Master().Addr, g.Replica().Addr)
	}
	writeUntilOn(t, c, promoted, "k", "after", 10*time.Second)
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "after" {
		t.Fatalf("get k: %q, %v", got, err)
	}
}

func TestClusterWithReplicasKillMaster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	url, nodes := StartRedisClusterWithReplicas(t)
	t.Logf("cluster ready in %v", time.Since(start))
	if len(nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(nodes))
	}
	c := connect(t, url)
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("redisconn gave a %T for %s, want a cluster client", c, url)
	}
	ctx := context.Background()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := cc.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	master := m.Options().Addr
	var replica string
	for _, n := range nodes {
		if a, err := masterOf(n.Addr); err == nil && a == master {
			replica = n.Addr
		}
	}
	waitReplicated(t, master, replica)

	start = time.Now()
	promoted := KillClusterMaster(t, nodes, master)
	t.Logf("replica promoted and cluster ok %v after the kill", time.Since(start))
	if promoted != replica {
		t.Fatalf("promoted %s, want %s's replica %s", promoted, master, replica)
	}
	// go-redis reloads its slot map on MOVED or every
	// ClusterStateReloadInterval (60 s), not when the master of a slot
	// refuses connections (redis/go-redis#3979): until then the client
	// dials the dead master. This reload, which runs in the background,
	// stands for that interval.
	cc.ReloadState(ctx)
	took := writeUntilOn(t, c, promoted, "k", "after", 10*time.Second)
	t.Logf("the client wrote to the new master %v after its promotion", took)
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "after" {
		t.Fatalf("get k: %q, %v", got, err)
	}
}

func TestStartRedisClusterURL(t *testing.T) {
	t.Parallel()
	url, nodes := StartRedisClusterURL(t)
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes))
	}
	c := connect(t, url)
	ctx := context.Background()
	// Keys in all three nodes' slots.
	for i := range 30 {
		k := "k" + strconv.Itoa(i)
		if err := c.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
	for _, n := range nodes {
		if k, err := n.Client().DBSize(ctx).Result(); err != nil || k == 0 {
			t.Errorf("node %s holds %d keys (%v), want some of the 30", n.Addr, k, err)
		}
	}
}

// TestSharedGroups checks that the groups scripts/services starts answer
// where ClusterURL and SentinelURL say.
func TestSharedGroups(t *testing.T) {
	t.Parallel()
	for _, url := range []string{ClusterURL(), SentinelURL()} {
		c := connect(t, url)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		k := Prefix(t) + ":ping"
		err := c.Set(ctx, k, "1", time.Minute).Err()
		if err == nil {
			err = c.Del(ctx, k).Err()
		}
		cancel()
		if err != nil {
			t.Errorf("%s does not answer (run scripts/services, or set TEST_REDIS_CLUSTER_URL and TEST_REDIS_SENTINEL_URL): %v", url, err)
		}
	}
}
