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
-- The stored responses of the last 30 days that llmq relayed before this
-- version, from their jobs, so their follow-ups still reach them.
INSERT INTO stored_responses (id, response_id, tenant_id, deployment, tokens, created_at)
SELECT response_body->>'id', response_body->>'id', tenant_id, deployment, prompt_tokens + completion_tokens, finished_at
FROM jobs
WHERE endpoint = '/v1/responses' AND status = 'succeeded' AND response_body->>'object' = 'response'
    AND COALESCE(request->>'store', 'true') <> 'false' AND length(response_body->>'id') BETWEEN 1 AND 256
    AND finished_at > now() - interval '30 days'
ON CONFLICT (id) DO NOTHING;
INSERT INTO stored_responses (id, response_id, tenant_id, deployment, tokens, created_at)
SELECT item->>'id', j.response_body->>'id', j.tenant_id, j.deployment, j.completion_tokens, j.finished_at
FROM jobs j, jsonb_array_elements(CASE WHEN jsonb_typeof(j.response_body->'output') = 'array' THEN j.response_body->'output' ELSE '[]' END) AS item
WHERE j.endpoint = '/v1/responses' AND j.status = 'succeeded' AND j.response_body->>'object' = 'response'
    AND COALESCE(j.request->>'store', 'true') <> 'false' AND length(j.response_body->>'id') BETWEEN 1 AND 256
    AND length(item->>'id') BETWEEN 1 AND 256 AND j.finished_at > now() - interval '30 days'
ON CONFLICT (id) DO NOTHING;

-- +goose Down
DROP TABLE IF EXISTS stored_responses;
