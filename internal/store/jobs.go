package store

import (
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

// JobStatus is where a job is in its life. Terminal statuses are final: no
// method moves a job out of one.
type JobStatus string

// Job statuses.
const (
	JobQueued    JobStatus = "queued"    // in a queue, waiting for a worker
	JobRunning   JobStatus = "running"   // a worker has it
	JobWaiting   JobStatus = "waiting"   // backing off (rate limit, retry) until NextRunAt
	JobDeferred  JobStatus = "deferred"  // over budget until NextRunAt (the budget reset)
	JobSucceeded JobStatus = "succeeded" // terminal
	JobFailed    JobStatus = "failed"    // terminal
	JobCancelled JobStatus = "cancelled" // terminal
)

// Terminal reports whether s is final.
func (s JobStatus) Terminal() bool {
	return s == JobSucceeded || s == JobFailed || s == JobCancelled
}

// Valid reports whether s is a known status.
func (s JobStatus) Valid() bool {
	switch s {
	case JobQueued, JobRunning, JobWaiting, JobDeferred, JobSucceeded, JobFailed, JobCancelled:
		return true
	}
	return false
}

// The literal predicates of the partial indexes and of "not yet terminal".
// Queries repeat them verbatim (constants, not values) so that both planners
// can prove the partial index applies.
const (
	unfinishedSQL = `status IN ('queued', 'running', 'waiting', 'deferred')`
	pendingSQL    = `status IN ('queued', 'waiting', 'deferred')`
)

// JobError is a job's error in OpenAI's shape. It marshals an empty Code or
// Param as null, as OpenAI does, and reads null back as "".
type JobError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
	Param   string `json:"param"`
}

// MarshalJSON writes {"message","type","code","param"} with null for an empty code or param.
func (e JobError) MarshalJSON() ([]byte, error) {
	orNull := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	return json.Marshal(struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
		Param   *string `json:"param"`
	}{e.Message, e.Type, orNull(e.Code), orNull(e.Param)})
}

// Job is one LLM request and everything that happened to it.
type Job struct {
	ID       string
	TenantID string
	BatchID  string // "" when the job is not part of a batch
	LineNo   int    // the line of the batch input file; 0 outside a batch
	CustomID string
	Endpoint string          // "/v1/chat/completions" or "/v1/embeddings"
	Model    string          // as the client named it
	Request  json.RawMessage // the client's body
	Queue    string
	Status   JobStatus

	Attempts    int // provider calls made (counted when their outcome is recorded)
	RateLimited int // 429s seen; not failures, but capped

	EstPromptTokens int64
	EstMaxTokens    int64
	EstCost         money.Micros

	ResponseStatus    int             // the provider's HTTP status; 0 before any response
	ResponseBody      json.RawMessage // the provider's body
	ProviderRequestID string
	Error             *JobError

	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64
	TotalTokens      int64
	Cost             money.Micros

	WebhookURL     string
	Metadata       json.RawMessage
	IdempotencyKey string

	CreatedAt  time.Time
	StartedAt  *time.Time // first start
	FinishedAt *time.Time // when it became terminal
	UpdatedAt  time.Time
	NextRunAt  *time.Time // when a waiting or deferred job is due

	// Sync is a request answered on its connection (POST
	// /v1/chat/completions, /v1/embeddings): it never has an asynq task.
	Sync bool
}

const jobColumns = `id, tenant_id, batch_id, line_no, custom_id, endpoint, model, request, queue, status,
	attempts, rate_limited, est_prompt_tokens, est_max_tokens, est_cost_micros,
	response_status, response_body, provider_request_id, error,
	prompt_tokens, completion_tokens, cached_tokens, total_tokens, cost_micros,
	webhook_url, metadata, idempotency_key, created_at, started_at, finished_at, updated_at, next_run_at, sync`

func scanJob(r rowScanner) (*Job, error) {
	var (
		j                                    Job
		batchID, customID, providerRequestID sql.NullString
		webhookURL, idempotencyKey           sql.NullString
		lineNo, responseStatus               sql.NullInt64
		errJSON                              json.RawMessage
	)
	err := r.Scan(&j.ID, &j.TenantID, &batchID, &lineNo, &customID, &j.Endpoint, &j.Model, jsonCol{&j.Request}, &j.Queue, &j.Status,
		&j.Attempts, &j.RateLimited, &j.EstPromptTokens, &j.EstMaxTokens, &j.EstCost,
		&responseStatus, jsonCol{&j.ResponseBody}, &providerRequestID, jsonCol{&errJSON},
		&j.PromptTokens, &j.CompletionTokens, &j.CachedTokens, &j.TotalTokens, &j.Cost,
		&webhookURL, jsonCol{&j.Metadata}, &idempotencyKey,
		timeCol{&j.CreatedAt}, nullTimeCol{&j.StartedAt}, nullTimeCol{&j.FinishedAt}, timeCol{&j.UpdatedAt}, nullTimeCol{&j.NextRunAt}, &j.Sync)
	if err != nil {
		return nil, err
	}
	j.BatchID, j.CustomID, j.ProviderRequestID = batchID.String, customID.String, providerRequestID.String
	j.WebhookURL, j.IdempotencyKey = webhookURL.String, idempotencyKey.String
	j.LineNo, j.ResponseStatus = int(lineNo.Int64), int(responseStatus.Int64)
	if errJSON != nil {
		j.Error = new(JobError)
		if err := json.Unmarshal(errJSON, j.Error); err != nil {
			return nil, fmt.Errorf("store: job %s: error column: %w", j.ID, err)
		}
	}
	return &j, nil
}

// errorJSON encodes e for the error column (NULL for nil).
func errorJSON(e *JobError) any {
	if e == nil {
		return nil
	}
	b, _ := json.Marshal(e) // four strings: cannot fail
	return string(withoutNUL(b))
}

// getJob reads one job matching where (a fixed fragment with $1...).
func getJob(ctx context.Context, q querier, where string, a ...any) (*Job, error) {
	return scanJob(q.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE `+where, a...))
}

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
	// Status is queued when empty. It is never terminal, except failed
	// with an Error: a batch line refused at validation, stored finished so
	// that a batch's counts, error file and line order all come from its jobs.
	Status JobStatus
	// Error is why a job inserted as failed was refused; only with Status failed.
	Error *JobError

	EstPromptTokens int64
	EstMaxTokens    int64
	EstCost         money.Micros

	WebhookURL     string
	Metadata       json.RawMessage
	IdempotencyKey string     // optional; unique per tenant (JobInsert only)
	NextRunAt      *time.Time // optional: when a waiting or deferred job is due
	// Sync marks a request answered on its connection; it gets no task.
	Sync bool
}

// jobInsertColumns are the columns JobInsert and JobInsertMany write, in the
// order of (*JobInsertParams).values.
var jobInsertColumns = []string{"id", "tenant_id", "batch_id", "line_no", "custom_id", "endpoint", "model",
	"request", "queue", "status", "est_prompt_tokens", "est_max_tokens", "est_cost_micros",
	"webhook_url", "metadata", "idempotency_key", "created_at", "updated_at", "next_run_at",
	"error", "finished_at", "sync"}

func (p *JobInsertParams) validate(method string) error {
	refused := p.Status == JobFailed && p.Error != nil
	err := errors.Join(required(method, "TenantID", p.TenantID), required(method, "Endpoint", p.Endpoint),
		required(method, "Queue", p.Queue))
	if err != nil {
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

// values are the column values of jobInsertColumns.
func (p *JobInsertParams) values(d *dialect, id string, now any) []any {
	var line any
	if p.BatchID != "" {
		line = int64(p.LineNo)
	}
	status := p.Status
	if status == "" {
		status = JobQueued
	}
	request := p.Request
	if len(request) == 0 {
		request = json.RawMessage("null")
	}
	var finished any
	if status.Terminal() {
		finished = now
	}
	return []any{id, p.TenantID, nullString(p.BatchID), line, nullString(p.CustomID), p.Endpoint, p.Model,
		string(withoutNUL(request)), p.Queue, string(status), p.EstPromptTokens, p.EstMaxTokens, int64(p.EstCost),
		nullString(p.WebhookURL), nullJSON(p.Metadata), nullString(p.IdempotencyKey), now, now, d.tsOrNull(p.NextRunAt),
		errorJSON(p.Error), finished, p.Sync}
}

// JobInsert creates a job. With an IdempotencyKey, a second insert with the
// same (tenant, key) returns the first job and created=false: never an error,
// never a duplicate. An id already taken is ErrConflict; an unknown tenant or
// batch is ErrNotFound.
func (db *DB) JobInsert(ctx context.Context, p *JobInsertParams) (job *Job, created bool, err error) {
	if err := p.validate("JobInsert"); err != nil {
		return nil, false, err
	}
	id := p.ID
	if id == "" {
		id = ids.New(ids.Job)
	}
	var a args
	vals := a.list(p.values(db.d, id, db.d.ts(db.nowUTC()))...)
	// The conflict target names the partial unique index, so only an
	// idempotency key is absorbed; any other conflict is an error.
	j, err := db.queryJob(ctx, db.rw, `
		INSERT INTO jobs (`+strings.Join(jobInsertColumns, ", ")+`) VALUES (`+vals+`)
		ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
		RETURNING `+jobColumns, a...)
	if err == nil {
		return j, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, false, db.d.wrap(err)
	}
	// The key was taken (the conflicting insert has committed: both
	// backends wait for it before reporting the conflict).
	j, err = getJob(ctx, db.rw, whereIdempotencyKey, p.TenantID, p.IdempotencyKey)
	if err != nil {
		return nil, false, fmt.Errorf("store: JobInsert: read the job of idempotency key: %w", err)
	}
	return j, false, nil
}

// whereIdempotencyKey finds a job by key, through jobs_tenant_idempotency.
const whereIdempotencyKey = `tenant_id = $1 AND idempotency_key = $2 AND idempotency_key IS NOT NULL`

// JobInsertManyParams are the jobs of one bulk insert.
type JobInsertManyParams struct {
	Jobs []*JobInsertParams
}

// JobInsertMany creates many jobs at once (a batch's lines): COPY on
// Postgres, multi-row INSERTs in one transaction on SQLite. All or nothing.
// It returns the ids in the order of p.Jobs. Ids it makes are handed out in
// ascending order, so within one call id order is input order. Idempotency
// keys are not supported here; a batch line already inserted (same BatchID
// and LineNo) is ErrConflict, so a retried insert never duplicates.
func (db *DB) JobInsertMany(ctx context.Context, p *JobInsertManyParams) ([]string, error) {
	if len(p.Jobs) == 0 {
		return nil, nil
	}
	missing := 0
	for i, j := range p.Jobs {
		if err := j.validate(fmt.Sprintf("JobInsertMany: Jobs[%d]", i)); err != nil {
			return nil, err
		}
		if j.IdempotencyKey != "" {
			return nil, fmt.Errorf("store: JobInsertMany: Jobs[%d]: IdempotencyKey is not supported in bulk", i)
		}
		if j.ID == "" {
			missing++
		}
	}
	fresh := make([]string, missing)
	for i := range fresh {
		fresh[i] = ids.New(ids.Job)
	}
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
		return nil, fmt.Errorf("store: JobInsertMany: %w", db.d.wrap(err))
	}
	return out, nil
}

// JobGetByID returns the job, or ErrNotFound.
func (db *DB) JobGetByID(ctx context.Context, id string) (*Job, error) {
	j, err := db.queryJob(ctx, db.ro, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("job", id)
	}
	return j, err
}

// JobGetForTenant returns the tenant's job; another tenant's is ErrNotFound.
func (db *DB) JobGetForTenant(ctx context.Context, tenantID, id string) (*Job, error) {
	j, err := db.queryJob(ctx, db.ro, `SELECT `+jobColumns+` FROM jobs WHERE id = $1 AND tenant_id = $2`, id, tenantID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("job", id)
	}
	return j, err
}

// JobListParams select a page of a tenant's jobs.
type JobListParams struct {
	TenantID string
	Status   JobStatus // optional
	BatchID  string    // optional
	After    string    // id of the last job of the previous page; "" for the first page
	Limit    int       // default 20, at most 1000
}

// JobList returns a page of the tenant's jobs, newest first (OpenAI's list
// order), and whether older ones remain.
func (db *DB) JobList(ctx context.Context, p *JobListParams) ([]*Job, bool, error) {
	if err := required("JobList", "TenantID", p.TenantID); err != nil {
		return nil, false, err
	}
	if p.Status != "" && !p.Status.Valid() {
		return nil, false, fmt.Errorf("store: JobList: Status %q is not a job status", p.Status)
	}
	limit := pageLimit(p.Limit, defaultListLimit, maxListLimit)
	q, a := jobListSQL(p, limit)
	rows, err := db.ro.QueryContext(ctx, q, a...)
	if err != nil {
		return nil, false, err
	}
	js, err := collect(rows, scanJob)
	if err != nil {
		return nil, false, err
	}
	js, more := trimPage(js, limit)
	return js, more, nil
}

// jobListSQL reads jobs_tenant, jobs_tenant_status, jobs_batch or jobs_batch_status.
func jobListSQL(p *JobListParams, limit int) (string, args) {
	var a args
	q := `SELECT ` + jobColumns + ` FROM jobs WHERE tenant_id = ` + a.add(p.TenantID)
	if p.Status != "" {
		q += ` AND status = ` + a.add(string(p.Status))
	}
	if p.BatchID != "" {
		q += ` AND batch_id = ` + a.add(p.BatchID)
	}
	if p.After != "" {
		q += ` AND id < ` + a.add(p.After)
	}
	return q + ` ORDER BY id DESC LIMIT ` + a.add(limit+1), a
}

// transition runs a conditional UPDATE ... RETURNING on one job. When it
// matches no row it returns the job as it is, with applied=false, or
// ErrNotFound when there is no such job (for the tenant, when tenantID is set).
func (db *DB) transition(ctx context.Context, q querier, update string, a args, id, tenantID string) (*Job, bool, error) {
	j, err := db.queryJob(ctx, q, update+` RETURNING `+jobColumns, a...)
	if err == nil {
		return j, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, false, db.d.wrap(err)
	}
	if tenantID != "" {
		j, err = getJob(ctx, q, `id = $1 AND tenant_id = $2`, id, tenantID)
	} else {
		j, err = getJob(ctx, q, `id = $1`, id)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, notFound("job", id)
	}
	return j, false, err
}

// JobStart marks a job running as a worker picks it up: from queued,
// waiting, deferred or running (a redelivery after a crash), stamping
// started_at the first time, and returns it (the worker's one read of the
// job). A terminal job is returned unchanged with started=false: the
// worker acknowledges the task and does nothing else.
func (db *DB) JobStart(ctx context.Context, id string) (job *Job, started bool, err error) {
	var a args
	q := `UPDATE jobs SET status = 'running', next_run_at = NULL, started_at = COALESCE(started_at, ` + a.add(db.d.ts(db.nowUTC())) +
		`), updated_at = $1 WHERE id = ` + a.add(id) + ` AND ` + unfinishedSQL
	return db.transition(ctx, db.rw, q, a, id, "")
}

// JobSetStatusParams describe a conditional status change.
type JobSetStatusParams struct {
	ID   string
	From []JobStatus // the statuses the job may be in; never terminal ones
	To   JobStatus
	// NextRunAt is written as given: when a waiting or deferred job is due,
	// nil to clear it.
	NextRunAt *time.Time
	// Error, when set, replaces the job's error; nil leaves it.
	Error *JobError
	// CountAttempt counts a provider call that ended this way (a 429 or a
	// fault, before the job is retried).
	CountAttempt bool
}

// JobSetStatus moves the job to p.To if its status is one of p.From, and
// reports whether it did; either way it returns the job as it now is. A move
// to a terminal status stamps finished_at. Terminal statuses cannot be in
// From, so a finished job is never overwritten.
func (db *DB) JobSetStatus(ctx context.Context, p *JobSetStatusParams) (job *Job, applied bool, err error) {
	if err := required("JobSetStatus", "ID", p.ID); err != nil {
		return nil, false, err
	}
	if !p.To.Valid() {
		return nil, false, fmt.Errorf("store: JobSetStatus: To %q is not a job status", p.To)
	}
	if len(p.From) == 0 {
		return nil, false, errors.New("store: JobSetStatus: From is empty")
	}
	from := make([]any, len(p.From))
	for i, s := range p.From {
		if !s.Valid() || s.Terminal() {
			return nil, false, fmt.Errorf("store: JobSetStatus: From[%d] %q: only unfinished statuses can change", i, s)
		}
		from[i] = string(s)
	}
	var a args
	now := a.add(db.d.ts(db.nowUTC()))
	q := `UPDATE jobs SET status = ` + a.add(string(p.To)) + `, updated_at = ` + now +
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
	q += ` WHERE id = ` + a.add(p.ID) + ` AND status IN (` + a.list(from...) + `)`
	return db.transition(ctx, db.rw, q, a, p.ID, "")
}

// JobIncrRateLimited counts a 429 against the job and returns the new count.
// asynq does not count these as failures, so this counter is what caps them.
func (db *DB) JobIncrRateLimited(ctx context.Context, id string) (int, error) {
	return db.incr(ctx, "rate_limited", id)
}

// incr adds one to a counter column (a constant of this file, not a value).
func (db *DB) incr(ctx context.Context, col, id string) (int, error) {
	var n int
	err := db.rw.QueryRowContext(ctx, `UPDATE jobs SET `+col+` = `+col+` + 1, updated_at = $2 WHERE id = $1 RETURNING `+col,
		id, db.d.ts(db.nowUTC())).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, notFound("job", id)
	}
	return n, db.d.wrap(err)
}

// JobCompleteParams are a provider's successful answer to a job.
type JobCompleteParams struct {
	ID string
	// Day is the budget day the spend belongs to, "YYYY-MM-DD", as the
	// budget package reckons it (from Redis time, in the reset's zone).
	Day string
	// GlobalDay is the UTC day the spend counts toward the global cap;
	// defaults to Day (a tier on UTC).
	GlobalDay         string
	ResponseStatus    int // default 200
	ResponseBody      json.RawMessage
	ProviderRequestID string
	PromptTokens      int64
	CompletionTokens  int64
	CachedTokens      int64
	TotalTokens       int64 // default PromptTokens + CompletionTokens
	Cost              money.Micros
}

// JobCompleteResult says what JobComplete did.
type JobCompleteResult struct {
	// Completed: this call moved the job to succeeded. False when the job
	// was already terminal (a duplicate delivery, or cancelled mid-call);
	// the terminal state is kept.
	Completed bool
	// Charged: this call inserted the job's ledger row, so this caller, and
	// only this one, settles the budget. The row is written even when the
	// job was cancelled mid-call: the provider charged for the call.
	Charged bool
}

// JobComplete stores a success and charges it, atomically: the job becomes
// succeeded with its response, usage and cost, and its attempt is counted
// (unless it is already terminal), and the ledger gets the job's row unless
// it has one. However many times and however concurrently a job completes,
// exactly one call reports Charged. It is on every job's path, so on
// Postgres it is one statement (one round trip, one commit).
func (db *DB) JobComplete(ctx context.Context, p *JobCompleteParams) (*JobCompleteResult, error) {
	a, err := db.completeArgs(p)
	if err != nil {
		return nil, err
	}
	res := &JobCompleteResult{}
	if db.d.dataModifyingCTE {
		var completed, charged, exists int
		err = db.rw.QueryRowContext(ctx, sqlJobComplete, a...).Scan(&completed, &charged, &exists)
		if err == nil && exists == 0 {
			err = notFound("job", p.ID)
		}
		res.Completed, res.Charged = completed == 1, charged == 1
	} else {
		err = db.tx(ctx, func(tx *sql.Tx) error {
			u, err := tx.ExecContext(ctx, sqlJobCompleteUpdate, a...)
			if err != nil {
				return db.d.wrap(err)
			}
			l, err := tx.ExecContext(ctx, sqlJobCompleteInsert, a...)
			if err != nil {
				return db.d.wrap(err)
			}
			nu, _ := u.RowsAffected()
			nl, _ := l.RowsAffected()
			if nu == 0 && nl == 0 {
				if _, err := getJob(ctx, tx, `id = $1`, p.ID); errors.Is(err, sql.ErrNoRows) {
					return notFound("job", p.ID)
				}
			}
			res.Completed, res.Charged = nu == 1, nl == 1
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("store: JobComplete %s: %w", p.ID, db.d.wrap(err))
	}
	return res, nil
}

// completeArgs checks p and returns the arguments of the JobComplete
// statements.
func (db *DB) completeArgs(p *JobCompleteParams) (args, error) {
	if err := required("JobComplete", "ID", p.ID); err != nil {
		return nil, err
	}
	if err := validDay("JobComplete", p.Day); err != nil {
		return nil, err
	}
	globalDay := p.GlobalDay
	if globalDay == "" {
		globalDay = p.Day
	}
	if err := validDay("JobComplete", globalDay); err != nil {
		return nil, err
	}
	if p.Cost < 0 || p.PromptTokens < 0 || p.CompletionTokens < 0 || p.CachedTokens < 0 {
		return nil, errors.New("store: JobComplete: negative usage or cost")
	}
	status, total := p.ResponseStatus, p.TotalTokens
	if status == 0 {
		status = 200
	}
	if total == 0 {
		total = p.PromptTokens + p.CompletionTokens
	}
	now := db.d.ts(db.nowUTC())
	return args{p.ID, now, status, nullJSON(p.ResponseBody), nullString(p.ProviderRequestID),
		p.PromptTokens, p.CompletionTokens, p.CachedTokens, total, int64(p.Cost), p.Day, globalDay}, nil
}

const (
	sqlJobCompleteUpdate = `UPDATE jobs SET status = 'succeeded', attempts = attempts + 1, error = NULL, next_run_at = NULL,
		finished_at = $2, updated_at = $2, response_status = $3, response_body = $4, provider_request_id = $5,
		prompt_tokens = $6, completion_tokens = $7, cached_tokens = $8, total_tokens = $9, cost_micros = $10
		WHERE id = $1 AND ` + unfinishedSQL
	// The ledger row copies the job's tenant, batch and model; on Postgres
	// the SELECT sees the row as it was before the UPDATE beside it, which
	// is the same for those columns.
	sqlJobCompleteInsert = `INSERT INTO usage_ledger (job_id, tenant_id, batch_id, day, global_day, model,
		prompt_tokens, completion_tokens, cached_tokens, cost_micros, created_at)
		SELECT id, tenant_id, batch_id, $11, $12, model, $6, $7, $8, $10, $2 FROM jobs WHERE id = $1
		ON CONFLICT (job_id) DO NOTHING`
	// sqlJobComplete is both in one statement (Postgres): whether it
	// completed the job, charged it, and whether the job exists.
	sqlJobComplete = `WITH u AS (` + sqlJobCompleteUpdate + ` RETURNING 1), l AS (` + sqlJobCompleteInsert + ` RETURNING 1)
		SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM l), (SELECT count(*) FROM jobs WHERE id = $1)`
)

// JobCompleteManyParams are the successes JobCompleteMany stores together.
type JobCompleteManyParams struct {
	Jobs []*JobCompleteParams
}

// JobCompleteMany is JobComplete for many jobs in one transaction, so that
// the results of jobs finishing together share one commit. Each job's
// outcome is its own: results[i] and errs[i] are what JobComplete of
// p.Jobs[i] would have returned. When the transaction as a whole fails (one
// job's value refused aborts it), every job is completed on its own
// instead. On Postgres the transaction is one round trip (a pgx batch).
func (db *DB) JobCompleteMany(ctx context.Context, p *JobCompleteManyParams) (results []*JobCompleteResult, errs []error) {
	n := len(p.Jobs)
	results, errs = make([]*JobCompleteResult, n), make([]error, n)
	if n == 1 || !db.d.dataModifyingCTE {
		for i, jp := range p.Jobs {
			results[i], errs[i] = db.JobComplete(ctx, jp)
		}
		return results, errs
	}
	all := make([]args, 0, n)
	idx := make([]int, 0, n)
	for i, jp := range p.Jobs {
		a, err := db.completeArgs(jp)
		if err != nil {
			errs[i] = err
			continue
		}
		all, idx = append(all, a), append(idx, i)
	}
	counts := make([][3]int, len(all))
	err := db.withPgx(ctx, func(c *pgx.Conn) error {
		b := &pgx.Batch{}
		for _, a := range all {
			b.Queue(sqlJobComplete, a...)
		}
		// A batch without transaction statements runs as one implicit
		// transaction: one commit for all.
		br := c.SendBatch(ctx, b)
		for k := range all {
			if err := br.QueryRow().Scan(&counts[k][0], &counts[k][1], &counts[k][2]); err != nil {
				_ = br.Close()
				return err
			}
		}
		return br.Close()
	})
	if err != nil {
		for _, i := range idx {
			results[i], errs[i] = db.JobComplete(ctx, p.Jobs[i])
		}
		return results, errs
	}
	for k, i := range idx {
		if counts[k][2] == 0 {
			errs[i] = fmt.Errorf("store: JobComplete %s: %w", p.Jobs[i].ID, notFound("job", p.Jobs[i].ID))
			continue
		}
		results[i] = &JobCompleteResult{Completed: counts[k][0] == 1, Charged: counts[k][1] == 1}
	}
	return results, errs
}

// JobFailParams are why a job failed for good.
type JobFailParams struct {
	ID    string
	Error JobError
	// The provider's answer, when there was one (a 4xx that can never succeed).
	ResponseStatus int
	ResponseBody   json.RawMessage
	// CountAttempt counts the provider call that ended in this failure.
	CountAttempt bool
}

// JobFail marks the job failed unless it is already terminal, and reports
// whether it did; either way it returns the job as it now is.
func (db *DB) JobFail(ctx context.Context, p *JobFailParams) (job *Job, applied bool, err error) {
	if err := errors.Join(required("JobFail", "ID", p.ID), required("JobFail", "Error.Message", p.Error.Message)); err != nil {
		return nil, false, err
	}
	var a args
	now := a.add(db.d.ts(db.nowUTC()))
	q := `UPDATE jobs SET status = 'failed', next_run_at = NULL, finished_at = ` + now + `, updated_at = ` + now +
		`, error = ` + a.add(errorJSON(&p.Error)) +
		`, response_status = ` + a.add(nullInt(int64(p.ResponseStatus))) +
		`, response_body = ` + a.add(nullJSON(p.ResponseBody))
	if p.CountAttempt {
		q += `, attempts = attempts + 1`
	}
	q += ` WHERE id = ` + a.add(p.ID) + ` AND ` + unfinishedSQL
	return db.transition(ctx, db.rw, q, a, p.ID, "")
}

// JobCancel cancels the tenant's job unless it is already terminal, and
// reports whether it did. A running job is cancelled too: its worker's
// result is then not stored (but its spend is, see JobCompleteResult).
// Another tenant's job is ErrNotFound.
func (db *DB) JobCancel(ctx context.Context, tenantID, id string) (job *Job, changed bool, err error) {
	if err := errors.Join(required("JobCancel", "tenantID", tenantID), required("JobCancel", "id", id)); err != nil {
		return nil, false, err
	}
	q := `UPDATE jobs SET status = 'cancelled', next_run_at = NULL, finished_at = $3, updated_at = $3
		WHERE id = $1 AND tenant_id = $2 AND ` + unfinishedSQL
	return db.transition(ctx, db.rw, q, args{id, tenantID, db.d.ts(db.nowUTC())}, id, tenantID)
}

// JobCancelByBatch cancels every pending (queued, waiting, deferred) job of
// the batch and returns how many; running jobs are left to finish.
func (db *DB) JobCancelByBatch(ctx context.Context, batchID string) (int64, error) {
	if err := required("JobCancelByBatch", "batchID", batchID); err != nil {
		return 0, err
	}
	r, err := db.rw.ExecContext(ctx, sqlJobCancelByBatch, batchID, db.d.ts(db.nowUTC()))
	if err != nil {
		return 0, db.d.wrap(err)
	}
	return r.RowsAffected()
}

// sqlJobCancelByBatch reads jobs_batch_status.
const sqlJobCancelByBatch = `UPDATE jobs SET status = 'cancelled', next_run_at = NULL, finished_at = $2, updated_at = $2
	WHERE batch_id = $1 AND ` + pendingSQL

// JobListUnfinishedParams select a page of unfinished jobs.
type JobListUnfinishedParams struct {
	// Statuses narrows the scan to some of queued, running, waiting,
	// deferred. Defaults to all four.
	Statuses []JobStatus
	// UpdatedBefore, when set, skips jobs touched since (in flight right now).
	UpdatedBefore time.Time
	// SkipValidating skips the jobs of batches still validating: their
	// validation enqueues them once the whole file is checked.
	SkipValidating bool
	After          string // id of the last job of the previous page
	Limit          int    // default 1000, at most 10000
}

// JobListUnfinished returns a page of unfinished jobs in ascending id order
// (oldest first, the order a reconciler wants), and whether more remain. It
// reads a partial index holding only unfinished jobs.
func (db *DB) JobListUnfinished(ctx context.Context, p *JobListUnfinishedParams) ([]*Job, bool, error) {
	limit := pageLimit(p.Limit, 1000, 10000)
	q, a, err := jobListUnfinishedSQL(db.d, p, limit)
	if err != nil {
		return nil, false, err
	}
	rows, err := db.ro.QueryContext(ctx, q, a...)
	if err != nil {
		return nil, false, err
	}
	js, err := collect(rows, scanJob)
	if err != nil {
		return nil, false, err
	}
	js, more := trimPage(js, limit)
	return js, more, nil
}

// jobListUnfinishedSQL reads jobs_unfinished.
func jobListUnfinishedSQL(d *dialect, p *JobListUnfinishedParams, limit int) (string, args, error) {
	var a args
	q := `SELECT ` + jobColumns + ` FROM jobs WHERE ` + unfinishedSQL
	if len(p.Statuses) > 0 {
		st := make([]any, len(p.Statuses))
		for i, s := range p.Statuses {
			if !s.Valid() || s.Terminal() {
				return "", nil, fmt.Errorf("store: JobListUnfinished: Statuses[%d] %q is not an unfinished status", i, s)
			}
			st[i] = string(s)
		}
		q += ` AND status IN (` + a.list(st...) + `)`
	}
	if !p.UpdatedBefore.IsZero() {
		q += ` AND updated_at < ` + a.add(d.ts(p.UpdatedBefore))
	}
	if p.SkipValidating {
		q += ` AND (batch_id IS NULL OR NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = jobs.batch_id AND b.status = 'validating'))`
	}
	if p.After != "" {
		q += ` AND id > ` + a.add(p.After)
	}
	return q + ` ORDER BY id LIMIT ` + a.add(limit+1), a, nil
}

// JobStreamByBatch calls fn with each job of the batch whose status is one
// of statuses (all when empty), in line order. It reads a few hundred jobs
// per query and holds no connection while fn runs, so a 50,000-line batch is
// never in memory at once and fn may use the store. fn's error stops the
// stream and is returned.
func (db *DB) JobStreamByBatch(ctx context.Context, batchID string, statuses []JobStatus, fn func(*Job) error) error {
	if err := required("JobStreamByBatch", "batchID", batchID); err != nil {
		return err
	}
	st := make([]any, len(statuses))
	for i, s := range statuses {
		if !s.Valid() {
			return fmt.Errorf("store: JobStreamByBatch: statuses[%d] %q is not a job status", i, s)
		}
		st[i] = string(s)
	}
	after := -1
	for {
		q, a := jobStreamSQL(batchID, after, st, db.streamBatch)
		rows, err := db.ro.QueryContext(ctx, q, a...)
		if err != nil {
			return err
		}
		js, err := collect(rows, scanJob)
		if err != nil {
			return err
		}
		for _, j := range js {
			if err := fn(j); err != nil {
				return err
			}
		}
		if len(js) < db.streamBatch {
			return nil
		}
		after = js[len(js)-1].LineNo
	}
}

// jobStreamSQL reads jobs_batch_line, in line order.
func jobStreamSQL(batchID string, after int, statuses []any, limit int) (string, args) {
	var a args
	q := `SELECT ` + jobColumns + ` FROM jobs WHERE batch_id = ` + a.add(batchID) + ` AND line_no > ` + a.add(after)
	if len(statuses) > 0 {
		q += ` AND status IN (` + a.list(statuses...) + `)`
	}
	return q + ` ORDER BY line_no LIMIT ` + a.add(limit), a
}

// JobCounts are a batch's jobs by status.
type JobCounts struct {
	Queued, Running, Waiting, Deferred int64
	Succeeded, Failed, Cancelled       int64
	Total                              int64
}

// Unfinished is how many jobs are not yet terminal.
func (c *JobCounts) Unfinished() int64 { return c.Queued + c.Running + c.Waiting + c.Deferred }

// sqlJobCountsByBatch reads jobs_batch_status, the index alone on Postgres.
const sqlJobCountsByBatch = `SELECT status, count(*) FROM jobs WHERE batch_id = $1 GROUP BY status`

// JobCountsByBatch counts the batch's jobs by status, from the index on
// (batch_id, status): no counter row is updated as jobs finish.
func (db *DB) JobCountsByBatch(ctx context.Context, batchID string) (*JobCounts, error) {
	rows, err := db.ro.QueryContext(ctx, sqlJobCountsByBatch, batchID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	c := &JobCounts{}
	for rows.Next() {
		var (
			s JobStatus
			n int64
		)
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		switch s {
		case JobQueued:
			c.Queued = n
		case JobRunning:
			c.Running = n
		case JobWaiting:
			c.Waiting = n
		case JobDeferred:
			c.Deferred = n
		case JobSucceeded:
			c.Succeeded = n
		case JobFailed:
			c.Failed = n
		case JobCancelled:
			c.Cancelled = n
		}
		c.Total += n
	}
	return c, rows.Err()
}
