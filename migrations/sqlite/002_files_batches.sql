-- Files (stored in chunks) and batches. SQLite twin of postgres/002.

-- +goose Up
-- files.batch_id refers to batches, created below: SQLite resolves foreign
-- keys when rows are written, not when tables are created.
CREATE TABLE files (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL REFERENCES tenants (id),
    purpose    TEXT NOT NULL CHECK (purpose IN ('batch', 'batch_output', 'batch_error')),
    filename   TEXT NOT NULL,
    bytes      INTEGER NOT NULL DEFAULT 0,
    lines      INTEGER NOT NULL DEFAULT 0,
    batch_id   TEXT REFERENCES batches (id),
    created_at TEXT NOT NULL
) STRICT;
-- FileList, newest first.
CREATE INDEX files_tenant ON files (tenant_id, id);
-- FileList filtered by purpose.
CREATE INDEX files_tenant_purpose ON files (tenant_id, purpose, id);

CREATE TABLE file_chunks (
    file_id TEXT NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    data    BLOB NOT NULL,
    PRIMARY KEY (file_id, seq)
) STRICT;

CREATE TABLE batches (
    id                TEXT PRIMARY KEY,
    tenant_id         TEXT NOT NULL REFERENCES tenants (id),
    input_file_id     TEXT NOT NULL REFERENCES files (id),
    output_file_id    TEXT REFERENCES files (id),
    error_file_id     TEXT REFERENCES files (id),
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
    cancelled_at      TEXT
) STRICT;
-- BatchList, newest first.
CREATE INDEX batches_tenant ON batches (tenant_id, id);
-- BatchListActive: only the unfinished batches; the query repeats the predicate literally.
CREATE INDEX batches_active ON batches (id)
    WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');

-- +goose Down
DROP TABLE batches;
DROP TABLE file_chunks;
DROP TABLE files;
