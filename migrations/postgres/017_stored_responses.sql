-- The responses a provider stored for a tenant, as llmq relayed them (and
-- the items of their output, which an item_reference names): whose each
-- is, the deployment whose account holds it, and the tokens a follow-up
-- naming it brings into its prompt. A follow-up naming another tenant's is
-- refused; one naming its tenant's goes to that deployment and reserves
-- those tokens.

-- +goose Up
CREATE TABLE IF NOT EXISTS stored_responses (
    id          text COLLATE "C" PRIMARY KEY,  -- the provider's id of a response, or of an item of its output
    response_id text COLLATE "C" NOT NULL,     -- the response (its own id for a response)
    tenant_id   text COLLATE "C" NOT NULL REFERENCES tenants (id),
    deployment  text NOT NULL,                 -- provider/upstream
    tokens      bigint NOT NULL CHECK (tokens >= 0),
    created_at  timestamptz NOT NULL
);
-- Retention purges by age.
CREATE INDEX IF NOT EXISTS stored_responses_created ON stored_responses (created_at);

-- +goose Down
DROP TABLE IF EXISTS stored_responses;
