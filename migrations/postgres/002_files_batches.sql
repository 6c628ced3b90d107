-- Files (stored in chunks) and batches.

-- +goose Up
CREATE TABLE files (
    id         text COLLATE "C" PRIMARY KEY,
    tenant_id  text COLLATE "C" NOT NULL REFERENCES tenants (id),
    purpose    text NOT NULL CHECK (purpose IN ('batch', 'batch_output', 'batch_error')),
    filename   text NOT NULL,
    bytes      bigint NOT NULL DEFAULT 0,
    lines      bigint NOT NULL DEFAULT 0,
    batch_id   text COLLATE "C",
    created_at timestamptz NOT NULL
);
-- FileList, newest first.
CREATE INDEX files_tenant ON files (tenant_id, id);
-- FileList filtered by purpose.
CREATE INDEX files_tenant_purpose ON files (tenant_id, purpose, id);

-- Files up to 200 MB are written and read about 1 MiB at a time, never whole.
CREATE TABLE file_chunks (
    file_id text COLLATE "C" NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    seq     integer NOT NULL,
    data    bytea NOT NULL,
    PRIMARY KEY (file_id, seq)
);

CREATE TABLE batches (
    id                text COLLATE "C" PRIMARY KEY,
    tenant_id         text COLLATE "C" NOT NULL REFERENCES tenants (id),
    input_file_id     text COLLATE "C" NOT NULL REFERENCES files (id),
    output_file_id    text COLLATE "C" REFERENCES files (id),
    error_file_id     text COLLATE "C" REFERENCES files (id),
    endpoint          text NOT NULL,
    completion_window text NOT NULL,
    status            text NOT NULL CHECK (status IN ('validating', 'failed', 'in_progress', 'finalizing',
                                                      'completed', 'expired', 'cancelling', 'cancelled')),
    metadata          jsonb,
    errors            jsonb,
    total             bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz,
    in_progress_at    timestamptz,
    finalizing_at     timestamptz,
    completed_at      timestamptz,
    failed_at         timestamptz,
    expired_at        timestamptz,
    cancelling_at     timestamptz,
    cancelled_at      timestamptz
);
-- BatchList, newest first.
CREATE INDEX batches_tenant ON batches (tenant_id, id);
-- BatchListActive (expiry and finalization sweeps): only the unfinished batches.
-- The predicate is repeated literally in the query so the planner can use it.
CREATE INDEX batches_active ON batches (id)
    WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');

ALTER TABLE files ADD CONSTRAINT files_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES batches (id);

-- +goose Down
ALTER TABLE files DROP CONSTRAINT files_batch_id_fkey;
DROP TABLE batches;
DROP TABLE file_chunks;
DROP TABLE files;
