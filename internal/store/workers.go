package store

import (
	"context"
	"time"
)

// A worker beats every WorkerBeatInterval and the jobs it starts name it; one
// not seen for WorkerDeadAfter is dead, and its running jobs are handed on
// (JobHandOff). Hosts' clocks must agree to well under WorkerDeadAfter.
const (
	WorkerBeatInterval = 2 * time.Second
	WorkerDeadAfter    = 8 * time.Second
)

// WorkerBeat records that worker process id is alive now.
func (db *DB) WorkerBeat(ctx context.Context, id string) error {
	if err := required("WorkerBeat", "id", id); err != nil {
		return err
	}
	_, err := db.rw.exec(ctx, `INSERT INTO workers (id, started_at, seen_at) VALUES ($1, $2, $2)
		ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at`, id, db.d.ts(db.nowUTC()))
	return failed("WorkerBeat", db.d.wrap(err))
}

// WorkerGone removes worker process id, which stopped.
func (db *DB) WorkerGone(ctx context.Context, id string) error {
	_, err := db.rw.exec(ctx, `DELETE FROM workers WHERE id = $1`, id)
	return failed("WorkerGone", db.d.wrap(err))
}

// JobRelease clears worker's hold on job id, queueing it again if running.
func (db *DB) JobRelease(ctx context.Context, id, worker string) error {
	if worker == "" {
		return nil
	}
	_, err := db.rw.exec(ctx, `UPDATE jobs SET worker_id = NULL,
		status = CASE WHEN status = 'running' THEN 'queued' ELSE status END WHERE id = $1 AND worker_id = $2`, id, worker)
	return failed("JobRelease", db.d.wrap(err))
}

// heldByLiveSQL is true for a job that a worker other than $w holds and
// that was seen at or after $dead.
const heldByLiveSQL = `EXISTS (SELECT 1 FROM workers w WHERE w.id = jobs.worker_id AND w.seen_at >= `

// JobHandOff queues again up to limit running jobs (not synchronous ones)
// of dead workers, counting the lost delivery as an attempt.
func (db *DB) JobHandOff(ctx context.Context, limit int) ([]*Job, error) {
	var a args
	now := db.nowUTC()
	nowArg := a.add(db.d.ts(now))
	dead := a.add(db.d.ts(now.Add(-WorkerDeadAfter)))
	q := `UPDATE jobs SET status = 'queued', worker_id = NULL, attempts = attempts + 1, updated_at = ` + nowArg + `
		WHERE id IN (SELECT id FROM jobs WHERE status = 'running' AND worker_id IS NOT NULL AND NOT sync
			AND NOT ` + heldByLiveSQL + dead + `) LIMIT ` + a.add(limit) + `)
		RETURNING ` + jobColumns
	jobs, err := collect(ctx, db.rw, scanJob, q, a...)
	return jobs, failed("JobHandOff", db.d.wrap(err))
}
