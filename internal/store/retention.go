package store

import (
	"context"
	"time"
)

// jobsPurgeable are the jobs JobPurgeBodies purges: finished before $1.
const jobsPurgeable = `purged_at IS NULL AND status IN ('succeeded', 'failed', 'cancelled')
	AND finished_at < $1`

// JobPurgeBodies empties the request and response of up to limit jobs that
// finished before before, oldest first, and returns how many.
func (db *DB) JobPurgeBodies(ctx context.Context, before time.Time, limit int) (int64, error) {
	if err := positive("JobPurgeBodies", limit); err != nil {
		return 0, err
	}
	n, err := db.rw.exec(ctx, `UPDATE jobs SET request = '{}', response_body = NULL, purged_at = $3
		WHERE id IN (SELECT id FROM jobs WHERE `+jobsPurgeable+` ORDER BY finished_at LIMIT $2`+db.d.skipLocked+`)`,
		db.d.ts(before), limit, db.d.ts(db.nowUTC()))
	return n, failed("JobPurgeBodies", err)
}

// JobCountPurgeable counts the jobs JobPurgeBodies would purge.
func (db *DB) JobCountPurgeable(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := db.ro.queryRow(ctx, `SELECT count(*) FROM jobs WHERE `+jobsPurgeable, db.d.ts(before)).Scan(&n)
	return n, failed("JobCountPurgeable", err)
}

// PurgeableFile is a file retention would delete.
type PurgeableFile struct {
	ID, TenantID string
	Bytes        int64
}

// FileListPurgeable lists up to limit files created before before that no
// unfinished batch uses, oldest first.
func (db *DB) FileListPurgeable(ctx context.Context, before time.Time, limit int) ([]PurgeableFile, error) {
	out, err := collect(ctx, db.ro, func(r row) (f PurgeableFile, err error) {
		err = r.Scan(&f.ID, &f.TenantID, &f.Bytes)
		return f, err
	}, `SELECT id, tenant_id, bytes FROM files f
		WHERE created_at < $1 AND NOT EXISTS (SELECT 1 `+batchesUsing("f.id")+`)
		ORDER BY created_at, id LIMIT $2`, db.d.ts(before), limit)
	return out, failed("FileListPurgeable", err)
}
