-- A tenant's webhook secret is rotated with an overlap: until
-- webhook_secret_previous_until, deliveries are signed with the previous
-- secret too, so receivers can move to the new one without missing any.

-- +goose Up
ALTER TABLE tenants ADD COLUMN webhook_secret_previous text;
ALTER TABLE tenants ADD COLUMN webhook_secret_previous_until timestamptz;

-- +goose Down
ALTER TABLE tenants DROP COLUMN webhook_secret_previous_until;
ALTER TABLE tenants DROP COLUMN webhook_secret_previous;
