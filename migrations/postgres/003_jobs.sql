-- Jobs and the usage ledger.

-- +goose Up
CREATE TABLE jobs (
    id                  text COLLATE "C" PRIMARY KEY,
    tenant_id           text COLLATE "C" NOT NULL REFERENCES tenants (id),
    batch_id            text COLLATE "C" REFERENCES batches (id),
    line_no             integer CHECK (line_no >= 0),
    custom_id           text,
    endpoint            text NOT NULL,
    model               text NOT NULL,
    request             jsonb NOT NULL,
    queue               text NOT NULL,
    status              text NOT NULL CHECK (status IN ('queued', 'running', 'waiting', 'deferred',
                                                        'succeeded', 'failed', 'cancelled')),
    attempts            integer NOT NULL DEFAULT 0,
    rate_limited        integer NOT NULL DEFAULT 0,
    est_prompt_tokens   bigint NOT NULL DEFAULT 0,
    est_max_tokens      bigint NOT NULL DEFAULT 0,
    est_cost_micros     bigint NOT NULL DEFAULT 0,
    response_status     integer,
    response_body       jsonb,
    provider_request_id text,
    error               jsonb,
    prompt_tokens       bigint NOT NULL DEFAULT 0,
    completion_tokens   bigint NOT NULL DEFAULT 0,
    cached_tokens       bigint NOT NULL DEFAULT 0,
    total_tokens        bigint NOT NULL DEFAULT 0,
    cost_micros         bigint NOT NULL DEFAULT 0,
    webhook_url         text,
    metadata            jsonb,
    idempotency_key     text,
    created_at          timestamptz NOT NULL,
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz NOT NULL,
    next_run_at         timestamptz,
    CHECK ((batch_id IS NULL) = (line_no IS NULL))
);
-- Loading a job by id (every worker run, every status change) uses the primary key.

-- JobList by tenant, newest first (ids are time-ordered).
CREATE INDEX jobs_tenant ON jobs (tenant_id, id);
-- JobList by tenant and status.
CREATE INDEX jobs_tenant_status ON jobs (tenant_id, status, id);
-- JobInsert with an Idempotency-Key: one job per (tenant, key).
CREATE UNIQUE INDEX jobs_tenant_idempotency ON jobs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- JobStreamByBatch in input order; a retried JobInsertMany conflicts instead of duplicating.
CREATE UNIQUE INDEX jobs_batch_line ON jobs (batch_id, line_no) WHERE batch_id IS NOT NULL;
-- JobCountsByBatch, JobCancelByBatch, JobList by batch and status. Counts come
-- from here, never from a counter row every job would update.
CREATE INDEX jobs_batch_status ON jobs (batch_id, status, id) WHERE batch_id IS NOT NULL;
-- JobList by batch, newest first.
CREATE INDEX jobs_batch ON jobs (batch_id, id) WHERE batch_id IS NOT NULL;
-- JobListUnfinished (reconciler): only unfinished jobs, however many have finished.
-- The predicate is repeated literally in the query so the planner can use it.
CREATE INDEX jobs_unfinished ON jobs (id) WHERE status IN ('queued', 'running', 'waiting', 'deferred');

-- One row per job: the primary key on job_id is what charges spend once,
-- however often the job ran. Appended to, never updated.
CREATE TABLE usage_ledger (
    job_id            text COLLATE "C" PRIMARY KEY REFERENCES jobs (id),
    tenant_id         text COLLATE "C" NOT NULL REFERENCES tenants (id),
    batch_id          text COLLATE "C",
    day               date NOT NULL, -- the tenant's budget day (its tier's timezone)
    global_day        date NOT NULL, -- the UTC day of the global cap
    model             text NOT NULL,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    cached_tokens     bigint NOT NULL DEFAULT 0,
    cost_micros       bigint NOT NULL CHECK (cost_micros >= 0),
    created_at        timestamptz NOT NULL
);
-- UsageSumByTenantDay (budget rebuild) and UsageReport for one tenant.
CREATE INDEX usage_ledger_tenant_day ON usage_ledger (tenant_id, day, model);
-- UsageReport across tenants, spend by day and model.
CREATE INDEX usage_ledger_day_model ON usage_ledger (day, model);
-- UsageSumByDay (rebuilding the global cap's spend).
CREATE INDEX usage_ledger_global_day ON usage_ledger (global_day);

-- +goose Down
DROP TABLE usage_ledger;
DROP TABLE jobs;
