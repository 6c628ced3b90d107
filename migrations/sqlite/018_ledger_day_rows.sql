-- The budget's check of each day's spend against the ledger. SQLite twin of
-- postgres/018: SQLite has no INCLUDE, so the covered columns end the keys.

-- +goose Up
CREATE INDEX usage_ledger_day_rows ON usage_ledger (day, tenant_id, created_at, job_id, global_day, cost_micros);
CREATE INDEX usage_ledger_global_day_rows ON usage_ledger (global_day, created_at, job_id, tenant_id, cost_micros);
DROP INDEX usage_ledger_global_day;

-- +goose Down
CREATE INDEX usage_ledger_global_day ON usage_ledger (global_day);
DROP INDEX usage_ledger_global_day_rows;
DROP INDEX usage_ledger_day_rows;
