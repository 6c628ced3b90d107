-- Jobs and the usage ledger. SQLite twin of postgres/003; the index comments
-- there say which query each index serves.

-- +goose Up
CREATE TABLE jobs (
    id                  TEXT PRIMARY KEY,
    tenant_id           TEXT NOT NULL REFERENCES tenants (id),
    batch_id            TEXT REFERENCES batches (id),
    line_no             INTEGER CHECK (line_no >= 0),
    custom_id           TEXT,
    endpoint            TEXT NOT NULL,
    model               TEXT NOT NULL,
    request             TEXT NOT NULL CHECK (json_valid(request)),
    queue               TEXT NOT NULL,
    status              TEXT NOT NULL CHECK (status IN ('queued', 'running', 'waiting', 'deferred',
                                                        'succeeded', 'failed', 'cancelled')),
    attempts            INTEGER NOT NULL DEFAULT 0,
    rate_limited        INTEGER NOT NULL DEFAULT 0,
    est_prompt_tokens   INTEGER NOT NULL DEFAULT 0,
    est_max_tokens      INTEGER NOT NULL DEFAULT 0,
    est_cost_micros     INTEGER NOT NULL DEFAULT 0,
    response_status     INTEGER,
    response_body       TEXT CHECK (json_valid(response_body)),
    provider_request_id TEXT,
    error               TEXT CHECK (json_valid(error)),
    prompt_tokens       INTEGER NOT NULL DEFAULT 0,
    completion_tokens   INTEGER NOT NULL DEFAULT 0,
    cached_tokens       INTEGER NOT NULL DEFAULT 0,
    total_tokens        INTEGER NOT NULL DEFAULT 0,
    cost_micros         INTEGER NOT NULL DEFAULT 0,
    webhook_url         TEXT,
    metadata            TEXT CHECK (json_valid(metadata)),
    idempotency_key     TEXT,
    created_at          TEXT NOT NULL,
    started_at          TEXT,
    finished_at         TEXT,
    updated_at          TEXT NOT NULL,
    next_run_at         TEXT,
    CHECK ((batch_id IS NULL) = (line_no IS NULL))
) STRICT;
CREATE INDEX jobs_tenant ON jobs (tenant_id, id);
CREATE INDEX jobs_tenant_status ON jobs (tenant_id, status, id);
CREATE UNIQUE INDEX jobs_tenant_idempotency ON jobs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX jobs_batch_line ON jobs (batch_id, line_no) WHERE batch_id IS NOT NULL;
CREATE INDEX jobs_batch_status ON jobs (batch_id, status, id) WHERE batch_id IS NOT NULL;
CREATE INDEX jobs_batch ON jobs (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE INDEX jobs_unfinished ON jobs (id) WHERE status IN ('queued', 'running', 'waiting', 'deferred');

CREATE TABLE usage_ledger (
    job_id            TEXT PRIMARY KEY REFERENCES jobs (id),
    tenant_id         TEXT NOT NULL REFERENCES tenants (id),
    batch_id          TEXT,
    day               TEXT NOT NULL CHECK (day GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9]'),
    global_day        TEXT NOT NULL CHECK (global_day GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9]'),
    model             TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    cost_micros       INTEGER NOT NULL CHECK (cost_micros >= 0),
    created_at        TEXT NOT NULL
) STRICT;
CREATE INDEX usage_ledger_tenant_day ON usage_ledger (tenant_id, day, model);
CREATE INDEX usage_ledger_day_model ON usage_ledger (day, model);
CREATE INDEX usage_ledger_global_day ON usage_ledger (global_day);

-- +goose Down
DROP TABLE usage_ledger;
DROP TABLE jobs;
