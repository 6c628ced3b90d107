package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/money"
)

// JobInsertParams are the fields of a new job.
type JobInsertParams struct {
	ID       string // optional; a new ids.Job id when empty
	TenantID string
	BatchID  string // optional
	LineNo   int    // with BatchID: the input line, unique within the batch, >= 0
	CustomID string
	Endpoint string
	Model    string
	Request  json.RawMessage // required, valid JSON
	Queue    string
	// Status is queued when empty; never terminal, except failed with an
	// Error (a batch line refused at validation).
	Status JobStatus
	Error  *JobError

	EstPromptTokens int64
	EstMaxTokens    int64
	EstCost         money.Micros

	WebhookURL     string
	Metadata       json.RawMessage
	IdempotencyKey string     // optional; unique per tenant (JobInsert only)
	NextRunAt      *time.Time // optional: when a waiting or deferred job is due
	Sync           bool
	Fallbacks      []string
}

// jobInsertColumns are the columns of (*JobInsertParams).values.
var jobInsertColumns = []string{"id", "tenant_id", "batch_id", "line_no", "custom_id", "endpoint", "model",
	"request", "queue", "status", "est_prompt_tokens", "est_max_tokens", "est_cost_micros",
	"webhook_url", "metadata", "idempotency_key", "created_at", "updated_at", "next_run_at",
	"error", "finished_at", "sync", "fallbacks"}

func (p *JobInsertParams) validate(method string) error {
	refused := p.Status == JobFailed && p.Error != nil
	if err := required(method, "TenantID", p.TenantID, "Endpoint", p.Endpoint, "Queue", p.Queue); err != nil {
		return err
	}
	// A refused line may name no model, or not even be JSON.
	if !refused {
		if err := required(method, "Model", p.Model); err != nil {
			return err
		}
		if len(p.Request) == 0 {
			return fmt.Errorf("store: %s: Request is empty", method)
		}
	}
	if p.Status != "" && (!p.Status.Valid() || p.Status.Terminal()) && !refused {
		return fmt.Errorf("store: %s: Status %q is not a status a new job can have", method, p.Status)
	}
	if p.Error != nil && !refused {
		return fmt.Errorf("store: %s: Error is only for a job inserted as failed", method)
	}
	if p.LineNo < 0 || (p.BatchID == "" && p.LineNo != 0) {
		return fmt.Errorf("store: %s: LineNo %d: want >= 0, and 0 without a BatchID", method, p.LineNo)
	}
	return nil
}

func (p *JobInsertParams) values(d *dialect, id string, now any) []any {
	var line any
	if p.BatchID != "" {
		line = int64(p.LineNo)
	}
	status := cmp.Or(p.Status, JobQueued)
	request := p.Request
	if len(request) == 0 {
		request = json.RawMessage("null")
	}
	var finished any
	if status.Terminal() {
		finished = now
	}
	return []any{id, p.TenantID, orNull(p.BatchID), line, orNull(p.CustomID), p.Endpoint, p.Model,
		string(withoutNUL(request)), p.Queue, string(status), p.EstPromptTokens, p.EstMaxTokens, int64(p.EstCost),
		orNull(p.WebhookURL), nullJSON(p.Metadata), orNull(p.IdempotencyKey), now, now, d.tsOrNull(p.NextRunAt),
		errorJSON(p.Error), finished, p.Sync, strings.Join(p.Fallbacks, " ")}
}

// JobInsert creates a job. With an IdempotencyKey, a second insert with the
// same (tenant, key) returns the first job and created=false. An id already
// taken is ErrConflict; an unknown tenant or batch is ErrNotFound.
func (db *DB) JobInsert(ctx context.Context, p *JobInsertParams) (job *Job, created bool, err error) {
	if err := p.validate("JobInsert"); err != nil {
		return nil, false, err
	}
	var a args
	vals := list(&a, p.values(db.d, cmp.Or(p.ID, ids.New(ids.Job)), db.d.ts(db.nowUTC())))
	// The partial unique index as conflict target: only an idempotency key is absorbed.
	j, err := db.queryJobGrouped(ctx, "insert", `
		INSERT INTO jobs (`+strings.Join(jobInsertColumns, ", ")+`) VALUES (`+vals+`)
		ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
		RETURNING `+jobColumns, a)
	if err == nil {
		return j, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, false, db.d.wrap(err)
	}
	// The key was taken by an insert both backends waited to commit.
	j, err = scanJob(db.rw.queryRow(ctx, `SELECT `+jobColumns+` FROM jobs WHERE `+whereIdempotencyKey, p.TenantID, p.IdempotencyKey))
	if err != nil {
		return nil, false, fmt.Errorf("store: JobInsert: read the job of idempotency key: %w", err)
	}
	return j, false, nil
}

// whereIdempotencyKey reads jobs_tenant_idempotency.
const whereIdempotencyKey = `tenant_id = $1 AND idempotency_key = $2 AND idempotency_key IS NOT NULL`

// JobInsertManyParams are the jobs of one bulk insert.
type JobInsertManyParams struct {
	Jobs []*JobInsertParams
}

// JobInsertMany creates many jobs at once (a batch's lines), all or nothing,
// and returns their ids, ordered as the input. A batch line already
// inserted is ErrConflict; idempotency keys are not supported.
func (db *DB) JobInsertMany(ctx context.Context, p *JobInsertManyParams) ([]string, error) {
	if len(p.Jobs) == 0 {
		return nil, nil
	}
	var fresh []string
	for i, j := range p.Jobs {
		if err := j.validate(fmt.Sprintf("JobInsertMany: Jobs[%d]", i)); err != nil {
			return nil, err
		}
		if j.IdempotencyKey != "" {
			return nil, fmt.Errorf("store: JobInsertMany: Jobs[%d]: IdempotencyKey is not supported in bulk", i)
		}
		if j.ID == "" {
			fresh = append(fresh, ids.New(ids.Job))
		}
	}
	// Sorted, so that their order is the input's.
	slices.Sort(fresh)
	out := make([]string, len(p.Jobs))
	now := db.d.ts(db.nowUTC())
	rows := make([][]any, len(p.Jobs))
	for i, j := range p.Jobs {
		out[i] = j.ID
		if out[i] == "" {
			out[i], fresh = fresh[0], fresh[1:]
		}
		rows[i] = j.values(db.d, out[i], now)
	}
	if err := db.d.insertJobs(ctx, db, rows); err != nil {
		return nil, failed("JobInsertMany", db.d.wrap(err))
	}
	return out, nil
}

// copyJobs writes rows with COPY, one statement: all or nothing.
func copyJobs(ctx context.Context, db *DB, rows [][]any) error {
	_, err := db.pool.CopyFrom(ctx, pgx.Identifier{"jobs"}, jobInsertColumns, pgx.CopyFromRows(rows))
	return db.d.outage(err)
}

// sqliteRowsPerInsert keeps a statement's parameters (one a column) well under
// SQLite's limit of 32766.
const sqliteRowsPerInsert = 500

// multiRowInsertJobs uses ? placeholders, not $N: SQLite finds a named
// parameter by a linear scan, quadratic over thousands.
func multiRowInsertJobs(ctx context.Context, db *DB, rows [][]any) error {
	row := "(" + strings.Repeat("?, ", len(jobInsertColumns)-1) + "?)"
	insert := "INSERT INTO jobs (" + strings.Join(jobInsertColumns, ", ") + ") VALUES "
	return db.tx(ctx, func(tx querier) error {
		for chunk := range slices.Chunk(rows, sqliteRowsPerInsert) {
			q := insert + strings.Repeat(row+", ", len(chunk)-1) + row
			if _, err := tx.exec(ctx, q, slices.Concat(chunk...)...); err != nil {
				return err
			}
		}
		return nil
	})
}

// transition runs a conditional UPDATE of one job, grouped with those of
// kind when set; when it matches no row it returns the job as it is.
func (db *DB) transition(ctx context.Context, kind, update string, a args, id, tenantID string) (*Job, bool, error) {
	j, err := db.queryJobGrouped(ctx, kind, update+` RETURNING `+jobColumns, a)
	if err == nil {
		return j, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, false, db.d.wrap(err)
	}
	// By the primary key alone (JobGetForTenant says why).
	j, err = getOne(ctx, db.rw, scanJob, "job", id, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, id)
	if err == nil && tenantID != "" && j.TenantID != tenantID {
		return nil, false, notFound("job", id)
	}
	return j, false, err
}

// JobStart marks an unfinished job running as worker (its lease, or "")
// picks it up. A terminal job, or one another live worker holds (a second
// delivery), is returned unchanged with started=false.
func (db *DB) JobStart(ctx context.Context, id, worker string) (job *Job, started bool, err error) {
	var a args
	now := db.nowUTC()
	q := `UPDATE jobs SET status = 'running', next_run_at = NULL, started_at = COALESCE(started_at, ` + a.add(db.d.ts(now)) +
		`), updated_at = $1, worker_id = NULLIF(` + a.add(worker) + `, '') WHERE id = ` + a.add(id) + ` AND ` + unfinishedSQL +
		` AND (worker_id IS NULL OR worker_id = $2 OR NOT ` + heldByLiveSQL + a.add(db.d.ts(now.Add(-WorkerDeadAfter))) + `))`
	return db.transition(ctx, "start", q, a, id, "")
}

// JobSetStatusParams describe a conditional status change.
type JobSetStatusParams struct {
	ID   string
	From []JobStatus // the statuses the job may be in; never terminal ones
	To   JobStatus
	// NextRunAt is written as given, nil clearing it.
	NextRunAt *time.Time
	// Error, when set, replaces the job's error.
	Error *JobError
	// CountAttempt counts a provider call that ended this way.
	CountAttempt bool
}

// JobSetStatus moves the job to p.To if its status is one of p.From, and
// reports whether it did; either way it returns the job as it now is.
func (db *DB) JobSetStatus(ctx context.Context, p *JobSetStatusParams) (job *Job, applied bool, err error) {
	from, err := unfinished("JobSetStatus", "From", p.From)
	if err != nil {
		return nil, false, err
	}
	var a args
	now := a.add(db.d.ts(db.nowUTC()))
	q := `UPDATE jobs SET status = ` + a.add(string(p.To)) + `, worker_id = NULL, updated_at = ` + now +
		`, next_run_at = ` + a.add(db.d.tsOrNull(p.NextRunAt))
	if p.CountAttempt {
		q += `, attempts = attempts + 1`
	}
	if p.Error != nil {
		q += `, error = ` + a.add(errorJSON(p.Error))
	}
	if p.To.Terminal() {
		q += `, finished_at = ` + now
	}
	q += ` WHERE id = ` + a.add(p.ID) + ` AND status IN (` + list(&a, from) + `)`
	return db.transition(ctx, "", q, a, p.ID, "")
}

// JobIncrRateLimited counts a 429 against the job and returns the new count.
func (db *DB) JobIncrRateLimited(ctx context.Context, id string) (int, error) {
	var n int
	err := db.rw.queryRow(ctx, `UPDATE jobs SET rate_limited = rate_limited + 1, updated_at = $2 WHERE id = $1 RETURNING rate_limited`,
		id, db.d.ts(db.nowUTC())).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, notFound("job", id)
	}
	return n, db.d.wrap(err)
}

// JobCompleteParams are a provider's successful answer to a job.
type JobCompleteParams struct {
	ID string
	// Day is the budget day the spend belongs to, "YYYY-MM-DD".
	Day string
	// GlobalDay is the UTC day of the global cap; defaults to Day.
	GlobalDay         string
	ResponseStatus    int // default 200
	ResponseBody      json.RawMessage
	ProviderRequestID string
	PromptTokens      int64
	CompletionTokens  int64
	CachedTokens      int64
	TotalTokens       int64 // default PromptTokens + CompletionTokens
	Cost              money.Micros
	// UsageEstimated marks usage and cost as llmq's estimate (Job.UsageEstimated).
	UsageEstimated bool
	// Deployment answered, of ServedModel when a fallback's, which the
	// ledger row then charges.
	Deployment, ServedModel string
	// Failed makes the job failed, still charged: the provider bills an
	// answer llmq cannot take.
	Failed *JobError
	// Batched marks the ledger row of a call run on the provider's Batch API.
	Batched bool
}

// JobCompleteResult says what JobComplete did.
type JobCompleteResult struct {
	// Completed: this call moved the job to succeeded.
	Completed bool
	// Charged: this call inserted the job's ledger row (a job cancelled
	// mid-call too), so this caller alone settles the budget.
	Charged bool
}

// JobComplete stores a success and charges it, atomically: the job becomes
// succeeded (or failed, with Failed) and the ledger gets the job's row
// unless it has one. A job that ended meanwhile keeps its status, error
// and response, and takes the usage and cost its ledger row charged.
func (db *DB) JobComplete(ctx context.Context, p *JobCompleteParams) (*JobCompleteResult, error) {
	a, err := db.completeArgs(p)
	if err != nil {
		return nil, err
	}
	var res *JobCompleteResult
	if db.d.groupWrites {
		res, err = db.groups.complete.Do(ctx, struct{}{}, statement{sqlJobComplete, a})
	} else {
		// SQLite has one writer: the job read is the job the UPDATE sees.
		err = db.tx(ctx, func(tx querier) error {
			var status JobStatus
			if err := tx.queryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, p.ID).Scan(&status); errors.Is(err, sql.ErrNoRows) {
				return errNoJob
			} else if err != nil {
				return err
			}
			nl, err := tx.exec(ctx, sqlJobCompleteInsert, a...)
			if err != nil {
				return err
			}
			res = &JobCompleteResult{Completed: !status.Terminal(), Charged: nl == 1}
			_, err = tx.exec(ctx, sqlJobCompleteUpdateSQLite, append(a, res.Completed, res.Charged)...)
			return err
		})
	}
	if err != nil {
		return nil, db.completeFailed(p.ID, err)
	}
	return res, nil
}

var errNoJob = fmt.Errorf("%w: job", ErrNotFound)

func (db *DB) completeFailed(id string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("store: JobComplete %s: %w", id, db.d.wrap(err))
}

func scanComplete(r row) (*JobCompleteResult, error) {
	res := &JobCompleteResult{}
	var exists bool
	err := r.Scan(&res.Completed, &res.Charged, &exists)
	if err == nil && !exists {
		err = errNoJob
	}
	return res, err
}

func (db *DB) completeArgs(p *JobCompleteParams) (args, error) {
	if err := validDay("JobComplete", p.Day); err != nil {
		return nil, err
	}
	globalDay := cmp.Or(p.GlobalDay, p.Day)
	if err := validDay("JobComplete", globalDay); err != nil {
		return nil, err
	}
	if p.Cost < 0 || p.PromptTokens < 0 || p.CompletionTokens < 0 || p.CachedTokens < 0 {
		return nil, errors.New("store: JobComplete: negative usage or cost")
	}
	status, total := cmp.Or(p.ResponseStatus, 200), cmp.Or(p.TotalTokens, p.PromptTokens+p.CompletionTokens)
	at := db.nowUTC()
	now, chargeable := db.d.ts(at), db.d.ts(at.Add(-LedgerDetailMinAge))
	state := string(JobSucceeded)
	if p.Failed != nil {
		state = string(JobFailed)
	}
	return args{p.ID, now, status, nullJSON(p.ResponseBody), orNull(p.ProviderRequestID),
		p.PromptTokens, p.CompletionTokens, p.CachedTokens, total, int64(p.Cost), p.Day, globalDay,
		state, errorJSON(p.Failed), p.UsageEstimated, p.Deployment, p.ServedModel, chargeable, p.Batched}, nil
}

// jobCompleteUpdate updates the job when it is unfinished or this call
// charged it; only an unfinished one takes status, error, response and
// finished_at.
func jobCompleteUpdate(unfinished, charged string) string {
	keep := func(col, value string) string {
		return col + ` = CASE WHEN ` + unfinished + ` THEN ` + value + ` ELSE ` + col + ` END`
	}
	return `UPDATE jobs SET ` + keep("status", "$13") + `, ` + keep("error", "$14") + `, ` + keep("finished_at", "$2") + `,
		` + keep("response_status", "$3") + `, ` + keep("response_body", "$4") + `,
		attempts = attempts + 1, next_run_at = NULL, updated_at = $2, provider_request_id = $5,
		prompt_tokens = $6, completion_tokens = $7, cached_tokens = $8, total_tokens = $9, cost_micros = $10,
		usage_estimated = $15, deployment = $16, served_model = $17, worker_id = NULL
		WHERE id = $1 AND (` + unfinished + ` OR ` + charged + `)`
}

// A job that finished before $18 (LedgerDetailMinAge ago) is not charged
// again: retention may have rolled its row up.
const sqlJobCompleteInsert = `INSERT INTO usage_ledger (job_id, tenant_id, batch_id, day, global_day, model,
		prompt_tokens, completion_tokens, cached_tokens, cost_micros, created_at, deployment, batched)
		SELECT id, tenant_id, batch_id, $11, $12, COALESCE(NULLIF($17, ''), model), $6, $7, $8, $10, $2, $16, $19 FROM jobs
		WHERE id = $1 AND (finished_at IS NULL OR finished_at >= $18)
		ON CONFLICT (job_id) DO NOTHING`

var (
	// sqlJobComplete is it all in one statement: whether it completed the
	// job, charged it, and whether the job exists. cur locks the job (FOR
	// UPDATE), so the UPDATE and the answer agree on what the job was.
	sqlJobComplete = `WITH cur AS (SELECT ` + unfinishedSQL + ` AS unfinished FROM jobs WHERE id = $1 FOR UPDATE),
		l AS (` + sqlJobCompleteInsert + ` RETURNING 1),
		u AS (` + sqlJobCompleteUpdatePostgres + `)
		SELECT COALESCE((SELECT unfinished FROM cur), false), EXISTS (SELECT 1 FROM l), EXISTS (SELECT 1 FROM cur)`
	sqlJobCompleteUpdatePostgres = jobCompleteUpdate(`(SELECT unfinished FROM cur)`, `EXISTS (SELECT 1 FROM l)`)
	// SQLite's: $20 says the job is unfinished, $21 that the INSERT charged it.
	sqlJobCompleteUpdateSQLite = jobCompleteUpdate(`$20`, `$21`)
)

// JobCompleteManyParams are the successes JobCompleteMany stores together.
type JobCompleteManyParams struct {
	Jobs []*JobCompleteParams
}

// JobCompleteMany is JobComplete for many jobs in one transaction on
// Postgres; when it fails, each job is completed on its own.
func (db *DB) JobCompleteMany(ctx context.Context, p *JobCompleteManyParams) (results []*JobCompleteResult, errs []error) {
	results, errs = make([]*JobCompleteResult, len(p.Jobs)), make([]error, len(p.Jobs))
	var sts []statement
	var grouped []int
	for i, jp := range p.Jobs {
		if !db.d.groupWrites {
			results[i], errs[i] = db.JobComplete(ctx, jp)
			continue
		}
		a, err := db.completeArgs(jp)
		if err != nil {
			errs[i] = err
			continue
		}
		sts, grouped = append(sts, statement{sqlJobComplete, a}), append(grouped, i)
	}
	rs, es := runGroup(ctx, db, sts, scanComplete, true)
	for k, i := range grouped {
		results[i], errs[i] = rs[k], db.completeFailed(p.Jobs[i].ID, es[k])
	}
	return results, errs
}

// JobFailParams are why a job failed for good.
type JobFailParams struct {
	ID    string
	Error JobError
	// The provider's answer, when there was one.
	ResponseStatus int
	ResponseBody   json.RawMessage
	CountAttempt   bool
}

// JobFail marks the job failed unless it is terminal, as JobSetStatus.
func (db *DB) JobFail(ctx context.Context, p *JobFailParams) (job *Job, applied bool, err error) {
	if err := required("JobFail", "ID", p.ID, "Error.Message", p.Error.Message); err != nil {
		return nil, false, err
	}
	var a args
	now := a.add(db.d.ts(db.nowUTC()))
	q := `UPDATE jobs SET status = 'failed', worker_id = NULL, next_run_at = NULL, finished_at = ` + now + `, updated_at = ` + now +
		`, error = ` + a.add(errorJSON(&p.Error)) +
		`, response_status = ` + a.add(orNull(int64(p.ResponseStatus))) +
		`, response_body = ` + a.add(nullJSON(p.ResponseBody))
	if p.CountAttempt {
		q += `, attempts = attempts + 1`
	}
	q += ` WHERE id = ` + a.add(p.ID) + ` AND ` + unfinishedSQL
	return db.transition(ctx, "", q, a, p.ID, "")
}

// JobCancel cancels the tenant's job, running too, unless it is terminal.
func (db *DB) JobCancel(ctx context.Context, tenantID, id string) (job *Job, changed bool, err error) {
	if err := required("JobCancel", "tenantID", tenantID, "id", id); err != nil {
		return nil, false, err
	}
	q := `UPDATE jobs SET status = 'cancelled', next_run_at = NULL, finished_at = $3, updated_at = $3
		WHERE id = $1 AND tenant_id = $2 AND ` + unfinishedSQL
	return db.transition(ctx, "", q, args{id, tenantID, db.d.ts(db.nowUTC())}, id, tenantID)
}

// JobCancelByBatch cancels the batch's pending jobs not at the provider's
// Batch API, and returns how many.
func (db *DB) JobCancelByBatch(ctx context.Context, batchID string) (int64, error) {
	n, err := db.rw.exec(ctx, sqlJobCancelByBatch, batchID, db.d.ts(db.nowUTC()))
	return n, db.d.wrap(err)
}

// sqlJobCancelByBatch reads jobs_batch_status.
const sqlJobCancelByBatch = `UPDATE jobs SET status = 'cancelled', next_run_at = NULL, finished_at = $2, updated_at = $2
	WHERE batch_id = $1 AND batch_part_id IS NULL AND ` + pendingSQL
