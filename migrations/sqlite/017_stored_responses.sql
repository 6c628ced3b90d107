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
INSERT OR IGNORE INTO stored_responses (id, response_id, tenant_id, deployment, tokens, created_at)
SELECT json_extract(response_body, '$.id'), json_extract(response_body, '$.id'), tenant_id, deployment,
    prompt_tokens + completion_tokens, finished_at
FROM jobs
WHERE endpoint = '/v1/responses' AND status = 'succeeded' AND json_extract(response_body, '$.object') = 'response'
    AND COALESCE(json_extract(request, '$.store'), 1) <> 0 AND length(json_extract(response_body, '$.id')) BETWEEN 1 AND 256
    AND finished_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-30 days');
INSERT OR IGNORE INTO stored_responses (id, response_id, tenant_id, deployment, tokens, created_at)
SELECT json_extract(item.value, '$.id'), json_extract(j.response_body, '$.id'), j.tenant_id, j.deployment, j.completion_tokens, j.finished_at
FROM jobs j, json_each(CASE WHEN json_type(j.response_body, '$.output') = 'array' THEN json_extract(j.response_body, '$.output') ELSE '[]' END) AS item
WHERE j.endpoint = '/v1/responses' AND j.status = 'succeeded' AND json_extract(j.response_body, '$.object') = 'response'
    AND COALESCE(json_extract(j.request, '$.store'), 1) <> 0 AND length(json_extract(j.response_body, '$.id')) BETWEEN 1 AND 256
    AND length(json_extract(item.value, '$.id')) BETWEEN 1 AND 256
    AND j.finished_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-30 days');

-- +goose Down
DROP TABLE stored_responses;
