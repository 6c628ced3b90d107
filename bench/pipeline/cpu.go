package main

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/testutil"
)

// cpuTimes are the CPU times a measurement divides by its jobs to say
// where the work went: this process (API, workers, simulated provider and
// producers alike), the Redis server and the Postgres server. The servers'
// times are whole-server times: on a machine others use, they include
// their work too, so they are upper bounds. A time that cannot be read is
// negative.
type cpuTimes struct {
	self, redis, postgres time.Duration
}

// cpuReader reads the three times.
type cpuReader struct {
	rdb *redis.Client
	// localPG is set when Postgres runs on this machine, where its
	// processes' times can be read from /proc.
	localPG bool
}

func newCPUReader(rdb *redis.Client, databaseURL string) *cpuReader {
	return &cpuReader{rdb: rdb, localPG: isLoopback(databaseURL)}
}

func (c *cpuReader) read(ctx context.Context) cpuTimes {
	t := cpuTimes{self: selfCPU(), redis: -1, postgres: -1}
	if d, ok := testutil.RedisCPU(ctx, c.rdb); ok {
		t.redis = d
	}
	if c.localPG {
		if d, ok := postgresCPU(); ok {
			t.postgres = d
		}
	}
	return t
}

func (t cpuTimes) sub(u cpuTimes) cpuTimes {
	d := cpuTimes{self: t.self - u.self, redis: -1, postgres: -1}
	if t.redis >= 0 && u.redis >= 0 {
		d.redis = t.redis - u.redis
	}
	if t.postgres >= 0 && u.postgres >= 0 {
		d.postgres = t.postgres - u.postgres
	}
	return d
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

// postgresCPU sums utime and stime of every process named postgres (the
// postmaster and its backends), plus the times of the postmaster's exited
// children, from /proc.
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
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err == nil {
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
