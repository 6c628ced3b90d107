// Package testutil gives tests the real services they run against: a Redis
// database number or key prefix of their own, a Postgres schema of their own,
// the shared Redis Cluster and Sentinel group, and private redis-server
// processes (a single node, a cluster, a Sentinel group) for tests that
// restart, flush, shard or fail over Redis.
//
// Addresses come from TEST_REDIS_URL (default redis://127.0.0.1:6379/0),
// TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test?sslmode=disable),
// TEST_REDIS_CLUSTER_URL and TEST_REDIS_SENTINEL_URL (defaults: the groups
// scripts/services starts; see ClusterURL and SentinelURL).
// Each package uses the Redis DB number listed in docs/ARCHITECTURE.md, so
// packages can run in parallel.
package testutil

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// RedisURL is the Redis server tests use.
func RedisURL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// DatabaseURL is the Postgres database tests use.
func DatabaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// RedisOptions returns options for the test Redis server, database db.
func RedisOptions(tb testing.TB, db int) *redis.Options {
	tb.Helper()
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		tb.Fatalf("TEST_REDIS_URL: %v", err)
	}
	opt.DB = db
	return opt
}

// RedisURLForDB is RedisURL with its database number replaced by db.
func RedisURLForDB(tb testing.TB, db int) string {
	tb.Helper()
	u, err := url.Parse(RedisURL())
	if err != nil {
		tb.Fatalf("TEST_REDIS_URL: %v", err)
	}
	u.Path = "/" + strconv.Itoa(db)
	return u.String()
}

// Redis returns a client of database db of the test Redis server, closed when
// the test ends. It fails the test at once when Redis does not answer.
func Redis(tb testing.TB, db int) *redis.Client {
	tb.Helper()
	c := redis.NewClient(RedisOptions(tb, db))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		tb.Fatalf("redis at %s does not answer (start it, or set TEST_REDIS_URL): %v", RedisURL(), err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// AsynqOpt returns asynq's connection options for database db of the test Redis.
func AsynqOpt(tb testing.TB, db int) asynq.RedisClientOpt {
	tb.Helper()
	o := RedisOptions(tb, db)
	return asynq.RedisClientOpt{Addr: o.Addr, Username: o.Username, Password: o.Password, DB: db}
}

// RandomHex returns n random bytes, hex-encoded.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Prefix returns a key prefix unique to this test run of tb.
func Prefix(tb testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_", "{", "", "}", "").Replace(tb.Name())
	return "test:" + name + ":" + RandomHex(4)
}

// Postgres creates a schema of its own for tb and returns a DSN whose
// search_path is that schema. The schema is dropped when the test ends.
func Postgres(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dsn, drop, err := NewSchema(ctx, DatabaseURL(), "t_")
	if err != nil {
		tb.Fatalf("%v (start it, or set TEST_DATABASE_URL)", err)
	}
	tb.Cleanup(drop)
	return dsn
}

// NewSchema creates a schema named prefix and random hex in the database at
// base, and returns a DSN whose search_path is that schema and what drops
// it. Tests use it through Postgres; benchmark programs, which have no
// testing.TB, call it directly so each run migrates a fresh schema.
func NewSchema(ctx context.Context, base, prefix string) (dsn string, drop func(), err error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, fmt.Errorf("database URL: %w", err)
	}
	admin := PlainDSN(base)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("postgres at %s does not answer: %w", u.Redacted(), err)
	}
	defer conn.Close(context.Background())
	schema := prefix + RandomHex(6)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, fmt.Errorf("create schema: %w", err)
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}

// PlainDSN drops llmq's own URL parameters (pool_max_conns, read by
// store.Open) from dsn, which pgx would otherwise send to the server as
// settings.
func PlainDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Del("pool_max_conns")
	u.RawQuery = q.Encode()
	return u.String()
}

// PurgeRedis deletes asynq queues and every key left under them, and every
// key under prefix (none when prefix is empty), so a test or benchmark run
// leaves its Redis database as it found it.
func PurgeRedis(rdb redis.UniversalClient, qnames []string, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in := asynq.NewInspectorFromRedisClient(rdb)
	var patterns []string
	for _, q := range qnames {
		_ = in.DeleteQueue(q, true)
		patterns = append(patterns, "asynq:{"+q+"}:*")
	}
	if prefix != "" {
		patterns = append(patterns, prefix+":*")
	}
	// A cluster's keys are scanned node by node, and deleted one by one
	// (a DEL of several keys must keep to one slot).
	purge := func(ctx context.Context, node redis.Cmdable) error {
		for _, p := range patterns {
			iter := node.Scan(ctx, 0, p, 1000).Iterator()
			for iter.Next(ctx) {
				_ = node.Del(ctx, iter.Val()).Err()
			}
		}
		return nil
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return purge(ctx, c) })
	} else {
		_ = purge(ctx, rdb)
	}
}

// WithSearchPath returns dsn with its search_path set to schema.
func WithSearchPath(tb testing.TB, dsn, schema string) string {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("TEST_DATABASE_URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// RedisServer is a private redis-server process started for one test.
type RedisServer struct {
	Addr   string
	Dir    string
	args   []string
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once the process ends
	tb     testing.TB
}

// StartRedis starts a redis-server of its own on a free port, with no
// persistence unless extra arguments ask for it, and stops it when the test
// ends. Tests that restart or flush Redis use it, never the shared server.
// A port taken between being found free and the server binding it (another
// test's connection can take it as its local port) makes the server exit at
// once: another port is tried.
func StartRedis(tb testing.TB, extra ...string) *RedisServer {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	s := &RedisServer{tb: tb}
	tb.Cleanup(s.Stop)
	for attempt := 1; ; attempt++ {
		port := FreePort(tb)
		dir := tb.TempDir() // each try its own, so no nodes.conf names a port it lost
		s.Dir = dir
		s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
		s.args = append([]string{
			bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
		}, extra...)
		err := s.start()
		if err == nil {
			return s
		}
		if attempt == 5 {
			tb.Fatalf("redis-server: %v", err)
		}
	}
}

// Start starts (or restarts) the server on its port and waits until it
// answers.
func (s *RedisServer) Start() {
	s.tb.Helper()
	if err := s.start(); err != nil {
		s.tb.Fatalf("redis-server: %v", err)
	}
}

func (s *RedisServer) start() error {
	cmd := exec.Command(s.args[0], s.args[1:]...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s.cmd, s.exited = cmd, exited
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			s.cmd, s.exited = nil, nil
			logTail, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
			if len(logTail) > 2000 {
				logTail = logTail[len(logTail)-2000:]
			}
			return fmt.Errorf("on %s exited before answering (%v):\n%s", s.Addr, werr, logTail)
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("on %s did not answer: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (as a crash would) and waits for it to exit.
func (s *RedisServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.exited = nil, nil
}

// Client returns a client of s, closed when the test ends.
func (s *RedisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// StartRedisCluster starts three redis-server processes in cluster mode on
// free ports, joins them into one cluster (no replicas) and returns a cluster
// client. Everything is stopped when the test ends. StartRedisClusterURL
// gives the same cluster as a URL and its nodes.
func StartRedisCluster(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	var addrs []string
	for _, n := range startCluster(tb, 0) {
		addrs = append(addrs, n.Addr)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// SyncBuffer is an io.Writer that a running process or goroutines write
// while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// RunMainIfChild makes a test binary be its program: when the environment
// carries marker (set by MainOutput), it sets os.Args to name and the
// arguments MainOutput passed, runs main and exits 0 (main exits itself on
// failure). Call it first in TestMain.
func RunMainIfChild(marker, name string, main func()) {
	if os.Getenv(marker) != "1" {
		return
	}
	os.Args = append([]string{name}, strings.Fields(os.Getenv(marker+"_ARGS"))...)
	main()
	os.Exit(0)
}

// MainOutput runs the test binary again as its program (see
// RunMainIfChild) with env and args, and returns what it wrote and its exit
// status.
func MainOutput(tb testing.TB, marker string, env []string, args ...string) (stdout, stderr string, code int) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(env, marker+"=1", marker+"_ARGS="+strings.Join(args, " "))
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		tb.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// CheckOneLineFailure checks what a program printed when it refused to
// start: exit status 1, nothing on stdout, and on stderr exactly one line
// that starts with "<name>: " and contains each of want.
func CheckOneLineFailure(tb testing.TB, name, stdout, stderr string, code int, want ...string) {
	tb.Helper()
	if code != 1 {
		tb.Errorf("exit code %d, want 1", code)
	}
	if stdout != "" {
		tb.Errorf("stdout: %q, want nothing", stdout)
	}
	if !strings.HasPrefix(stderr, name+": ") || !strings.HasSuffix(stderr, "\n") || strings.Count(stderr, "\n") != 1 {
		tb.Fatalf("stderr is not one line starting with %q:\n%s", name+": ", stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			tb.Errorf("%q does not name %s", stderr, w)
		}
	}
}

// Eventually waits until cond holds, checking every 10 ms, and fails the
// test when it still does not after timeout.
func Eventually(tb testing.TB, timeout time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CheckOneLineError checks an error a program's run refused to start with:
// not nil, one line, naming each of want.
func CheckOneLineError(tb testing.TB, err error, want ...string) {
	tb.Helper()
	if err == nil {
		tb.Fatal("the configuration was accepted")
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		tb.Errorf("error is more than one line: %q", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			tb.Errorf("error %q does not name %s", msg, w)
		}
	}
}

// Clock is a clock tests move by hand, for limiters, budgets, the
// simulator and handlers that take a Now func. It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// VerifyNoLeaks runs a package's tests (as its TestMain) and fails them when
// goroutines outlive them, except those of connection pools that wind down
// on their own after the tests: Redis and Postgres clients' sockets,
// database/sql's opener and idle HTTP keep-alives.
func VerifyNoLeaks(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// RedisCPU is the server's used_cpu_user + used_cpu_sys (INFO cpu).
func RedisCPU(ctx context.Context, rdb redis.UniversalClient) (time.Duration, bool) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var total float64
	found := 0
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_user" && k != "used_cpu_sys") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, false
		}
		total += f
		found++
	}
	return time.Duration(total * float64(time.Second)), found == 2
}
