package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// devRedis is dev mode's embedded Redis: miniredis, its keys saved under
// -dir every snapshotEvery and when dev stops, and loaded when it starts.
// miniredis moves TTLs only when told: tick moves them with the wall clock.
type devRedis struct {
	*miniredis.Miniredis
	path   string
	logger *slog.Logger
	ticked time.Time
}

// snapshotEvery bounds what a crash of dev mode loses of the embedded Redis
// (the reconciler and the budget's rebuild cover it).
const snapshotEvery = 30 * time.Second

// snapshot is the file: each key with its absolute expiry; values are
// bytes (asynq's task messages are binary).
type snapshot struct {
	SavedAt time.Time     `json:"saved_at"`
	Keys    []snapshotKey `json:"keys"`
}

type snapshotKey struct {
	Key       string            `json:"key"`
	Type      string            `json:"type"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	String    []byte            `json:"string,omitempty"`
	Hash      map[string][]byte `json:"hash,omitempty"`
	List      [][]byte          `json:"list,omitempty"` // a list's items, or a set's members
	ZSet      []zMember         `json:"zset,omitempty"`
}

type zMember struct {
	Member []byte  `json:"m"`
	Score  float64 `json:"s"`
}

// startDevRedis starts the embedded Redis on a loopback port with the keys
// saved at path, if any; an unreadable snapshot is set aside.
func startDevRedis(path string, logger *slog.Logger) (*devRedis, error) {
	d := &devRedis{Miniredis: miniredis.NewMiniRedis(), path: path, logger: logger, ticked: time.Now()}
	if err := d.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start the embedded redis: %w", err)
	}
	if err := d.load(time.Now()); err != nil {
		aside := path + ".unreadable"
		_ = os.Rename(path, aside)
		logger.Warn("the embedded redis's snapshot cannot be read; starting without it", "file", aside, "err", err)
		d.FlushAll()
	}
	return d, nil
}

// run moves the TTLs every second and saves every snapshotEvery.
func (d *devRedis) run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			d.tick(now)
			if now.Sub(last) >= snapshotEvery {
				last = now
				if err := d.save(now); err != nil {
					d.logger.Warn("save the embedded redis", "err", err)
				}
			}
		}
	}
}

func (d *devRedis) tick(now time.Time) {
	if dt := now.Sub(d.ticked); dt > 0 {
		d.FastForward(dt)
	}
	d.ticked = now
}

// stop saves the keys and stops the server.
func (d *devRedis) stop() {
	if err := d.save(time.Now()); err != nil {
		d.logger.Warn("save the embedded redis", "err", err)
	}
	d.Close()
}

// save writes every key to the snapshot file through a temporary file.
// Keys are read one at a time: a task moving meanwhile may be saved twice
// or not at all, which handlers and the reconciler absorb.
func (d *devRedis) save(now time.Time) error {
	s := snapshot{SavedAt: now.UTC()}
	for _, k := range d.Keys() { // sorted
		if sk, ok := d.dumpKey(k, now); ok {
			s.Keys = append(s.Keys, sk)
		}
	}
	b, err := json.Marshal(&s)
	if err != nil {
		return err
	}
	tmp := d.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.path)
}

// dumpKey reads one key; false when it is gone or of a type llmq never writes.
func (d *devRedis) dumpKey(k string, now time.Time) (snapshotKey, bool) {
	sk := snapshotKey{Key: k, Type: d.Type(k)}
	if ttl := d.TTL(k); ttl > 0 {
		at := now.Add(ttl).UTC()
		sk.ExpiresAt = &at
	}
	var err error
	switch sk.Type {
	case "string":
		var v string
		v, err = d.Get(k)
		sk.String = []byte(v)
	case "hash":
		var fields []string
		fields, err = d.HKeys(k)
		sk.Hash = make(map[string][]byte, len(fields))
		for _, f := range fields {
			sk.Hash[f] = []byte(d.HGet(k, f))
		}
	case "list", "set":
		var items []string
		if sk.Type == "list" {
			items, err = d.List(k)
		} else {
			items, err = d.Members(k)
		}
		for _, it := range items {
			sk.List = append(sk.List, []byte(it))
		}
	case "zset":
		var m map[string]float64
		m, err = d.SortedSet(k)
		for member, score := range m {
			sk.ZSet = append(sk.ZSet, zMember{Member: []byte(member), Score: score})
		}
	default:
		if sk.Type != "none" && sk.Type != "" {
			d.logger.Warn("the embedded redis's snapshot leaves out a key of an unexpected type", "key", k, "type", sk.Type)
		}
		return sk, false
	}
	return sk, err == nil
}

// load restores the snapshot file, if any, leaving out expired keys.
func (d *devRedis) load(now time.Time) error {
	b, err := os.ReadFile(d.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	for _, k := range s.Keys {
		var ttl time.Duration
		if k.ExpiresAt != nil {
			if ttl = k.ExpiresAt.Sub(now); ttl <= 0 {
				continue
			}
		}
		switch k.Type {
		case "string":
			err = d.Set(k.Key, string(k.String))
		case "hash":
			for f, v := range k.Hash {
				d.HSet(k.Key, f, string(v))
			}
		case "list", "set":
			items := make([]string, len(k.List))
			for i, v := range k.List {
				items[i] = string(v)
			}
			if k.Type == "list" {
				_, err = d.Push(k.Key, items...)
			} else {
				_, err = d.SetAdd(k.Key, items...)
			}
		case "zset":
			for _, z := range k.ZSet {
				if _, err = d.ZAdd(k.Key, z.Score, string(z.Member)); err != nil {
					break
				}
			}
		default:
			err = fmt.Errorf("key %q: unknown type %q", k.Key, k.Type)
		}
		if err != nil {
			return err
		}
		if ttl > 0 {
			d.SetTTL(k.Key, ttl)
		}
	}
	return nil
}
