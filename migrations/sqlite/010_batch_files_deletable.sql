-- A batch names its files by id without holding them: once the batch has
-- ended, its input, output and error files may be deleted (FileDelete
-- refuses while the batch runs). SQLite twin of postgres/010: a constraint
-- cannot be dropped in SQLite, so the table is made again without it (jobs
-- refer to batches: their check waits for the commit).

-- +goose Up
PRAGMA defer_foreign_keys = ON;
CREATE TABLE batches_new (
    id                TEXT PRIMARY KEY,
    tenant_id         TEXT NOT NULL REFERENCES tenants (id),
    input_file_id     TEXT NOT NULL,
    output_file_id    TEXT,
    error_file_id     TEXT,
    endpoint          TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('validating', 'failed', 'in_progress', 'finalizing',
                                                      'completed', 'expired', 'cancelling', 'cancelled')),
    metadata          TEXT CHECK (json_valid(metadata)),
    errors            TEXT CHECK (json_valid(errors)),
    total             INTEGER NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL,
    expires_at        TEXT,
    in_progress_at    TEXT,
    finalizing_at     TEXT,
    completed_at      TEXT,
    failed_at         TEXT,
    expired_at        TEXT,
    cancelling_at     TEXT,
    cancelled_at      TEXT,
    webhook_url       TEXT,
    webhook_done_at   TEXT
) STRICT;
INSERT INTO batches_new SELECT id, tenant_id, input_file_id, output_file_id, error_file_id, endpoint, completion_window,
    status, metadata, errors, total, created_at, expires_at, in_progress_at, finalizing_at, completed_at, failed_at,
    expired_at, cancelling_at, cancelled_at, webhook_url, webhook_done_at FROM batches;
DROP TABLE batches;
ALTER TABLE batches_new RENAME TO batches;
CREATE INDEX batches_tenant ON batches (tenant_id, id);
CREATE INDEX batches_active ON batches (id)
    WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');
CREATE INDEX batches_input_file ON batches (input_file_id);
CREATE INDEX batches_output_file ON batches (output_file_id) WHERE output_file_id IS NOT NULL;
CREATE INDEX batches_error_file ON batches (error_file_id) WHERE error_file_id IS NOT NULL;
CREATE INDEX batches_webhook_pending ON batches (id)
    WHERE webhook_url IS NOT NULL AND webhook_done_at IS NULL AND status IN ('completed', 'failed', 'expired', 'cancelled');

-- +goose Down
-- The constraints stay off: batches whose files were deleted could not hold
-- them, and SQLite enforces them only on writes.
SELECT 1;
