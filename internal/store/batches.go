package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/llmq/llmq/internal/ids"
)

// BatchStatus is where a batch is in its life, as OpenAI names it.
type BatchStatus string

// Batch statuses.
const (
	BatchValidating BatchStatus = "validating"
	BatchFailed     BatchStatus = "failed" // terminal: the input did not validate
	BatchInProgress BatchStatus = "in_progress"
	BatchFinalizing BatchStatus = "finalizing"
	BatchCompleted  BatchStatus = "completed" // terminal
	BatchExpired    BatchStatus = "expired"   // terminal
	BatchCancelling BatchStatus = "cancelling"
	BatchCancelled  BatchStatus = "cancelled" // terminal
)

// Terminal reports whether s is final.
func (s BatchStatus) Terminal() bool {
	return s == BatchFailed || s == BatchCompleted || s == BatchExpired || s == BatchCancelled
}

// batchStamps are the column a move to each status stamps (validating's is
// created_at).
var batchStamps = map[BatchStatus]string{
	BatchValidating: "", BatchFailed: "failed_at", BatchInProgress: "in_progress_at", BatchFinalizing: "finalizing_at",
	BatchCompleted: "completed_at", BatchExpired: "expired_at", BatchCancelling: "cancelling_at", BatchCancelled: "cancelled_at",
}

// Valid reports whether s is a known status.
func (s BatchStatus) Valid() bool { _, ok := batchStamps[s]; return ok }

// activeBatchSQL is the literal predicate of the batches_active partial index.
const activeBatchSQL = `status IN ('validating', 'in_progress', 'finalizing', 'cancelling')`

// Batch is an OpenAI-style batch; its request counts come from its jobs.
type Batch struct {
	ID               string
	TenantID         string
	InputFileID      string
	OutputFileID     string // "" until written
	ErrorFileID      string // "" until written
	Endpoint         string
	CompletionWindow string
	Status           BatchStatus
	Metadata         json.RawMessage
	Errors           json.RawMessage // validation errors, OpenAI's {"object":"list","data":[...]}
	Total            int64           // input lines
	WebhookURL       string          // called on the terminal state; "" for none
	CreatedAt        time.Time
	ExpiresAt        *time.Time
	InProgressAt     *time.Time
	FinalizingAt     *time.Time
	CompletedAt      *time.Time
	FailedAt         *time.Time
	ExpiredAt        *time.Time
	CancellingAt     *time.Time
	CancelledAt      *time.Time
}

const batchColumns = `id, tenant_id, input_file_id, output_file_id, error_file_id, endpoint, completion_window,
	status, metadata, errors, total, created_at, expires_at, in_progress_at, finalizing_at, completed_at,
	failed_at, expired_at, cancelling_at, cancelled_at, webhook_url`

func scanBatch(r row) (*Batch, error) {
	var b Batch
	return &b, r.Scan(&b.ID, &b.TenantID, &b.InputFileID, orZero[string]{&b.OutputFileID}, orZero[string]{&b.ErrorFileID},
		&b.Endpoint, &b.CompletionWindow, &b.Status, (*[]byte)(&b.Metadata), (*[]byte)(&b.Errors), &b.Total,
		timeCol{&b.CreatedAt}, nullTimeCol{&b.ExpiresAt}, nullTimeCol{&b.InProgressAt}, nullTimeCol{&b.FinalizingAt},
		nullTimeCol{&b.CompletedAt}, nullTimeCol{&b.FailedAt}, nullTimeCol{&b.ExpiredAt}, nullTimeCol{&b.CancellingAt},
		nullTimeCol{&b.CancelledAt}, orZero[string]{&b.WebhookURL})
}

// BatchInsertParams describe a new batch; it starts validating.
type BatchInsertParams struct {
	ID               string // optional; a new ids.Batch id when empty
	TenantID         string
	InputFileID      string
	Endpoint         string
	CompletionWindow string
	Metadata         json.RawMessage
	ExpiresAt        time.Time // optional
	Total            int64     // optional; known after validation
	WebhookURL       string    // optional
}

// BatchInsert creates a batch. An unknown input file is ErrNotFound (not
// a foreign key, so that an ended batch's files may be deleted).
func (db *DB) BatchInsert(ctx context.Context, p *BatchInsertParams) (*Batch, error) {
	err := required("BatchInsert", "TenantID", p.TenantID, "InputFileID", p.InputFileID,
		"Endpoint", p.Endpoint, "CompletionWindow", p.CompletionWindow)
	if err != nil {
		return nil, err
	}
	b, err := getOne(ctx, db.rw, scanBatch, "file", p.InputFileID, `
		INSERT INTO batches (id, tenant_id, input_file_id, endpoint, completion_window, status, metadata, total, created_at, expires_at, webhook_url)
		SELECT $1, $2, id, $4, $5, 'validating', $6, $7, $8, $9, $10 FROM files WHERE id = $3
		RETURNING `+batchColumns,
		cmp.Or(p.ID, ids.New(ids.Batch)), p.TenantID, p.InputFileID, p.Endpoint, p.CompletionWindow, nullJSON(p.Metadata), p.Total,
		db.d.ts(db.nowUTC()), db.d.tsOrNull(&p.ExpiresAt), orNull(p.WebhookURL))
	return b, db.d.wrap(err)
}

// BatchGetByID returns the batch, or ErrNotFound.
func (db *DB) BatchGetByID(ctx context.Context, id string) (*Batch, error) {
	return getOne(ctx, db.ro, scanBatch, "batch", id, `SELECT `+batchColumns+` FROM batches WHERE id = $1`, id)
}

// BatchGetForTenant returns the tenant's batch; another tenant's is ErrNotFound.
func (db *DB) BatchGetForTenant(ctx context.Context, tenantID, id string) (*Batch, error) {
	return getOne(ctx, db.ro, scanBatch, "batch", id, `SELECT `+batchColumns+` FROM batches WHERE id = $1 AND tenant_id = $2`, id, tenantID)
}

// BatchListParams select a page of a tenant's batches.
type BatchListParams struct {
	TenantID string
	After    string // id of the last batch of the previous page
	Limit    int    // default 20, at most 1000
}

// BatchList returns a page of the tenant's batches.
func (db *DB) BatchList(ctx context.Context, p *BatchListParams) ([]*Batch, bool, error) {
	if err := required("BatchList", "TenantID", p.TenantID); err != nil {
		return nil, false, err
	}
	return page(ctx, db.ro, scanBatch, batchListSQL(p))
}

// batchListSQL reads batches_tenant.
func batchListSQL(p *BatchListParams) pageQuery {
	return tenantPage(`SELECT `+batchColumns+` FROM batches`, p.After, p.Limit, "tenant_id", p.TenantID)
}

// BatchSetStatusParams describe a conditional batch status change.
type BatchSetStatusParams struct {
	ID       string
	TenantID string        // optional: only the tenant's batch
	From     []BatchStatus // the statuses it may be in; never terminal ones
	To       BatchStatus
	// Optional fields written with the change: empty or nil leaves them.
	OutputFileID string
	ErrorFileID  string
	Errors       json.RawMessage
	Total        *int64
}

// BatchSetStatus moves the batch to p.To if its status is one of p.From,
// stamping p.To's column once, as JobSetStatus.
func (db *DB) BatchSetStatus(ctx context.Context, p *BatchSetStatusParams) (*Batch, bool, error) {
	stamp := batchStamps[p.To]
	from, err := unfinished("BatchSetStatus", "From", p.From)
	if err != nil {
		return nil, false, err
	}
	var a args
	q := `UPDATE batches SET status = ` + a.add(string(p.To))
	if stamp != "" {
		q += `, ` + stamp + ` = COALESCE(` + stamp + `, ` + a.add(db.d.ts(db.nowUTC())) + `)`
	}
	if p.OutputFileID != "" {
		q += `, output_file_id = ` + a.add(p.OutputFileID)
	}
	if p.ErrorFileID != "" {
		q += `, error_file_id = ` + a.add(p.ErrorFileID)
	}
	if len(p.Errors) > 0 {
		q += `, errors = ` + a.add(nullJSON(p.Errors))
	}
	if p.Total != nil {
		q += `, total = ` + a.add(*p.Total)
	}
	where := `id = ` + a.add(p.ID)
	if p.TenantID != "" {
		where += ` AND tenant_id = ` + a.add(p.TenantID)
	}
	q += ` WHERE ` + where + ` AND status IN (` + list(&a, from) + `) RETURNING ` + batchColumns
	b, err := scanBatch(db.rw.queryRow(ctx, q, a...))
	if err == nil {
		return b, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, false, db.d.wrap(err)
	}
	if p.TenantID != "" {
		b, err = db.BatchGetForTenant(ctx, p.TenantID, p.ID)
	} else {
		b, err = db.BatchGetByID(ctx, p.ID)
	}
	return b, false, err
}

// BatchListActiveParams select a page of unfinished batches.
type BatchListActiveParams struct {
	After string // id of the last batch of the previous page
	Limit int    // default 1000, at most 10000
}

// BatchListActive returns a page of the unfinished batches, oldest first.
func (db *DB) BatchListActive(ctx context.Context, p *BatchListActiveParams) ([]*Batch, bool, error) {
	return page(ctx, db.ro, scanBatch, batchListActiveSQL(p))
}

// batchListActiveSQL reads batches_active.
func batchListActiveSQL(p *BatchListActiveParams) pageQuery {
	return pageSQL(`SELECT `+batchColumns+` FROM batches WHERE `+activeBatchSQL, nil, p.After, false, p.Limit)
}
