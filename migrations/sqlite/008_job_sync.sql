-- A job may be a synchronous request (POST /v1/chat/completions or
-- /v1/embeddings answered on the connection): it never has an asynq task,
-- so the reconciler must tell it apart from a job whose task was lost.
-- SQLite twin of postgres/008.

-- +goose Up
ALTER TABLE jobs ADD COLUMN sync INTEGER NOT NULL DEFAULT 0 CHECK (sync IN (0, 1));

-- +goose Down
ALTER TABLE jobs DROP COLUMN sync;
