-- A webhook's delivery is recorded once it ends (delivered, refused for good,
-- or retried until given up), so that the reconciler can enqueue again the
-- deliveries of finished jobs and batches that Redis lost. The pending ones
-- are few; the partial indexes hold only them.

-- +goose Up
ALTER TABLE jobs ADD COLUMN webhook_done_at timestamptz;
ALTER TABLE batches ADD COLUMN webhook_done_at timestamptz;
-- What finished before this migration was delivered by the version before.
UPDATE jobs SET webhook_done_at = finished_at
    WHERE webhook_url IS NOT NULL AND status IN ('succeeded', 'failed', 'cancelled');
UPDATE batches SET webhook_done_at = COALESCE(completed_at, failed_at, expired_at, cancelled_at)
    WHERE webhook_url IS NOT NULL AND status IN ('completed', 'failed', 'expired', 'cancelled');
-- WebhookListPending. The predicates are repeated literally in the queries.
CREATE INDEX jobs_webhook_pending ON jobs (id)
    WHERE webhook_url IS NOT NULL AND webhook_done_at IS NULL AND status IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX batches_webhook_pending ON batches (id)
    WHERE webhook_url IS NOT NULL AND webhook_done_at IS NULL AND status IN ('completed', 'failed', 'expired', 'cancelled');

-- +goose Down
DROP INDEX batches_webhook_pending;
DROP INDEX jobs_webhook_pending;
ALTER TABLE batches DROP COLUMN webhook_done_at;
ALTER TABLE jobs DROP COLUMN webhook_done_at;
