package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// postgresSchema creates a schema of the scenario's own in the database at
// base and returns a DSN whose search_path is that schema, and what drops
// it (bench/pipeline does the same; a fresh schema per scenario keeps one
// scenario's rows from slowing the next).
func postgresSchema(ctx context.Context, base string) (dsn string, drop func(), err error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, fmt.Errorf("-database: %w", err)
	}
	admin := withoutPoolParams(u)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("postgres at %s does not answer: %w", u.Redacted(), err)
	}
	defer conn.Close(context.Background())
	schema := "bench_rl_" + randomHex(6)
	if _, err := conn.Exec(cctx, "CREATE SCHEMA "+schema); err != nil {
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

// withoutPoolParams drops pool_max_conns, llmq's own parameter (store.Open),
// which pgx does not know.
func withoutPoolParams(u *url.URL) string {
	plain := *u
	q := plain.Query()
	q.Del("pool_max_conns")
	plain.RawQuery = q.Encode()
	return plain.String()
}

// newRedis returns a client of database db of the server at rawURL, and
// that URL with the database number replaced, for the worker processes.
func newRedis(ctx context.Context, rawURL string, db int) (*redis.Client, string, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("-redis: %w", err)
	}
	opt.DB = db
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, "", fmt.Errorf("redis at %s does not answer: %w", opt.Addr, err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		_ = c.Close()
		return nil, "", fmt.Errorf("-redis: %w", err)
	}
	u.Path = "/" + strconv.Itoa(db)
	return c, u.String(), nil
}

// cleanQueues deletes the scenario's asynq queues and every key left under
// them, and llmq's keys under prefix, so DB 10 does not grow from run to
// run.
func cleanQueues(rdb redis.UniversalClient, qnames []string, prefix string) {
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
	for _, p := range patterns {
		iter := rdb.Scan(ctx, 0, p, 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			_ = rdb.Del(ctx, keys[:n]...).Err()
			keys = keys[n:]
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// workerBinary returns the worker binary to run: path when given, else one
// built now from ./cmd/worker into a temporary directory (removed by
// cleanup), so every scenario runs the code of the tree.
func workerBinary(ctx context.Context, path string) (bin string, cleanup func(), err error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", nil, fmt.Errorf("-worker: %w", err)
		}
		return path, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "llmq-bench-rl-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "worker")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/llmq/llmq/cmd/worker").CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build the worker: %w\n%s", err, out)
	}
	return bin, func() { _ = os.RemoveAll(dir) }, nil
}

// process is a worker process of a scenario.
type process struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startProcess runs bin with environ (and PATH, HOME) and waits until it
// prints ready.
func startProcess(ctx context.Context, bin string, environ []string, ready string) (*process, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(append([]string{}, environ...), "PATH="+os.Getenv("PATH"), "HOME="+os.Getenv("HOME"))
	p := &process{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(p.out.String(), ready) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited before it was ready:\n%s", filepath.Base(bin), p.out.String())
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s not ready after a minute:\n%s", filepath.Base(bin), p.out.String())
		}
	}
	return p, nil
}

// stop sends SIGTERM (the worker's graceful shutdown), then SIGKILL if it
// has not exited within 15 s.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
