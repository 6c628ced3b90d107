-- A tenant's webhook secret is rotated with an overlap. SQLite twin of
-- postgres/014.

-- +goose Up
ALTER TABLE tenants ADD COLUMN webhook_secret_previous TEXT;
ALTER TABLE tenants ADD COLUMN webhook_secret_previous_until TEXT;

-- +goose Down
ALTER TABLE tenants DROP COLUMN webhook_secret_previous_until;
ALTER TABLE tenants DROP COLUMN webhook_secret_previous;
