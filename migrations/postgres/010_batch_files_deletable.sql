-- A batch names its files by id without holding them: once the batch has
-- ended, its input, output and error files may be deleted (FileDelete
-- refuses while the batch runs), and the batch still says which they were,
-- as OpenAI's does.

-- +goose Up
ALTER TABLE batches DROP CONSTRAINT batches_input_file_id_fkey;
ALTER TABLE batches DROP CONSTRAINT batches_output_file_id_fkey;
ALTER TABLE batches DROP CONSTRAINT batches_error_file_id_fkey;

-- +goose Down
-- Batches whose files were deleted cannot hold the constraints again: their
-- ids are cleared first (the input file's is required, so those batches go).
UPDATE batches SET output_file_id = NULL WHERE output_file_id IS NOT NULL AND output_file_id NOT IN (SELECT id FROM files);
UPDATE batches SET error_file_id = NULL WHERE error_file_id IS NOT NULL AND error_file_id NOT IN (SELECT id FROM files);
UPDATE jobs SET batch_id = NULL WHERE batch_id IN (SELECT id FROM batches WHERE input_file_id NOT IN (SELECT id FROM files));
DELETE FROM batches WHERE input_file_id NOT IN (SELECT id FROM files);
ALTER TABLE batches ADD CONSTRAINT batches_input_file_id_fkey FOREIGN KEY (input_file_id) REFERENCES files (id);
ALTER TABLE batches ADD CONSTRAINT batches_output_file_id_fkey FOREIGN KEY (output_file_id) REFERENCES files (id);
ALTER TABLE batches ADD CONSTRAINT batches_error_file_id_fkey FOREIGN KEY (error_file_id) REFERENCES files (id);
