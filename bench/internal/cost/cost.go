// Package cost measures what a benchmark run costs besides time, so the
// benchmark programs under bench/ report it alike: the CPU time of this
// process, of the Redis server and of the Postgres server, and the round
// trips a Redis client makes.
package cost

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/testutil"
)

// CPU are the CPU times a run divides by its jobs to say where the work
// went: this process (API, workers, simulated provider and producers
// alike), the Redis server and the Postgres server. The servers' times are
// whole-server times: on a machine others use, they include their work
// too, so they are upper bounds. A time that cannot be read is negative.
type CPU struct {
	Self, Redis, Postgres time.Duration
}

// Sub is t − u, each time negative when either side's is.
func (t CPU) Sub(u CPU) CPU {
	return t.combine(u, func(a, b time.Duration) time.Duration { return a - b })
}

// Add is t + u, each time negative when either side's is.
func (t CPU) Add(u CPU) CPU {
	return t.combine(u, func(a, b time.Duration) time.Duration { return a + b })
}

func (t CPU) combine(u CPU, f func(a, b time.Duration) time.Duration) CPU {
	g := func(a, b time.Duration) time.Duration {
		if a < 0 || b < 0 {
			return -1
		}
		return f(a, b)
	}
	return CPU{Self: g(t.Self, u.Self), Redis: g(t.Redis, u.Redis), Postgres: g(t.Postgres, u.Postgres)}
}

// CPUReader reads the three times.
type CPUReader struct {
	rdb *redis.Client
	// localPG is set when Postgres runs on this machine, where its
	// processes' times can be read from /proc.
	localPG bool
}

// NewCPUReader reads the Redis server rdb talks to, and the Postgres
// server of databaseURL when it is on this machine.
func NewCPUReader(rdb *redis.Client, databaseURL string) *CPUReader {
	return &CPUReader{rdb: rdb, localPG: isLoopback(databaseURL)}
}

// Read returns the three times now.
func (c *CPUReader) Read(ctx context.Context) CPU {
	t := CPU{Self: selfCPU(), Redis: -1, Postgres: -1}
	if d, ok := testutil.RedisCPU(ctx, c.rdb); ok {
		t.Redis = d
	}
	if c.localPG {
		if d, ok := postgresCPU(); ok {
			t.Postgres = d
		}
	}
	return t
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is Linux's USER_HZ, the unit of /proc/<pid>/stat times; it is
// 100 on every Linux architecture Go supports.
const clockTick = time.Second / 100

// postgresCPU sums utime, stime, cutime and cstime of every process named
// postgres (the postmaster and its backends, and the postmaster's exited
// children), from /proc.
func postgresCPU() (time.Duration, bool) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	found := false
	for _, p := range stats {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // the process exited
		}
		// pid (comm) state ppid ...; comm may hold spaces, so cut at the last ')'.
		open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
		if open < 0 || end < open || string(data[open+1:end]) != "postgres" {
			continue
		}
		f := strings.Fields(string(data[end+1:]))
		// f[0] is the state (field 3): utime, stime, cutime, cstime are
		// fields 14 to 17.
		if len(f) < 15 {
			continue
		}
		for _, i := range []int{11, 12, 13, 14} {
			if n, err := strconv.ParseInt(f[i], 10, 64); err == nil {
				ticks += n
			}
		}
		found = true
	}
	return time.Duration(ticks) * clockTick, found
}

// isLoopback reports whether the database URL names this machine.
func isLoopback(databaseURL string) bool {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "" || host == "localhost" || strings.HasPrefix(host, "/") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// RoundTrips counts the commands and pipelines a Redis client sends (add
// it with AddHook, or CountRoundTrips), so a run can say how many Redis round trips each job
// cost: a pipeline counts once, a script retried after NOSCRIPT twice, as
// it travels twice.
type RoundTrips struct{ n atomic.Int64 }

// CountRoundTrips adds a RoundTrips to rdb's hooks and returns it.
func CountRoundTrips(rdb *redis.Client) *RoundTrips {
	rt := &RoundTrips{}
	rdb.AddHook(rt)
	return rt
}

// N is the round trips counted so far.
func (h *RoundTrips) N() int64 { return h.n.Load() }

func (h *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
