-- Retention of the ledger's detail folded into daily totals. SQLite twin
-- of postgres/015.

-- +goose Up
CREATE TABLE usage_daily (
    tenant_id         TEXT NOT NULL REFERENCES tenants (id),
    day               TEXT NOT NULL CHECK (day GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9]'),
    global_day        TEXT NOT NULL CHECK (global_day GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9]'),
    model             TEXT NOT NULL,
    requests          INTEGER NOT NULL CHECK (requests > 0),
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cached_tokens     INTEGER NOT NULL,
    cost_micros       INTEGER NOT NULL CHECK (cost_micros >= 0),
    PRIMARY KEY (tenant_id, day, model, global_day)
) STRICT;
CREATE INDEX usage_daily_day_model ON usage_daily (day, model);
CREATE INDEX usage_daily_global_day ON usage_daily (global_day);

-- +goose Down
-- Refused while usage_daily holds rolled-up spend (it would be lost).
CREATE TEMP TABLE usage_daily_down (
    rows INTEGER CONSTRAINT usage_daily_holds_the_spend_of_purged_ledger_rows CHECK (rows = 0)
);
INSERT INTO usage_daily_down SELECT count(*) FROM usage_daily;
DROP TABLE usage_daily_down;
DROP TABLE usage_daily;
