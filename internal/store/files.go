package store

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/llmq/llmq/internal/ids"
)

// FilePurpose is what a file is for, as OpenAI names it.
type FilePurpose string

// File purposes.
const (
	FilePurposeBatch       FilePurpose = "batch"        // a batch's input, uploaded by the client
	FilePurposeBatchOutput FilePurpose = "batch_output" // a batch's results, written by llmq
	FilePurposeBatchError  FilePurpose = "batch_error"  // a batch's failed lines, written by llmq
)

// File is a stored file's description; its content is read with FileOpen.
type File struct {
	ID        string
	TenantID  string
	Purpose   FilePurpose
	Filename  string
	Bytes     int64
	Lines     int64
	BatchID   string // the batch of an output or error file
	CreatedAt time.Time
}

const fileColumns = `id, tenant_id, purpose, filename, bytes, lines, batch_id, created_at`

func scanFile(r row) (*File, error) {
	var f File
	return &f, r.Scan(&f.ID, &f.TenantID, &f.Purpose, &f.Filename, &f.Bytes, &f.Lines, orZero[string]{&f.BatchID}, timeCol{&f.CreatedAt})
}

// FileInsertParams describe a file to store.
type FileInsertParams struct {
	ID       string // optional; a new ids.File id when empty
	TenantID string
	Purpose  FilePurpose
	Filename string
	BatchID  string    // optional; the batch of an output or error file
	Content  io.Reader // read to EOF; the caller bounds its size
	// Generated stores only the description of a file made on read (a
	// batch's output and error files), of size Bytes and Lines.
	Generated    bool
	Bytes, Lines int64
}

// FileInsert stores p.Content in chunks, in one transaction.
func (db *DB) FileInsert(ctx context.Context, p *FileInsertParams) (*File, error) {
	if err := required("FileInsert", "TenantID", p.TenantID, "Filename", p.Filename); err != nil {
		return nil, err
	}
	id := cmp.Or(p.ID, ids.New(ids.File))
	insert := func(q querier, size, lines int64) (*File, error) {
		return scanFile(q.queryRow(ctx, `INSERT INTO files (id, tenant_id, purpose, filename, bytes, lines, batch_id, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING `+fileColumns,
			id, p.TenantID, string(p.Purpose), p.Filename, size, lines, orNull(p.BatchID), db.d.ts(db.nowUTC())))
	}
	if p.Generated {
		if p.Content != nil || p.Bytes < 0 || p.Lines < 0 {
			return nil, errors.New("store: FileInsert: a generated file has no Content and a size of at least 0")
		}
		f, err := insert(db.rw, p.Bytes, p.Lines)
		return f, failed("FileInsert", db.d.wrap(err))
	}
	if p.Content == nil {
		return nil, errors.New("store: FileInsert: Content is nil")
	}
	content := p.Content
	if _, local := content.(io.ReaderAt); db.d.spoolUploads && !local {
		spool, err := spoolToTemp(content)
		if err != nil {
			return nil, err
		}
		defer func() {
			_ = spool.Close()
			_ = os.Remove(spool.Name())
		}()
		content = spool
	}
	var f *File
	err := db.tx(ctx, func(tx querier) error {
		if _, err := insert(tx, 0, 0); err != nil {
			return err
		}
		buf := make([]byte, db.chunkSize)
		var size, lines int64
		var last byte
		for seq := 0; ; seq++ {
			n, rerr := io.ReadFull(content, buf)
			if n > 0 {
				if _, err := tx.exec(ctx, `INSERT INTO file_chunks (file_id, seq, data) VALUES ($1, $2, $3)`, id, seq, buf[:n]); err != nil {
					return err
				}
				size += int64(n)
				lines += int64(bytes.Count(buf[:n], []byte{'\n'}))
				last = buf[n-1]
			}
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				break
			}
			if rerr != nil {
				return fmt.Errorf("read content: %w", rerr)
			}
		}
		if size > 0 && last != '\n' {
			lines++
		}
		var err error
		f, err = scanFile(tx.queryRow(ctx, `UPDATE files SET bytes = $2, lines = $3 WHERE id = $1 RETURNING `+fileColumns,
			id, size, lines))
		return err
	})
	if err != nil {
		return nil, failed("FileInsert", err)
	}
	return f, nil
}

func spoolToTemp(r io.Reader) (*os.File, error) {
	f, err := os.CreateTemp("", "llmq-upload-*")
	if err != nil {
		return nil, fmt.Errorf("store: FileInsert: spool: %w", err)
	}
	if _, err = io.Copy(f, r); err != nil {
		err = fmt.Errorf("store: FileInsert: read content: %w", err)
	} else if _, err = f.Seek(0, io.SeekStart); err != nil {
		err = fmt.Errorf("store: FileInsert: spool: %w", err)
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return nil, err
	}
	return f, nil
}

// FileGetByID returns the file, or ErrNotFound.
func (db *DB) FileGetByID(ctx context.Context, id string) (*File, error) {
	return getOne(ctx, db.ro, scanFile, "file", id, `SELECT `+fileColumns+` FROM files WHERE id = $1`, id)
}

// FileGetForTenant returns the tenant's file; another tenant's is
// ErrNotFound (read by its key alone, as JobGetForTenant).
func (db *DB) FileGetForTenant(ctx context.Context, tenantID, id string) (*File, error) {
	f, err := db.FileGetByID(ctx, id)
	if err == nil && f.TenantID != tenantID {
		return nil, notFound("file", id)
	}
	return f, err
}

// FileOpen returns the file's content, read one chunk per query. Check the
// tenant first.
func (db *DB) FileOpen(ctx context.Context, id string) (io.ReadCloser, error) {
	if _, err := db.FileGetByID(ctx, id); err != nil {
		return nil, err
	}
	return &chunkReader{ctx: ctx, db: db, id: id, seq: -1}, nil
}

type chunkReader struct {
	ctx context.Context
	db  *DB
	id  string
	seq int // the last chunk fetched
	buf []byte
	eof bool
}

// fill fetches chunks until r.buf holds data, and reports whether it does.
func (r *chunkReader) fill() (bool, error) {
	for len(r.buf) == 0 && !r.eof {
		err := r.db.ro.queryRow(r.ctx, `SELECT seq, data FROM file_chunks WHERE file_id = $1 AND seq > $2 ORDER BY seq LIMIT 1`,
			r.id, r.seq).Scan(&r.seq, &r.buf)
		if errors.Is(err, sql.ErrNoRows) {
			r.eof = true
		} else if err != nil {
			return false, fmt.Errorf("store: read file %s: %w", r.id, err)
		}
	}
	return len(r.buf) > 0, nil
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if ok, err := r.fill(); !ok {
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// WriteTo lets io.Copy hand each chunk to w without another copy.
func (r *chunkReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if ok, err := r.fill(); !ok {
			return total, err
		}
		n, err := w.Write(r.buf)
		total += int64(n)
		r.buf = r.buf[n:]
		if err != nil {
			return total, err
		}
	}
}

func (r *chunkReader) Close() error {
	r.buf = nil
	return nil
}

// batchesUsing selects the unfinished batches that use file id.
func batchesUsing(id string) string {
	return `FROM batches WHERE (input_file_id = ` + id + ` OR output_file_id = ` + id +
		` OR error_file_id = ` + id + `) AND status NOT IN ('failed', 'completed', 'expired', 'cancelled')`
}

var sqlFileUsedByBatches = `SELECT count(*) ` + batchesUsing("$1")

// FileDelete deletes the tenant's file. One an unfinished batch uses is
// ErrConflict.
func (db *DB) FileDelete(ctx context.Context, tenantID, id string) error {
	return db.tx(ctx, func(tx querier) error {
		var used int
		if err := tx.queryRow(ctx, sqlFileUsedByBatches, id).Scan(&used); err != nil {
			return err
		}
		if used > 0 {
			return fmt.Errorf("%w: file %q is used by a batch", ErrConflict, id)
		}
		n, err := tx.exec(ctx, `DELETE FROM files WHERE id = $1 AND tenant_id = $2`, id, tenantID)
		if err != nil {
			return err
		}
		if n == 0 {
			return notFound("file", id)
		}
		return nil
	})
}

// FileListParams select a page of a tenant's files.
type FileListParams struct {
	TenantID string
	Purpose  FilePurpose // optional
	After    string      // id of the last file of the previous page
	Limit    int         // default 20, at most 1000
}

// FileList returns a page of the tenant's files.
func (db *DB) FileList(ctx context.Context, p *FileListParams) ([]*File, bool, error) {
	if err := required("FileList", "TenantID", p.TenantID); err != nil {
		return nil, false, err
	}
	return page(ctx, db.ro, scanFile, fileListSQL(p))
}

// fileListSQL reads files_tenant or files_tenant_purpose.
func fileListSQL(p *FileListParams) pageQuery {
	return tenantPage(`SELECT `+fileColumns+` FROM files`, p.After, p.Limit,
		"tenant_id", p.TenantID, "purpose", string(p.Purpose))
}
