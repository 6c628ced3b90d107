package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterURL is the shared Redis Cluster tests use, as a redisconn URL:
// TEST_REDIS_CLUSTER_URL, by default the three masters scripts/services
// starts.
func ClusterURL() string {
	if u := os.Getenv("TEST_REDIS_CLUSTER_URL"); u != "" {
		return u
	}
	return "redis+cluster://127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303"
}

// SentinelURL is the shared Sentinel group tests use, as a redisconn URL:
// TEST_REDIS_SENTINEL_URL, by default the group scripts/services starts.
// Tests that kill or fail over its master use StartSentinelGroup instead.
func SentinelURL() string {
	if u := os.Getenv("TEST_REDIS_SENTINEL_URL"); u != "" {
		return u
	}
	return "redis+sentinel://127.0.0.1:27311,127.0.0.1:27312,127.0.0.1:27313/" + SentinelMaster
}

// SentinelMaster is the master name of the shared Sentinel group and of
// every private one.
const SentinelMaster = "llmq"

// SentinelGroup is a private Sentinel group started for one test: a master,
// its replica and three sentinels (quorum 2) watching them under the name
// SentinelMaster.
type SentinelGroup struct {
	tb        testing.TB
	master    *RedisServer
	replica   *RedisServer
	sentinels []*RedisServer
	clients   []*redis.SentinelClient // one per sentinel, in the same order
}

// StartSentinelGroup starts a master and its replica (StartRedis) and three
// sentinels on free ports (down-after-milliseconds 1000, failover-timeout
// 3000, parallel-syncs 1), and waits until the replica is in sync and every
// sentinel knows the master, the replica and the other two sentinels, so a
// failover can start at once. Everything is killed when the test ends.
func StartSentinelGroup(tb testing.TB) *SentinelGroup {
	tb.Helper()
	// A new replica's first sync, and the old master's after a planned
	// failover, start at once rather than after the default 5 s.
	master := StartRedis(tb, "--repl-diskless-sync-delay", "0")
	_, mport, _ := strings.Cut(master.Addr, ":")
	replica := StartRedis(tb, "--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", mport)
	g := &SentinelGroup{tb: tb, master: master, replica: replica}
	// Sentinels find each other through the master's hello channel, which
	// each publishes to every 2 s. Each config names the other two (their
	// ids and the ports found free for them) so the group is ready at once.
	// A sentinel that has to take another port is found again by its id.
	peers := make([]sentinelPeer, 3)
	for i := range peers {
		peers[i] = sentinelPeer{id: RandomHex(20), port: FreePort(tb)}
	}
	for i := range peers {
		s := startSentinel(tb, master.Addr, peers, i)
		g.sentinels = append(g.sentinels, s)
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
		tb.Cleanup(func() { _ = c.Close() })
		g.clients = append(g.clients, c)
	}
	err := waitUntil(15*time.Second, func() error {
		if err := replicaInSync(master.Addr, replica.Addr); err != nil {
			return err
		}
		for i, c := range g.clients {
			m, err := c.Master(context.Background(), SentinelMaster).Result()
			if err != nil {
				return fmt.Errorf("sentinel %s: %v", g.sentinels[i].Addr, err)
			}
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" || m["flags"] != "master" {
				return fmt.Errorf("sentinel %s sees the master with flags %s, %s replicas, %s other sentinels",
					g.sentinels[i].Addr, m["flags"], m["num-slaves"], m["num-other-sentinels"])
			}
			// A replica the sentinel has not yet asked for INFO is not one
			// it would promote.
			r, err := c.Replicas(context.Background(), SentinelMaster).Result()
			if err != nil || len(r) != 1 || r[0]["flags"] != "slave" || r[0]["master-link-status"] != "ok" {
				return fmt.Errorf("sentinel %s sees the replica as %v (%v)", g.sentinels[i].Addr, r, err)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("sentinel group did not become ready: %v", err)
	}
	return g
}

// sentinelPeer is a sentinel of a group as the others' configs name it.
type sentinelPeer struct {
	id   string // its myid: 40 hex digits
	port int
}

// startSentinel starts peers[self], watching the master at masterAddr and
// knowing the other peers, on its port or, when that was taken since it was
// found free, on another (as StartRedis does).
func startSentinel(tb testing.TB, masterAddr string, peers []sentinelPeer, self int) *RedisServer {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	host, port, _ := strings.Cut(masterAddr, ":")
	s := &RedisServer{tb: tb}
	tb.Cleanup(s.Stop)
	for attempt := 1; ; attempt++ {
		p := peers[self].port
		if attempt > 1 {
			p = FreePort(tb)
		}
		dir := tb.TempDir()
		s.Dir = dir
		s.Addr = fmt.Sprintf("127.0.0.1:%d", p)
		// The sentinel rewrites this file as it learns the group, so it
		// lives in a directory of its own.
		conf := filepath.Join(dir, "sentinel.conf")
		lines := []string{
			"port " + strconv.Itoa(p),
			"bind 127.0.0.1",
			"dir " + dir,
			"logfile " + filepath.Join(dir, "redis.log"),
			"sentinel myid " + peers[self].id,
			"sentinel resolve-hostnames no",
			fmt.Sprintf("sentinel monitor %s %s %s 2", SentinelMaster, host, port),
			"sentinel down-after-milliseconds " + SentinelMaster + " 1000",
			"sentinel failover-timeout " + SentinelMaster + " 3000",
			"sentinel parallel-syncs " + SentinelMaster + " 1",
		}
		for i, peer := range peers {
			if i != self {
				lines = append(lines, fmt.Sprintf("sentinel known-sentinel %s 127.0.0.1 %d %s", SentinelMaster, peer.port, peer.id))
			}
		}
		text := strings.Join(lines, "\n") + "\n"
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			tb.Fatalf("sentinel config: %v", err)
		}
		s.args = []string{bin, conf, "--sentinel"}
		err := s.start()
		if err == nil {
			return s
		}
		if attempt == 5 {
			tb.Fatalf("redis-server --sentinel: %v", err)
		}
	}
}

// URL is the group's redis+sentinel:// URL, for redisconn.Parse.
func (g *SentinelGroup) URL() string {
	addrs := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		addrs[i] = s.Addr
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + SentinelMaster
}

// Master is the server started as the master. After a failover it may be a
// replica, or killed.
func (g *SentinelGroup) Master() *RedisServer { return g.master }

// Replica is the server started as the replica. After a failover it may be
// the master.
func (g *SentinelGroup) Replica() *RedisServer { return g.replica }

// MasterAddr is the master's address as the first sentinel that answers
// names it.
func (g *SentinelGroup) MasterAddr() string {
	g.tb.Helper()
	addr, err := g.masterAddr(g.clients)
	if err != nil {
		g.tb.Fatalf("sentinel get-master-addr-by-name %s: %v", SentinelMaster, err)
	}
	return addr
}

func (g *SentinelGroup) masterAddr(clients []*redis.SentinelClient) (string, error) {
	var errs []error
	for _, c := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		hp, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		cancel()
		if err == nil && len(hp) == 2 {
			return hp[0] + ":" + hp[1], nil
		}
		if err == nil {
			err = fmt.Errorf("reply %q", hp)
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

// KillMaster kills the current master (SIGKILL, as a crash) and returns
// its address, for WaitPromoted.
func (g *SentinelGroup) KillMaster() string {
	g.tb.Helper()
	addr := g.MasterAddr()
	for _, s := range []*RedisServer{g.master, g.replica} {
		if s.Addr == addr {
			s.Stop()
			return addr
		}
	}
	g.tb.Fatalf("the sentinels name %s as the master, which is neither %s nor %s", addr, g.master.Addr, g.replica.Addr)
	return ""
}

// Failover asks the first sentinel for a planned failover (SENTINEL
// FAILOVER) and returns the address of the master it replaces, for
// WaitPromoted. The old master keeps running, and takes writes, until the
// sentinels make it a replica of the new one some seconds later.
func (g *SentinelGroup) Failover() string {
	g.tb.Helper()
	old := g.MasterAddr()
	// NOGOODSLAVE while a replica just promoted or started is not yet
	// one the sentinel trusts: ask again.
	err := waitUntil(5*time.Second, func() error {
		return g.clients[0].Failover(context.Background(), SentinelMaster).Err()
	})
	if err != nil {
		g.tb.Fatalf("sentinel failover %s on %s: %v", SentinelMaster, g.sentinels[0].Addr, err)
	}
	return old
}

// WaitPromoted waits until every sentinel of the group that still answers
// names the same master other than oldAddr, and that server says it is a
// master; it returns that master's address, or fails the test after
// timeout. A sentinel names the replica it chose as soon as the failover
// starts, before the replica has taken the role, hence the second check.
func (g *SentinelGroup) WaitPromoted(tb testing.TB, oldAddr string, timeout time.Duration) string {
	tb.Helper()
	var addr string
	err := waitUntil(timeout, func() error {
		addr = ""
		for i, c := range g.clients {
			a, err := g.masterAddr([]*redis.SentinelClient{c})
			if err != nil {
				return fmt.Errorf("sentinel %s: %v", g.sentinels[i].Addr, err)
			}
			switch {
			case a == oldAddr:
				return fmt.Errorf("sentinel %s still names %s", g.sentinels[i].Addr, oldAddr)
			case addr != "" && a != addr:
				return fmt.Errorf("sentinels name %s and %s", addr, a)
			}
			addr = a
		}
		return isMaster(addr)
	})
	if err != nil {
		tb.Fatalf("no new master for %s within %v: %v", oldAddr, timeout, err)
	}
	return addr
}

// StartRedisClusterURL starts a private three-master cluster as
// StartRedisCluster does, and returns its redis+cluster:// URL (for
// redisconn.Parse) and its nodes.
func StartRedisClusterURL(tb testing.TB) (url string, nodes []*RedisServer) {
	tb.Helper()
	nodes = startCluster(tb, 0)
	return clusterURL(nodes), nodes
}

// StartRedisClusterWithReplicas starts a private cluster of three masters,
// each with one replica, and returns its redis+cluster:// URL and its six
// nodes, once every replica is in sync. KillClusterMaster fails over one of
// its masters.
func StartRedisClusterWithReplicas(tb testing.TB) (url string, nodes []*RedisServer) {
	tb.Helper()
	nodes = startCluster(tb, 1)
	return clusterURL(nodes), nodes
}

func clusterURL(nodes []*RedisServer) string {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// startCluster starts 3*(1+replicas) cluster nodes on free ports (no
// persistence, cluster-node-timeout 2000), joins them with redis-cli
// --cluster create, and waits until every node reports cluster_state:ok and
// knows every other, and every replica is in sync with its master.
func startCluster(tb testing.TB, replicas int) []*RedisServer {
	tb.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		tb.Fatalf("redis-cli is not installed (apt-get install redis-tools): %v", err)
	}
	var nodes []*RedisServer
	var addrs []string
	for i := 0; i < 3*(1+replicas); i++ {
		s := StartRedis(tb, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--repl-diskless-sync-delay", "0")
		nodes = append(nodes, s)
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	err = waitUntil(15*time.Second, func() error {
		for _, n := range nodes {
			if err := clusterNodeOK(n.Addr, len(nodes)); err != nil {
				return err
			}
			if m, err := masterOf(n.Addr); err != nil {
				return err
			} else if m != "" {
				if err := replicaInSync(m, n.Addr); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("redis cluster did not become ready: %v", err)
	}
	return nodes
}

// KillClusterMaster kills the cluster master at addr, one of nodes (SIGKILL,
// as a crash), waits until its replica has taken over its slots and every
// other node reports cluster_state:ok again, and returns the promoted
// replica's address. It fails the test when addr is not a master with a
// replica, or when the failover takes over 20 s. With cluster-node-timeout
// 2000 it takes three to four seconds.
func KillClusterMaster(tb testing.TB, nodes []*RedisServer, addr string) (promoted string) {
	tb.Helper()
	i := slices.IndexFunc(nodes, func(n *RedisServer) bool { return n.Addr == addr })
	if i < 0 {
		tb.Fatalf("%s is none of the cluster's nodes", addr)
	}
	for _, n := range nodes {
		if m, err := masterOf(n.Addr); err != nil {
			tb.Fatalf("%v", err)
		} else if m == addr {
			promoted = n.Addr
		}
	}
	if promoted == "" {
		tb.Fatalf("%s is not a cluster master with a replica", addr)
	}
	nodes[i].Stop()
	err := waitUntil(20*time.Second, func() error {
		if err := isMaster(promoted); err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Addr == addr {
				continue
			}
			if err := clusterNodeOK(n.Addr, len(nodes)); err != nil {
				return err
			}
			if err := clusterSeesMaster(n.Addr, promoted); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("cluster did not recover from losing master %s: %v", addr, err)
	}
	return promoted
}

// clusterNodeOK checks that the node at addr reports cluster_state:ok and
// knows all size nodes of its cluster.
func clusterNodeOK(addr string, size int) error {
	var info string
	err := withClient(addr, func(c *redis.Client) (err error) {
		info, err = c.ClusterInfo(context.Background()).Result()
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster info on %s: %v", addr, err)
	}
	if infoField(info, "cluster_state") != "ok" || infoField(info, "cluster_known_nodes") != strconv.Itoa(size) {
		return fmt.Errorf("%s reports cluster_state:%s, %s known nodes", addr,
			infoField(info, "cluster_state"), infoField(info, "cluster_known_nodes"))
	}
	return nil
}

// clusterSeesMaster checks that the node at addr lists master as a master.
func clusterSeesMaster(addr, master string) error {
	var nodes string
	err := withClient(addr, func(c *redis.Client) (err error) {
		nodes, err = c.ClusterNodes(context.Background()).Result()
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster nodes on %s: %v", addr, err)
	}
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		// <id> <ip:port@cport> <flags> ...
		if len(f) > 2 && strings.HasPrefix(f[1], master+"@") {
			if slices.Contains(strings.Split(f[2], ","), "master") {
				return nil
			}
			return fmt.Errorf("%s lists %s with flags %s", addr, master, f[2])
		}
	}
	return fmt.Errorf("%s does not list %s", addr, master)
}

// replicaInSync checks that the master at masterAddr has one replica online
// and that the replica at replicaAddr has its link to it up.
func replicaInSync(masterAddr, replicaAddr string) error {
	var m, r string
	err := withClient(masterAddr, func(c *redis.Client) (err error) {
		m, err = c.Info(context.Background(), "replication").Result()
		return err
	})
	if err == nil {
		err = withClient(replicaAddr, func(c *redis.Client) (err error) {
			r, err = c.Info(context.Background(), "replication").Result()
			return err
		})
	}
	switch {
	case err != nil:
		return err
	case infoField(m, "connected_slaves") != "1":
		return fmt.Errorf("master %s has connected_slaves:%s", masterAddr, infoField(m, "connected_slaves"))
	case infoField(r, "master_link_status") != "up":
		return fmt.Errorf("replica %s has master_link_status:%s", replicaAddr, infoField(r, "master_link_status"))
	}
	return nil
}

// masterOf returns the address of the master the server at addr replicates,
// or "" when it is a master.
func masterOf(addr string) (string, error) {
	var info string
	err := withClient(addr, func(c *redis.Client) (err error) {
		info, err = c.Info(context.Background(), "replication").Result()
		return err
	})
	if err != nil {
		return "", fmt.Errorf("info replication on %s: %v", addr, err)
	}
	if infoField(info, "role") == "master" {
		return "", nil
	}
	return infoField(info, "master_host") + ":" + infoField(info, "master_port"), nil
}

// isMaster checks that the server at addr says its role is master.
func isMaster(addr string) error {
	m, err := masterOf(addr)
	if err != nil {
		return err
	}
	if m != "" {
		return fmt.Errorf("%s is still a replica of %s", addr, m)
	}
	return nil
}

// withClient runs f with a client of the server at addr that neither
// retries nor waits long, for polling servers that may be down.
func withClient(addr string, f func(*redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	defer c.Close()
	return f(c)
}

// infoField is the value of field name in the text of INFO or CLUSTER INFO.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// waitUntil calls check every 20 ms until it returns nil, for at most
// timeout, and returns check's last error.
func waitUntil(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
