-- Retention: when a finished job's request and response were purged.
-- SQLite twin of postgres/013.

-- +goose Up
ALTER TABLE jobs ADD COLUMN purged_at TEXT;
CREATE INDEX jobs_purgeable ON jobs (finished_at)
    WHERE purged_at IS NULL AND status IN ('succeeded', 'failed', 'cancelled');

-- +goose Down
DROP INDEX jobs_purgeable;
ALTER TABLE jobs DROP COLUMN purged_at;
