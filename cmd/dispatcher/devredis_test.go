package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The snapshot brings back every kind of key llmq and asynq write, binary
// values as they were, and TTLs as absolute expiries: a key that expired
// while dev was stopped is gone, one that had time left keeps the rest.
func TestDevRedisSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "redis.json")
	logger := slog.New(slog.DiscardHandler)
	d, err := startDevRedis(path, logger)
	if err != nil {
		t.Fatal(err)
	}
	binary := string([]byte{0x0a, 0xff, 0x00, 0xfe, 'x'}) // asynq's task messages are protobuf
	_ = d.Set("s", binary)
	d.HSet("asynq:{default}:t:1", "msg", binary, "state", "pending")
	_, _ = d.Push("asynq:{default}:pending", "1", "2", "3")
	_, _ = d.SetAdd("asynq:queues", "default", "low")
	_, _ = d.ZAdd("asynq:{default}:scheduled", 1796000000.5, "4")
	_ = d.Set("short", "v")
	d.SetTTL("short", 2*time.Second)
	_ = d.Set("long", "v")
	d.SetTTL("long", time.Hour)
	now := time.Now()
	if err := d.save(now); err != nil {
		t.Fatal(err)
	}
	d.Close()

	// Loaded as by a start 10 s later.
	e, err := startDevRedis(filepath.Join(t.TempDir(), "none.json"), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.path = path
	if err := e.load(now.Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.Get("s"); v != binary {
		t.Errorf("string %q, want %q", v, binary)
	}
	if e.HGet("asynq:{default}:t:1", "msg") != binary || e.HGet("asynq:{default}:t:1", "state") != "pending" {
		t.Error("hash not restored")
	}
	if l, _ := e.List("asynq:{default}:pending"); !slices.Equal(l, []string{"1", "2", "3"}) {
		t.Errorf("list %v, want its order kept", l)
	}
	if m, _ := e.Members("asynq:queues"); !slices.Equal(m, []string{"default", "low"}) {
		t.Errorf("set %v", m)
	}
	if z, _ := e.SortedSet("asynq:{default}:scheduled"); z["4"] != 1796000000.5 {
		t.Errorf("zset %v", z)
	}
	if e.Exists("short") {
		t.Error("a key that expired while dev was stopped came back")
	}
	if ttl := e.TTL("long"); ttl <= 59*time.Minute || ttl > time.Hour-9*time.Second {
		t.Errorf("long's TTL %v, want an hour less the 10 s dev was stopped", ttl)
	}

	// The TTLs run with the clock between snapshots.
	e.ticked = now
	e.tick(now.Add(time.Hour))
	if e.Exists("long") {
		t.Error("tick did not expire a key past its TTL")
	}
}

// A snapshot that cannot be read is set aside, and dev starts empty (as
// after a Redis loss, which the reconciler and the ledger recover from).
func TestDevRedisUnreadableSnapshot(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "redis.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := startDevRedis(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if len(d.Keys()) != 0 {
		t.Errorf("keys %v, want none", d.Keys())
	}
	if _, err := os.Stat(path + ".unreadable"); err != nil {
		t.Errorf("the unreadable snapshot was not set aside: %v", err)
	}
}
