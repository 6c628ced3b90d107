-- Tenants and their API keys. SQLite twin of postgres/001: STRICT tables,
-- times as TEXT 'YYYY-MM-DDTHH:MM:SS.ffffffZ' (UTC, fixed width, so text order
-- is time order), booleans as INTEGER 0/1.

-- +goose Up
CREATE TABLE tenants (
    id                     TEXT PRIMARY KEY,
    name                   TEXT NOT NULL,
    tier                   TEXT NOT NULL,
    budget_override_micros INTEGER CHECK (budget_override_micros >= 0),
    api_exempt             INTEGER NOT NULL DEFAULT 0 CHECK (api_exempt IN (0, 1)),
    webhook_secret         TEXT NOT NULL,
    created_at             TEXT NOT NULL,
    updated_at             TEXT NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL REFERENCES tenants (id),
    prefix     TEXT NOT NULL,
    hash       BLOB NOT NULL CHECK (length(hash) = 32),
    created_at TEXT NOT NULL,
    revoked_at TEXT
) STRICT;
-- APIKeyGetByHash: every authenticated request.
CREATE UNIQUE INDEX api_keys_hash ON api_keys (hash);
-- APIKeyListByTenant.
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, id);

-- +goose Down
DROP TABLE api_keys;
DROP TABLE tenants;
