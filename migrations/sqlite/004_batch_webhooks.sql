-- A batch may name a webhook, called once when it reaches a terminal state.
-- SQLite twin of postgres/004.

-- +goose Up
ALTER TABLE batches ADD COLUMN webhook_url TEXT;

-- +goose Down
ALTER TABLE batches DROP COLUMN webhook_url;
