-- Batches offloaded to a provider's Batch API. SQLite twin of
-- postgres/016.

-- +goose Up
CREATE TABLE batch_parts (
    id                 TEXT PRIMARY KEY,
    batch_id           TEXT NOT NULL REFERENCES batches (id),
    tenant_id          TEXT NOT NULL REFERENCES tenants (id),
    model              TEXT NOT NULL,
    deployment         TEXT NOT NULL,
    endpoint           TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('pending', 'uploading', 'creating', 'submitted', 'collecting', 'done')),
    lines              INTEGER NOT NULL,
    bytes              INTEGER NOT NULL,
    tokens             INTEGER NOT NULL,
    reserved_micros    INTEGER NOT NULL DEFAULT 0,
    budget_day         TEXT,
    budget_global_day  TEXT,
    budget_global      INTEGER NOT NULL DEFAULT 0,
    provider_file_id   TEXT,
    provider_batch_id  TEXT,
    provider_status    TEXT,
    refusals           INTEGER NOT NULL DEFAULT 0,
    error              TEXT,
    next_check_at      TEXT NOT NULL,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL,
    submitted_at       TEXT,
    ended_at           TEXT
) STRICT;
CREATE INDEX batch_parts_due ON batch_parts (next_check_at) WHERE state <> 'done';
CREATE INDEX batch_parts_batch ON batch_parts (batch_id);
ALTER TABLE jobs ADD COLUMN batch_part_id TEXT;
CREATE INDEX jobs_batch_part ON jobs (batch_part_id, id) WHERE batch_part_id IS NOT NULL;
ALTER TABLE usage_ledger ADD COLUMN batched INTEGER NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE usage_ledger DROP COLUMN batched;
DROP INDEX jobs_batch_part;
ALTER TABLE jobs DROP COLUMN batch_part_id;
DROP TABLE batch_parts;
