-- Batches offloaded to a provider's Batch API: a batch's lines go in parts
-- (one provider batch each, of one deployment, within the provider's
-- limits), each a row of batch_parts holding the provider's file and batch
-- ids and its state, so a dispatcher restarted mid-flight resumes it and
-- never uploads it twice. A job in a part names it (jobs.batch_part_id);
-- its ledger row says it ran batched.

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS batch_parts (
    id                 text COLLATE "C" PRIMARY KEY,
    batch_id           text COLLATE "C" NOT NULL REFERENCES batches (id),
    tenant_id          text COLLATE "C" NOT NULL REFERENCES tenants (id),
    model              text NOT NULL,  -- llmq's model of its lines
    deployment         text NOT NULL,  -- provider/upstream
    endpoint           text NOT NULL,
    state              text NOT NULL CHECK (state IN ('pending', 'uploading', 'creating', 'submitted', 'collecting', 'done')),
    lines              bigint NOT NULL,
    bytes              bigint NOT NULL,
    tokens             bigint NOT NULL, -- estimated prompt tokens: what the provider's batch queue limit counts
    reserved_micros    bigint NOT NULL DEFAULT 0,
    budget_day         text,
    budget_global_day  text,
    budget_global      boolean NOT NULL DEFAULT false,
    provider_file_id   text,
    provider_batch_id  text,
    provider_status    text,
    refusals           integer NOT NULL DEFAULT 0,
    error              text,
    next_check_at      timestamptz NOT NULL,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    submitted_at       timestamptz,
    ended_at           timestamptz
);
-- The offloader's sweep: the parts not done, by when they are due.
CREATE INDEX IF NOT EXISTS batch_parts_due ON batch_parts (next_check_at) WHERE state <> 'done';
CREATE INDEX IF NOT EXISTS batch_parts_batch ON batch_parts (batch_id);
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS batch_part_id text COLLATE "C";
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_batch_part ON jobs (batch_part_id, id) WHERE batch_part_id IS NOT NULL;
ALTER TABLE usage_ledger ADD COLUMN IF NOT EXISTS batched boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE usage_ledger DROP COLUMN IF EXISTS batched;
DROP INDEX CONCURRENTLY IF EXISTS jobs_batch_part;
ALTER TABLE jobs DROP COLUMN IF EXISTS batch_part_id;
DROP TABLE IF EXISTS batch_parts;
