package store

import (
	"context"
	"time"
)

const finishedStatuses = `('succeeded', 'failed', 'cancelled')`

// JobPurgeBodies empties the request and response of up to limit jobs that
// finished before before, oldest first, and returns how many.
func (db *DB) JobPurgeBodies(ctx context.Context, before time.Time, limit int) (int64, error) {
	if err := positive("JobPurgeBodies", limit); err != nil {
		return 0, err
	}
	n, err := db.rw.exec(ctx, `UPDATE jobs SET request = '{}', response_body = NULL, purged_at = $1
		WHERE id IN (SELECT id FROM jobs WHERE purged_at IS NULL AND status IN `+finishedStatuses+`
			AND finished_at < $2 ORDER BY finished_at LIMIT $3`+db.d.skipLocked+`)`,
		db.d.ts(db.nowUTC()), db.d.ts(before), limit)
	return n, failed("JobPurgeBodies", err)
}

// JobCountPurgeable counts the jobs JobPurgeBodies would purge.
func (db *DB) JobCountPurgeable(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := db.ro.queryRow(ctx, `SELECT count(*) FROM jobs WHERE purged_at IS NULL AND status IN `+finishedStatuses+`
		AND finished_at < $1`, db.d.ts(before)).Scan(&n)
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
	}, `SELECT id, tenant_id, bytes FROM files f WHERE created_at < $1
		AND NOT EXISTS (SELECT 1 FROM batches b WHERE (b.input_file_id = f.id OR b.output_file_id = f.id OR b.error_file_id = f.id)
			AND b.status NOT IN ('failed', 'completed', 'expired', 'cancelled'))
		ORDER BY created_at, id LIMIT $2`, db.d.ts(before), limit)
	return out, failed("FileListPurgeable", err)
}
