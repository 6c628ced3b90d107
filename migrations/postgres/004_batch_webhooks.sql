-- A batch may name a webhook, called once when it reaches a terminal state.

-- +goose Up
ALTER TABLE batches ADD COLUMN webhook_url text;

-- +goose Down
ALTER TABLE batches DROP COLUMN webhook_url;
