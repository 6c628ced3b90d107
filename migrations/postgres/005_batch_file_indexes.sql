-- FileDelete asks whether any batch uses a file (as its input, output or
-- error file), and deleting a file row makes the database check the same
-- three foreign keys: without these, each is a scan of every batch.
-- Output and error files are absent until a batch finishes, so those two
-- indexes hold only the rows that have one.

-- +goose Up
CREATE INDEX batches_input_file ON batches (input_file_id);
CREATE INDEX batches_output_file ON batches (output_file_id) WHERE output_file_id IS NOT NULL;
CREATE INDEX batches_error_file ON batches (error_file_id) WHERE error_file_id IS NOT NULL;

-- +goose Down
DROP INDEX batches_error_file;
DROP INDEX batches_output_file;
DROP INDEX batches_input_file;
