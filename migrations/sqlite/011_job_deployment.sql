-- A model may be served by several deployments (and fallback models): a job
-- and its ledger row say which deployment answered, and which model when a
-- fallback did; a job may name its own fallback models. SQLite twin of
-- postgres/011.

-- +goose Up
ALTER TABLE jobs ADD COLUMN deployment TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN served_model TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN fallbacks TEXT NOT NULL DEFAULT '';
ALTER TABLE usage_ledger ADD COLUMN deployment TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE usage_ledger DROP COLUMN deployment;
ALTER TABLE jobs DROP COLUMN fallbacks;
ALTER TABLE jobs DROP COLUMN served_model;
ALTER TABLE jobs DROP COLUMN deployment;
