package batch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// The statuses of the jobs each generated file holds.
var (
	outputStatuses = []store.JobStatus{store.JobSucceeded}
	errorStatuses  = []store.JobStatus{store.JobFailed, store.JobCancelled}
)

// WriteFile writes the content of an ended batch's output file (a line per
// succeeded request) or error file (a line per other request) to w, in
// input order, reading the jobs a page at a time.
func WriteFile(ctx context.Context, db *store.DB, w io.Writer, b *store.Batch, purpose store.FilePurpose) error {
	statuses := outputStatuses
	if purpose == store.FilePurposeBatchError {
		statuses = errorStatuses
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := newLineEncoder(bw)
	err := db.JobStreamByBatch(ctx, b.ID, statuses, func(j *store.Job) error {
		return enc.Encode(wire.BatchResult(j, b.Status))
	})
	if err != nil {
		return err
	}
	return bw.Flush()
}

// newLineEncoder writes one JSON value per line, leaving <, > and & as they
// are (a provider's body is passed on unchanged).
func newLineEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

type size struct{ bytes, lines int64 }

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// sizes renders both files once, keeping only their sizes, for the file
// objects that announce them.
func sizes(ctx context.Context, db *store.DB, b *store.Batch, final store.BatchStatus) (out, errs size, err error) {
	var co, ce countingWriter
	eo, ee := newLineEncoder(&co), newLineEncoder(&ce)
	err = db.JobStreamByBatch(ctx, b.ID, nil, func(j *store.Job) error {
		switch j.Status {
		case store.JobSucceeded:
			out.lines++
			return eo.Encode(wire.BatchResult(j, final))
		case store.JobFailed, store.JobCancelled:
			errs.lines++
			return ee.Encode(wire.BatchResult(j, final))
		}
		return fmt.Errorf("job %s of batch %s is still %s", j.ID, b.ID, j.Status)
	})
	out.bytes, errs.bytes = co.n, ce.n
	return out, errs, err
}

// fileID is the id of a batch's output or error file, derived from the
// batch id and, for the error file whose content depends on it, how the
// batch ended: a finalization run again finds the file it made.
func fileID(batchID string, purpose store.FilePurpose, final store.BatchStatus) string {
	body := strings.TrimPrefix(batchID, ids.Batch)
	last := "0"
	if purpose == store.FilePurposeBatchError {
		last = map[store.BatchStatus]string{store.BatchCompleted: "1", store.BatchFailed: "2",
			store.BatchExpired: "3", store.BatchCancelled: "4"}[final]
	}
	return ids.File + body[:len(body)-1] + last
}

// writeFiles creates the file objects of a batch ending as final: an output
// file when a request succeeded, an error file when one did not.
func (s *Service) writeFiles(ctx context.Context, b *store.Batch, final store.BatchStatus) (outputID, errorID string, err error) {
	out, errs, err := sizes(ctx, s.Store, b, final)
	if err != nil {
		return "", "", err
	}
	mk := func(purpose store.FilePurpose, name string, sz size) (string, error) {
		if sz.lines == 0 {
			return "", nil
		}
		id := fileID(b.ID, purpose, final)
		_, err := s.Store.FileInsert(ctx, &store.FileInsertParams{ID: id, TenantID: b.TenantID, Purpose: purpose,
			Filename: name, BatchID: b.ID, Generated: true, Bytes: sz.bytes, Lines: sz.lines})
		if errors.Is(err, store.ErrConflict) { // made by an earlier, interrupted finalization?
			f, gerr := s.Store.FileGetByID(ctx, id)
			if gerr != nil {
				return "", gerr
			}
			if f.BatchID != b.ID {
				return "", fmt.Errorf("file id %s of batch %s is taken by another file", id, b.ID)
			}
			err = nil
		}
		return id, err
	}
	if outputID, err = mk(store.FilePurposeBatchOutput, b.ID+"_output.jsonl", out); err == nil {
		errorID, err = mk(store.FilePurposeBatchError, b.ID+"_error.jsonl", errs)
	}
	return outputID, errorID, err
}
