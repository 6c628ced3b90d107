package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/money"
)

// BatchPartState is where a part of an offloaded batch stands.
type BatchPartState string

// The states of a part, in order. A part found in uploading or creating
// after a crash may have a file or a batch at the provider not named yet.
const (
	PartPending    BatchPartState = "pending"    // planned; waiting for room in the provider's queue or the budget
	PartUploading  BatchPartState = "uploading"  // its input file is being uploaded
	PartCreating   BatchPartState = "creating"   // uploaded (ProviderFileID); its provider batch is being created
	PartSubmitted  BatchPartState = "submitted"  // at the provider (ProviderBatchID); polled
	PartCollecting BatchPartState = "collecting" // the provider's batch ended; its results are being stored
	PartDone       BatchPartState = "done"       // every line's outcome is stored
)

// BatchPart is the lines of an offloaded batch sent as one provider batch
// to one deployment.
type BatchPart struct {
	ID, BatchID, TenantID string
	Model                 string // llmq's model of its lines
	Deployment            string // provider/upstream
	Endpoint              string
	State                 BatchPartState
	Lines, Bytes, Tokens  int64 // Tokens: estimated prompt tokens, what the batch queue limit counts

	// The part's budget reservation, for a restarted offloader.
	Reserved                   money.Micros
	BudgetDay, BudgetGlobalDay string
	BudgetGlobal               bool

	ProviderFileID, ProviderBatchID, ProviderStatus string
	// Refusals counts the provider's refusals for its queue limit.
	Refusals int
	Error    string

	NextCheckAt, CreatedAt, UpdatedAt time.Time
	SubmittedAt, EndedAt              *time.Time
}

const batchPartColumns = `id, batch_id, tenant_id, model, deployment, endpoint, state, lines, bytes, tokens,
	reserved_micros, budget_day, budget_global_day, budget_global, provider_file_id, provider_batch_id, provider_status,
	refusals, error, next_check_at, created_at, updated_at, submitted_at, ended_at`

func scanBatchPart(r row) (*BatchPart, error) {
	var p BatchPart
	err := r.Scan(&p.ID, &p.BatchID, &p.TenantID, &p.Model, &p.Deployment, &p.Endpoint, &p.State, &p.Lines, &p.Bytes, &p.Tokens,
		&p.Reserved, orZero[string]{&p.BudgetDay}, orZero[string]{&p.BudgetGlobalDay}, &p.BudgetGlobal,
		orZero[string]{&p.ProviderFileID}, orZero[string]{&p.ProviderBatchID}, orZero[string]{&p.ProviderStatus},
		&p.Refusals, orZero[string]{&p.Error}, timeCol{&p.NextCheckAt}, timeCol{&p.CreatedAt}, timeCol{&p.UpdatedAt},
		nullTimeCol{&p.SubmittedAt}, nullTimeCol{&p.EndedAt})
	return &p, err
}

// BatchPartInsert stores a new pending part with jobIDs, queued jobs of
// its batch in no part, all or nothing.
func (db *DB) BatchPartInsert(ctx context.Context, p *BatchPart, jobIDs []string) error {
	if err := required("BatchPartInsert", "BatchID", p.BatchID, "TenantID", p.TenantID, "Model", p.Model, "Deployment", p.Deployment); err != nil {
		return err
	}
	if len(jobIDs) == 0 {
		return errors.New("store: BatchPartInsert: no jobs")
	}
	if p.ID == "" {
		p.ID = ids.New(ids.BatchPart)
	}
	now := db.nowUTC()
	p.State, p.Lines, p.CreatedAt, p.UpdatedAt, p.NextCheckAt = PartPending, int64(len(jobIDs)), now, now, now
	err := db.tx(ctx, func(tx querier) error {
		if _, err := tx.exec(ctx, `INSERT INTO batch_parts (id, batch_id, tenant_id, model, deployment, endpoint, state, lines, bytes, tokens,
				reserved_micros, next_check_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $12)`,
			p.ID, p.BatchID, p.TenantID, p.Model, p.Deployment, p.Endpoint, string(p.State), p.Lines, p.Bytes, p.Tokens,
			int64(p.Reserved), db.d.ts(now)); err != nil {
			return err
		}
		for chunk := range slices.Chunk(jobIDs, 1000) {
			var a args
			part, batch := a.add(p.ID), a.add(p.BatchID)
			n, err := tx.exec(ctx, `UPDATE jobs SET batch_part_id = `+part+` WHERE batch_id = `+batch+` AND id IN (`+list(&a, chunk)+`)
				AND status = 'queued' AND batch_part_id IS NULL`, a...)
			if err != nil {
				return err
			}
			if n != int64(len(chunk)) {
				return fmt.Errorf("%w: %d of %d jobs are not queued jobs of batch %s in no part", ErrConflict, int64(len(chunk))-n, len(chunk), p.BatchID)
			}
		}
		return nil
	})
	return failed("BatchPartInsert", db.d.wrap(err))
}

// BatchPartSave writes p if the stored part is still in state from.
func (db *DB) BatchPartSave(ctx context.Context, p *BatchPart, from BatchPartState) (bool, error) {
	now := db.nowUTC()
	n, err := db.rw.exec(ctx, `UPDATE batch_parts SET state = $3, reserved_micros = $4, budget_day = $5, budget_global_day = $6,
			budget_global = $7, provider_file_id = $8, provider_batch_id = $9, provider_status = $10, refusals = $11, error = $12,
			next_check_at = $13, updated_at = $14, submitted_at = $15, ended_at = $16, lines = $17, bytes = $18, tokens = $19
		WHERE id = $1 AND state = $2`,
		p.ID, string(from), string(p.State), int64(p.Reserved), orNull(p.BudgetDay), orNull(p.BudgetGlobalDay), p.BudgetGlobal,
		orNull(p.ProviderFileID), orNull(p.ProviderBatchID), orNull(p.ProviderStatus), p.Refusals, orNull(p.Error),
		db.d.ts(normTime(p.NextCheckAt)), db.d.ts(now), db.d.tsOrNull(p.SubmittedAt), db.d.tsOrNull(p.EndedAt), p.Lines, p.Bytes, p.Tokens)
	if err != nil {
		return false, fmt.Errorf("store: BatchPartSave %s: %w", p.ID, db.d.wrap(err))
	}
	if n == 1 {
		p.UpdatedAt = now
	}
	return n == 1, nil
}

// BatchPartGet returns the part, or ErrNotFound.
func (db *DB) BatchPartGet(ctx context.Context, id string) (*BatchPart, error) {
	return getOne(ctx, db.ro, scanBatchPart, "batch part", id, `SELECT `+batchPartColumns+` FROM batch_parts WHERE id = $1`, id)
}

// BatchPartListDue returns up to limit parts not done that are due at
// now, the most overdue first.
func (db *DB) BatchPartListDue(ctx context.Context, now time.Time, limit int) ([]*BatchPart, error) {
	return collect(ctx, db.ro, scanBatchPart, `SELECT `+batchPartColumns+` FROM batch_parts
		WHERE state <> 'done' AND next_check_at <= $1 ORDER BY next_check_at LIMIT $2`, db.d.ts(now), limit)
}

// BatchPartListByBatch returns the batch's parts, oldest first.
func (db *DB) BatchPartListByBatch(ctx context.Context, batchID string) ([]*BatchPart, error) {
	return collect(ctx, db.ro, scanBatchPart, `SELECT `+batchPartColumns+` FROM batch_parts WHERE batch_id = $1 ORDER BY id`, batchID)
}

// BatchPartTokensInFlight sums the tokens of the deployment's parts at
// the provider or on their way: what they hold of its batch queue.
func (db *DB) BatchPartTokensInFlight(ctx context.Context, deployment string) (int64, error) {
	var n int64
	err := db.ro.queryRow(ctx, `SELECT CAST(COALESCE(SUM(tokens), 0) AS BIGINT) FROM batch_parts
		WHERE deployment = $1 AND state IN ('uploading', 'creating', 'submitted')`, deployment).Scan(&n)
	return n, failed("BatchPartTokensInFlight", err)
}

// JobStreamByPart calls fn with each job of the part, by id.
func (db *DB) JobStreamByPart(ctx context.Context, partID string, fn func(*Job) error) error {
	return stream(ctx, db, "JobStreamByPart", scanJob, func(last *Job) (string, args) {
		after := ""
		if last != nil {
			after = last.ID
		}
		return `SELECT ` + jobColumns + ` FROM jobs WHERE batch_part_id = $1 AND id > $2 ORDER BY id LIMIT $3`, args{partID, after, db.streamBatch}
	}, fn)
}

// JobLeavePart takes the part's pending jobs among jobIDs back to llmq's
// own path, and returns their ids.
func (db *DB) JobLeavePart(ctx context.Context, partID string, jobIDs []string) ([]string, error) {
	var out []string
	for chunk := range slices.Chunk(jobIDs, 1000) {
		var a args
		part := a.add(partID)
		q := `UPDATE jobs SET batch_part_id = NULL, updated_at = ` + a.add(db.d.ts(db.nowUTC())) + `
			WHERE batch_part_id = ` + part + ` AND id IN (` + list(&a, chunk) + `) AND ` + pendingSQL + ` RETURNING id`
		err := db.rw.query(ctx, q, a, func(r row) error {
			var id string
			err := r.Scan(&id)
			out = append(out, id)
			return err
		})
		if err != nil {
			return out, failed("JobLeavePart", db.d.wrap(err))
		}
	}
	return out, nil
}
