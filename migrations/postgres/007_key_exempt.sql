-- A key may be exempt from its tier's API rate limit on its own (an
-- internal service's key), not only through its tenant or tier. Exempt keys
-- are few; the partial index holds only the unrevoked ones, for the admin
-- dashboard.

-- +goose Up
ALTER TABLE api_keys ADD COLUMN api_exempt boolean NOT NULL DEFAULT false;
-- APIKeyListExempt; the predicate is repeated literally in its query.
CREATE INDEX api_keys_exempt ON api_keys (id) WHERE api_exempt = TRUE AND revoked_at IS NULL;

-- +goose Down
DROP INDEX api_keys_exempt;
ALTER TABLE api_keys DROP COLUMN api_exempt;
