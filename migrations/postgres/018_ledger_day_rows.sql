-- The budget's check of each day's spend in Redis against the ledger (after
-- a Redis restart, failover or restore, and once a minute): one grouped sum
-- over today's days, then, only for a day Redis counts less than the
-- ledger, its rows written since the day was last checked, in pages. Both
-- read an index alone: usage_ledger_day_rows serves the sums (by day) and a
-- tenant's day's rows (by day, tenant and time); usage_ledger_global_day_rows
-- the global day's rows and its sum, replacing usage_ledger_global_day.
-- Built without blocking writes.

-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_ledger_day_rows
    ON usage_ledger (day, tenant_id, created_at, job_id) INCLUDE (global_day, cost_micros);
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_ledger_global_day_rows
    ON usage_ledger (global_day, created_at, job_id) INCLUDE (tenant_id, cost_micros);
DROP INDEX CONCURRENTLY IF EXISTS usage_ledger_global_day;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_ledger_global_day ON usage_ledger (global_day);
DROP INDEX CONCURRENTLY IF EXISTS usage_ledger_global_day_rows;
DROP INDEX CONCURRENTLY IF EXISTS usage_ledger_day_rows;
