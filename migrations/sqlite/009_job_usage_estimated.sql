-- A job's usage may be llmq's estimate rather than the provider's count: an
-- answer that said nothing of its usage is charged at the reservation's
-- worst case, and the job says so. SQLite twin of postgres/009.

-- +goose Up
ALTER TABLE jobs ADD COLUMN usage_estimated INTEGER NOT NULL DEFAULT 0 CHECK (usage_estimated IN (0, 1));

-- +goose Down
ALTER TABLE jobs DROP COLUMN usage_estimated;
