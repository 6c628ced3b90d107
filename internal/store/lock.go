package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"
)

// TryLock takes the lock called name if nobody holds it, for work that
// runs one at a time across every process on this database; unlock may be
// called more than once. On Postgres a session advisory lock, released if
// its connection dies, so the work it guards must be safe to run again; on
// SQLite (one process) an in-process lock per database file.
func (db *DB) TryLock(ctx context.Context, name string) (unlock func(), ok bool, err error) {
	return db.d.tryLock(ctx, db, name)
}

// waitLock tries TryLock every 50ms until it is had or ctx ends.
func (db *DB) waitLock(ctx context.Context, name string) (unlock func(), err error) {
	for {
		unlock, ok, err := db.TryLock(ctx, name)
		if err != nil || ok {
			return unlock, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("store: lock %q: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func pgTryLock(ctx context.Context, db *DB, name string) (func(), bool, error) {
	method := fmt.Sprintf("TryLock %q", name)
	conn, err := db.locks.Acquire(ctx)
	if err != nil {
		return nil, false, failed(method, db.d.outage(err))
	}
	h := fnv.New64a() // the lock's key: name within the database's scope
	h.Write([]byte(db.lockScope + "\x00" + name))
	key := int64(h.Sum64())
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil || !ok {
		conn.Release()
		return nil, false, failed(method, db.d.outage(err))
	}
	return sync.OnceFunc(func() {
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var released bool
		err := conn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", key).Scan(&released)
		if err == nil && released {
			conn.Release()
			return
		}
		// Closing a connection that may still hold the lock releases it.
		db.log.Warn("store: advisory unlock failed; closing the connection", "lock", name, "err", err)
		_ = conn.Hijack().Close(uctx)
	}), true, nil
}

// processLocks are the SQLite locks of this process, process-wide so that
// two DBs on one file exclude each other, as two Postgres sessions do.
var processLocks = struct {
	sync.Mutex
	held map[string]bool
}{held: map[string]bool{}}

func processTryLock(_ context.Context, db *DB, name string) (func(), bool, error) {
	k := db.lockScope + "\x00" + name
	processLocks.Lock()
	defer processLocks.Unlock()
	if processLocks.held[k] {
		return nil, false, nil
	}
	processLocks.held[k] = true
	return sync.OnceFunc(func() {
		processLocks.Lock()
		delete(processLocks.held, k)
		processLocks.Unlock()
	}), true, nil
}
