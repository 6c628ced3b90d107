-- The responses a provider stored for a tenant. SQLite twin of
-- postgres/017.

-- +goose Up
CREATE TABLE stored_responses (
    id          TEXT PRIMARY KEY,
    response_id TEXT NOT NULL,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    deployment  TEXT NOT NULL,
    tokens      INTEGER NOT NULL CHECK (tokens >= 0),
    created_at  TEXT NOT NULL
) STRICT;
CREATE INDEX stored_responses_created ON stored_responses (created_at);

-- +goose Down
DROP TABLE stored_responses;
