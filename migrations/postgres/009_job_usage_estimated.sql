-- A job's usage may be llmq's estimate rather than the provider's count: an
-- answer that said nothing of its usage is charged at the reservation's
-- worst case, and the job says so.

-- +goose Up
ALTER TABLE jobs ADD COLUMN usage_estimated boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE jobs DROP COLUMN usage_estimated;
