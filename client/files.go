package client

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"iter"
	"mime/multipart"
	"net/http"
	"path/filepath"
)

// FilesService calls /v1/files: batch input files, and the output and error
// files llmq writes for batches.
type FilesService struct{ c *Client }

// Upload stores content, streamed as it is read, as a file of purpose
// ("batch" when empty) named filename. A 429 is retried only when content
// is an io.Seeker: a plain reader cannot be read twice.
func (s *FilesService) Upload(ctx context.Context, filename string, content io.Reader, purpose string) (*File, error) {
	purpose, filename = cmp.Or(purpose, "batch"), filepath.Base(cmp.Or(filename, "input.jsonl"))
	seeker, canSeek := content.(io.Seeker)
	var start int64
	if canSeek {
		var err error
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			canSeek = false
		}
	}
	var prev *upload
	body := func() (io.ReadCloser, string, bool, error) {
		if prev != nil {
			// The transport may still be reading the last attempt's
			// pipe; end it and wait, so two writers never share content.
			prev.stop()
			if _, err := seeker.Seek(start, io.SeekStart); err != nil {
				return nil, "", false, fmt.Errorf("llmq: upload %s: rewinding for a retry: %w", filename, err)
			}
		}
		prev = startUpload(content, filename, purpose)
		return prev.pr, prev.contentType, canSeek, nil
	}
	defer func() {
		switch {
		case prev == nil:
		case canSeek:
			prev.stop()
		default:
			// A pipe or a terminal may block in Read for ever: close the
			// pipe, and the writer ends at its next write.
			_ = prev.pr.CloseWithError(io.ErrClosedPipe)
		}
	}()
	return call[File](ctx, s.c, &request{method: http.MethodPost, path: "/v1/files", body: body})
}

// upload is one attempt's multipart body, written by a goroutine into a
// pipe that the HTTP transport reads.
type upload struct {
	pr          *io.PipeReader
	contentType string
	done        chan struct{}
}

func startUpload(content io.Reader, filename, purpose string) *upload {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	u := &upload{pr: pr, contentType: mw.FormDataContentType(), done: make(chan struct{})}
	go func() {
		defer close(u.done)
		pw.CloseWithError(writeUpload(mw, content, filename, purpose))
	}()
	return u
}

// writeUpload writes the parts OpenAI's files endpoint takes: purpose first,
// so a server can check it before the content arrives, then the file.
func writeUpload(mw *multipart.Writer, content io.Reader, filename, purpose string) error {
	if err := mw.WriteField("purpose", purpose); err != nil {
		return err
	}
	part, err := mw.CreateFormFile("file", filename)
	if err != nil {
		return err
	}
	if _, err := io.Copy(part, content); err != nil {
		return err
	}
	return mw.Close()
}

// stop ends the attempt's writer (if the transport has not read it all) and
// waits for it to return.
func (u *upload) stop() {
	_ = u.pr.CloseWithError(io.ErrClosedPipe)
	<-u.done
}

// Get returns a file's description.
func (s *FilesService) Get(ctx context.Context, id string) (*File, error) {
	return call[File](ctx, s.c, &request{method: http.MethodGet, path: "/v1/files/" + pathID(id)})
}

// Delete deletes an uploaded file that no batch uses; a batch's input,
// output or error file is refused with a 409.
func (s *FilesService) Delete(ctx context.Context, id string) (*FileDeleted, error) {
	return call[FileDeleted](ctx, s.c, &request{method: http.MethodDelete, path: "/v1/files/" + pathID(id)})
}

// FileListParams filter and page GET /v1/files. Zero fields are left out.
type FileListParams struct {
	// Purpose is "batch" (uploaded inputs) or "batch_output" (the output
	// and error files of batches).
	Purpose string
	// Limit is the page size, 1 to 1000. Defaults to the server's (20).
	Limit int
	// After is the last id of the previous page.
	After string
}

// List returns one page of the tenant's files, newest first.
func (s *FilesService) List(ctx context.Context, p *FileListParams) (*List[File], error) {
	q := deref(p)
	return call[List[File]](ctx, s.c, &request{method: http.MethodGet, path: "/v1/files", query: query(q.Limit, "after", q.After, "purpose", q.Purpose)})
}

// All iterates over every file that p selects, page after page.
func (s *FilesService) All(ctx context.Context, p *FileListParams) iter.Seq2[*File, error] {
	q := deref(p)
	return pages(&q.After, func() (*List[File], error) { return s.List(ctx, &q) })
}

// Content returns a file's content as it arrives; the caller reads and
// closes it. Batch output and error files are JSON lines of BatchResult.
func (s *FilesService) Content(ctx context.Context, id string) (io.ReadCloser, error) {
	resp, err := s.c.send(ctx, &request{method: http.MethodGet, path: "/v1/files/" + pathID(id) + "/content"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
