-- A worker process says it is alive and a running job names the worker
-- process running it. SQLite twin of postgres/012.

-- +goose Up
CREATE TABLE workers (
    id         TEXT PRIMARY KEY,
    started_at TEXT NOT NULL,
    seen_at    TEXT NOT NULL
);
ALTER TABLE jobs ADD COLUMN worker_id TEXT;
CREATE INDEX jobs_worker_id ON jobs (worker_id) WHERE worker_id IS NOT NULL;
-- The ledger's latest rows, for a budget audit after a Redis failover.
CREATE INDEX usage_ledger_created_at ON usage_ledger (created_at);

-- +goose Down
DROP INDEX usage_ledger_created_at;
DROP INDEX jobs_worker_id;
ALTER TABLE jobs DROP COLUMN worker_id;
DROP TABLE workers;
