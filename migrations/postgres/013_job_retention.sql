-- Retention: a finished job's request and response are purged after the
-- policy's retention.finished_jobs (its status, usage and cost stay);
-- purged_at says when. The index finds the jobs still to purge, oldest
-- first, however many were purged; it is built without blocking writes.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS purged_at timestamptz;
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_purgeable ON jobs (finished_at)
    WHERE purged_at IS NULL AND status IN ('succeeded', 'failed', 'cancelled');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_purgeable;
ALTER TABLE jobs DROP COLUMN IF EXISTS purged_at;
