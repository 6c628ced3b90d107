-- Tenants and their API keys.
--
-- Ids are time-ordered ASCII; COLLATE "C" makes their order byte order (as in
-- Go and SQLite) whatever the database's collation, and comparisons cheap.

-- +goose Up
CREATE TABLE tenants (
    id                     text COLLATE "C" PRIMARY KEY,
    name                   text NOT NULL,
    tier                   text NOT NULL,
    budget_override_micros bigint CHECK (budget_override_micros >= 0),
    api_exempt             boolean NOT NULL DEFAULT false,
    webhook_secret         text NOT NULL,
    created_at             timestamptz NOT NULL,
    updated_at             timestamptz NOT NULL
);
-- TenantList pages by id (the primary key); no other index needed.

CREATE TABLE api_keys (
    id         text COLLATE "C" PRIMARY KEY,
    tenant_id  text COLLATE "C" NOT NULL REFERENCES tenants (id),
    prefix     text NOT NULL,
    hash       bytea NOT NULL CHECK (octet_length(hash) = 32),
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);
-- APIKeyGetByHash: every authenticated request.
CREATE UNIQUE INDEX api_keys_hash ON api_keys (hash);
-- APIKeyListByTenant.
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, id);

-- +goose Down
DROP TABLE api_keys;
DROP TABLE tenants;
