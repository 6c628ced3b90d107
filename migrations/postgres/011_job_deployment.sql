-- A model may be served by several deployments (and fallback models): a job
-- and its ledger row say which deployment answered, and which model when a
-- fallback did ('' before this migration, and for jobs no provider answered);
-- a job may name its own fallback models (space-separated; '' for its
-- model's).
-- The ledger's model is the model charged: the fallback's, when one answered.

-- +goose Up
ALTER TABLE jobs ADD COLUMN deployment text NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN served_model text NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN fallbacks text NOT NULL DEFAULT '';
ALTER TABLE usage_ledger ADD COLUMN deployment text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE usage_ledger DROP COLUMN deployment;
ALTER TABLE jobs DROP COLUMN fallbacks;
ALTER TABLE jobs DROP COLUMN served_model;
ALTER TABLE jobs DROP COLUMN deployment;
