-- A job may be a synchronous request (POST /v1/chat/completions or
-- /v1/embeddings answered on the connection): it never has an asynq task,
-- so the reconciler must tell it apart from a job whose task was lost.

-- +goose Up
ALTER TABLE jobs ADD COLUMN sync boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE jobs DROP COLUMN sync;
