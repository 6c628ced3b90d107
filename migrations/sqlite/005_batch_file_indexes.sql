-- Indexes of the files a batch uses. SQLite twin of postgres/005.

-- +goose Up
CREATE INDEX batches_input_file ON batches (input_file_id);
CREATE INDEX batches_output_file ON batches (output_file_id) WHERE output_file_id IS NOT NULL;
CREATE INDEX batches_error_file ON batches (error_file_id) WHERE error_file_id IS NOT NULL;

-- +goose Down
DROP INDEX batches_error_file;
DROP INDEX batches_output_file;
DROP INDEX batches_input_file;
