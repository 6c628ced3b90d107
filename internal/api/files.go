package api

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// uploadFile is POST /v1/files: multipart/form-data with the fields purpose
// ("batch") and file; other fields are ignored. The file is streamed to a
// temporary file on disk (never held in memory), counted against the limits
// as it arrives, and stored once the whole body has been read and accepted:
// a slow client holds no database connection, and a refused upload stores
// nothing.
func (s *batchAPI) uploadFile(w http.ResponseWriter, r *http.Request) error {
	// The multipart envelope and the purpose field get a MiB beside the file.
	r.Body = http.MaxBytesReader(w, r.Body, s.limits.MaxFileBytes+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		return wire.Invalid("", client.CodeInvalidContentType,
			"Upload files as multipart/form-data with the fields purpose=batch and file.")
	}
	var purpose, filename string
	var gotPurp bool
	var spool *os.File
	defer func() {
		if spool != nil {
			_ = spool.Close()
			_ = os.Remove(spool.Name())
		}
	}()
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return multipartError(err)
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(part, 64))
			if err != nil {
				return multipartError(err)
			}
			purpose, gotPurp = strings.TrimSpace(string(b)), true
			if purpose != string(store.FilePurposeBatch) {
				return wire.Invalid("purpose", client.CodeInvalidValue, "purpose must be 'batch' (the input of a batch), got '%.40s'.", purpose)
			}
		case "file":
			if spool != nil {
				return wire.Invalid("file", client.CodeInvalidValue, "Send one file per upload.")
			}
			filename = uploadName(part.FileName())
			if spool, err = os.CreateTemp("", "llmq-upload-*"); err != nil {
				return err
			}
			limited := &uploadLimit{r: part, maxBytes: s.limits.MaxFileBytes, maxLines: int64(s.limits.MaxFileLines)}
			if _, err := io.Copy(spool, limited); err != nil {
				if limited.err != nil { // the upload's, not the disk's
					return multipartError(limited.err)
				}
				return err
			}
		default:
			if _, err := io.Copy(io.Discard, part); err != nil {
				return multipartError(err)
			}
		}
	}
	if !gotPurp {
		return wire.Invalid("purpose", client.CodeMissingRequiredParameter, "purpose is required: 'batch'.")
	}
	if spool == nil {
		return wire.Invalid("file", client.CodeMissingRequiredParameter, "file is required: the JSONL input of a batch.")
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return err
	}
	f, err := s.Store.FileInsert(r.Context(), &store.FileInsertParams{TenantID: callerOf(r).tenant.ID,
		Purpose: store.FilePurposeBatch, Filename: filename, Content: spool})
	if err != nil {
		return err
	}
	s.Logger.Info("file uploaded", "tenant", f.TenantID, "file", f.ID, "bytes", f.Bytes, "lines", f.Lines)
	return writeOK(w, wire.File(f))
}

// uploadName is the file name to keep: its base name, at most 255 bytes; a
// name that is not UTF-8 text (or holds a NUL) becomes "upload.jsonl".
func uploadName(name string) string {
	name = filepath.Base(strings.ReplaceAll(name, `\`, "/"))
	if name == "." || name == "/" || name == "" || !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0 {
		return "upload.jsonl"
	}
	for len(name) > 255 {
		_, size := utf8.DecodeLastRuneInString(name)
		name = name[:len(name)-size]
	}
	return name
}

// multipartError names what went wrong reading an upload: a limit (413 or
// 400), or a malformed or truncated body (400).
func multipartError(err error) error {
	var e *wire.Error
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &mbe):
		return wire.Errorf(http.StatusRequestEntityTooLarge, wire.TypeInvalidRequest, client.CodeFileTooLarge, "file",
			"The upload is larger than the limit of %d bytes per file.", mbe.Limit-1<<20)
	}
	return wire.Invalid("", client.CodeInvalidMultipart, "The multipart body is malformed or truncated.")
}

// uploadLimit counts an upload's bytes and lines as it is read, failing
// the read past maxBytes or maxLines: the store then keeps nothing.
type uploadLimit struct {
	r                  io.Reader
	maxBytes, maxLines int64
	n, newlines        int64
	last               byte
	// err is the upload's own failure (a limit, a malformed or cut body),
	// sticky: a reader may drop an error that came with data.
	err error
}

func (u *uploadLimit) Read(p []byte) (int, error) {
	if u.err != nil {
		return 0, u.err
	}
	n, err := u.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		u.err = err
		return n, err
	}
	if n > 0 {
		u.n += int64(n)
		u.newlines += int64(bytes.Count(p[:n], []byte{'\n'}))
		u.last = p[n-1]
	}
	lines := u.newlines
	if errors.Is(err, io.EOF) && u.n > 0 && u.last != '\n' {
		lines++ // a last line without its newline
	}
	switch {
	case u.n > u.maxBytes:
		u.err = wire.Errorf(http.StatusRequestEntityTooLarge, wire.TypeInvalidRequest, client.CodeFileTooLarge, "file",
			"The file is larger than the limit of %d bytes.", u.maxBytes)
	case lines > u.maxLines:
		u.err = wire.Invalid("file", client.CodeTooManyLines, "The file has more than the limit of %d lines.", u.maxLines)
	default:
		return n, err
	}
	return n, u.err
}

// deleteFile is DELETE /v1/files/{id}. A file a running batch uses stays.
func (s *batchAPI) deleteFile(w http.ResponseWriter, r *http.Request) error {
	f, err := s.fileByPath(r)
	if err != nil {
		return err
	}
	err = s.Store.FileDelete(r.Context(), f.TenantID, f.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return notFound("file", f.ID)
	case errors.Is(err, store.ErrConflict):
		return wire.Errorf(http.StatusConflict, wire.TypeInvalidRequest, client.CodeFileInUse, "", "File %s is the input, output or error file of a batch that has not ended; it can be deleted once the batch ends.", f.ID)
	case err != nil:
		return err
	}
	return writeOK(w, wire.FileDeleted(f))
}

func (s *batchAPI) getFile(w http.ResponseWriter, r *http.Request) error {
	f, err := s.fileByPath(r)
	if err != nil {
		return err
	}
	return writeOK(w, wire.File(f))
}

func (s *batchAPI) fileByPath(r *http.Request) (*store.File, error) {
	return callersByID(r, r.PathValue("id"), ids.File, "file", s.Store.FileGetForTenant)
}

func (s *batchAPI) listFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, after, err := listPage(q, 1000, ids.File, "file")
	if err != nil {
		return err
	}
	p := &store.FileListParams{TenantID: callerOf(r).tenant.ID, After: after, Limit: limit}
	if pu := q.Get("purpose"); pu != "" {
		if pu != string(store.FilePurposeBatch) && pu != string(store.FilePurposeBatchOutput) {
			return wire.Invalid("purpose", client.CodeInvalidValue, "purpose must be batch or batch_output, got '%.40s'.", pu)
		}
		p.Purpose = store.FilePurpose(pu)
	}
	fs, more, err := s.Store.FileList(r.Context(), p)
	if err != nil {
		return err
	}
	return writeList(w, fs, more, wire.File, func(f client.File) string { return f.ID })
}

// fileContent is GET /v1/files/{id}/content. An uploaded file is read from
// its stored chunks; a batch's output or error file is rendered from the
// batch's jobs. Either way it is streamed, never held whole.
func (s *batchAPI) fileContent(w http.ResponseWriter, r *http.Request) error {
	f, err := s.fileByPath(r)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if cd := mime.FormatMediaType("attachment", map[string]string{"filename": f.Filename}); cd != "" {
		w.Header().Set("Content-Disposition", cd) // quoted, or RFC 2231-encoded when not ASCII
	}
	if f.BatchID != "" && f.Purpose != store.FilePurposeBatch {
		b, err := s.Store.BatchGetForTenant(r.Context(), f.TenantID, f.BatchID)
		if err != nil {
			return err
		}
		return s.streamed(r, batch.WriteFile(r.Context(), s.Store, streamTo(w, r), b, f.Purpose))
	}
	rc, err := s.Store.FileOpen(r.Context(), f.ID)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	_, err = io.Copy(streamTo(w, r), rc)
	return s.streamed(r, err)
}

// streamed handles the end of a streamed answer: once bytes are sent, an
// error cannot become an error answer, so the connection is cut instead, and
// the client sees a truncated download rather than a short file.
func (s *batchAPI) streamed(r *http.Request, err error) error {
	if err == nil {
		return nil
	}
	if r.Context().Err() == nil {
		s.Logger.Error("file download failed", "path", r.URL.Path, "err", err)
	}
	panic(http.ErrAbortHandler)
}
