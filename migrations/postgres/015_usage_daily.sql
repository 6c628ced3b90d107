-- Retention of the ledger's detail: once a ledger row is older than the
-- policy's retention.ledger, it is folded into usage_daily (one row per
-- tenant, budget day, UTC day and model) and deleted, in one statement, so
-- a row is always counted in exactly one of the two tables. The budget's
-- sums and the usage report read both.

-- +goose Up
CREATE TABLE usage_daily (
    tenant_id         text COLLATE "C" NOT NULL REFERENCES tenants (id),
    day               date NOT NULL, -- the tenant's budget day
    global_day        date NOT NULL, -- the UTC day of the global cap
    model             text NOT NULL,
    requests          bigint NOT NULL CHECK (requests > 0),
    prompt_tokens     bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    cached_tokens     bigint NOT NULL,
    cost_micros       bigint NOT NULL CHECK (cost_micros >= 0),
    PRIMARY KEY (tenant_id, day, model, global_day)
);
-- UsageReport across tenants.
CREATE INDEX usage_daily_day_model ON usage_daily (day, model);
-- UsageSumByDay (rebuilding the global cap's spend).
CREATE INDEX usage_daily_global_day ON usage_daily (global_day);

-- +goose Down
-- The rolled-up days have no ledger rows left to go back to: going below
-- 015 with any would lose that spend, so it is refused.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM usage_daily) THEN
        RAISE EXCEPTION 'usage_daily holds the spend of purged ledger rows; migrating below 015 would lose it';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE usage_daily;
