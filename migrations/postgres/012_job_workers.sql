-- A worker process says it is alive (seen_at, every few seconds) and a
-- running job names the worker process running it (worker_id), so that the
-- jobs of a worker that died are handed to others within seconds, and never
-- while it still runs them.

-- +goose Up
CREATE TABLE workers (
    id         text PRIMARY KEY,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL
);
ALTER TABLE jobs ADD COLUMN worker_id text;
CREATE INDEX jobs_worker_id ON jobs (worker_id) WHERE worker_id IS NOT NULL;
-- The ledger's latest rows, for a budget audit after a Redis failover.
CREATE INDEX usage_ledger_created_at ON usage_ledger (created_at);

-- +goose Down
DROP INDEX usage_ledger_created_at;
DROP INDEX jobs_worker_id;
ALTER TABLE jobs DROP COLUMN worker_id;
DROP TABLE workers;
