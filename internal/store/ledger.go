package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/llmq/llmq/internal/money"
)

// UsageEntry is a job's row in the usage ledger, written once by JobComplete.
type UsageEntry struct {
	JobID            string
	TenantID         string
	BatchID          string
	Day              string // the tenant's budget day, "YYYY-MM-DD"
	GlobalDay        string // the UTC day of the global cap
	Model            string // the model charged: a fallback's when one answered
	Deployment       string // the deployment that answered
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64
	Cost             money.Micros
	CreatedAt        time.Time
	Batched          bool // run on the provider's Batch API
}

// UsageGetByJob returns the job's ledger row, or ErrNotFound if it was never charged.
func (db *DB) UsageGetByJob(ctx context.Context, jobID string) (*UsageEntry, error) {
	return getOne(ctx, db.ro, func(r row) (*UsageEntry, error) {
		var e UsageEntry
		return &e, r.Scan(&e.JobID, &e.TenantID, orZero[string]{&e.BatchID}, dayCol{&e.Day}, dayCol{&e.GlobalDay}, &e.Model, &e.Deployment,
			&e.PromptTokens, &e.CompletionTokens, &e.CachedTokens, &e.Cost, timeCol{&e.CreatedAt}, &e.Batched)
	}, "ledger row of job", jobID, `SELECT job_id, tenant_id, batch_id, day, global_day, model, deployment, prompt_tokens,
		completion_tokens, cached_tokens, cost_micros, created_at, batched FROM usage_ledger WHERE job_id = $1`, jobID)
}

// The ledger sums read indexes alone; each is one statement, so a row
// rolled up meanwhile counts once.
const (
	sqlUsageSumByTenantDay = `SELECT CAST((SELECT COALESCE(SUM(cost_micros), 0) FROM usage_ledger WHERE tenant_id = $1 AND day = $2)
		+ (SELECT COALESCE(SUM(cost_micros), 0) FROM usage_daily WHERE tenant_id = $1 AND day = $2) AS BIGINT)`
	sqlUsageSumByDay = `SELECT CAST((SELECT COALESCE(SUM(cost_micros), 0) FROM usage_ledger WHERE global_day = $1)
		+ (SELECT COALESCE(SUM(cost_micros), 0) FROM usage_daily WHERE global_day = $1) AS BIGINT)`
)

// UsageSumByTenantDay is the tenant's spend on the budget day ("YYYY-MM-DD").
func (db *DB) UsageSumByTenantDay(ctx context.Context, tenantID, day string) (money.Micros, error) {
	return db.usageSum(ctx, "UsageSumByTenantDay", day, sqlUsageSumByTenantDay, tenantID, day)
}

// UsageSumByDay is every tenant's spend on the budget day, for the global cap.
func (db *DB) UsageSumByDay(ctx context.Context, day string) (money.Micros, error) {
	return db.usageSum(ctx, "UsageSumByDay", day, sqlUsageSumByDay, day)
}

func (db *DB) usageSum(ctx context.Context, method, day, query string, a ...any) (money.Micros, error) {
	if err := validDay(method, day); err != nil {
		return 0, err
	}
	var sum money.Micros
	err := db.ro.queryRow(ctx, query, a...).Scan(&sum)
	return sum, err
}

// UsageReportParams select a day's usage.
type UsageReportParams struct {
	Day      string // "YYYY-MM-DD"
	TenantID string // optional: one tenant
}

// UsageReportRow is one tenant's use of one model on the day.
type UsageReportRow struct {
	TenantID         string
	Model            string
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64
	Cost             money.Micros
}

// UsageReport returns the day's usage by tenant and model, in that order.
func (db *DB) UsageReport(ctx context.Context, p *UsageReportParams) ([]*UsageReportRow, error) {
	if err := validDay("UsageReport", p.Day); err != nil {
		return nil, err
	}
	q, a := usageReportSQL(p)
	return collect(ctx, db.ro, func(r row) (*UsageReportRow, error) {
		var u UsageReportRow
		err := r.Scan(&u.TenantID, &u.Model, &u.Requests, &u.PromptTokens, &u.CompletionTokens, &u.CachedTokens, &u.Cost)
		return &u, err
	}, q, a...)
}

func usageReportSQL(p *UsageReportParams) (string, args) {
	var a args
	where := `day = ` + a.add(p.Day)
	if p.TenantID != "" {
		where += ` AND tenant_id = ` + a.add(p.TenantID)
	}
	return `SELECT tenant_id, model, CAST(SUM(requests) AS BIGINT),
			CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT),
			CAST(SUM(cached_tokens) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT)
		FROM (
			SELECT tenant_id, model, count(*) AS requests, SUM(prompt_tokens) AS prompt_tokens,
				SUM(completion_tokens) AS completion_tokens, SUM(cached_tokens) AS cached_tokens, SUM(cost_micros) AS cost_micros
			FROM usage_ledger WHERE ` + where + ` GROUP BY tenant_id, model
			UNION ALL
			SELECT tenant_id, model, requests, prompt_tokens, completion_tokens, cached_tokens, cost_micros
			FROM usage_daily WHERE ` + where + `
		) AS u GROUP BY tenant_id, model ORDER BY tenant_id, model`, a
}

// UsageDaySum is a tenant's spend on one budget day and one UTC day (a
// tenant's day outside UTC spans two UTC days).
type UsageDaySum struct {
	TenantID  string
	Day       string // the tenant's budget day
	GlobalDay string // the UTC day
	Cost      money.Micros
}

// UsageSumsByDays returns every tenant's spend on the budget days, in no
// particular order.
func (db *DB) UsageSumsByDays(ctx context.Context, days []string) ([]UsageDaySum, error) {
	if len(days) == 0 {
		return nil, nil
	}
	q, a, err := usageSumsByDaysSQL(days)
	if err != nil {
		return nil, err
	}
	out, err := collect(ctx, db.ro, func(r row) (s UsageDaySum, err error) {
		err = r.Scan(&s.TenantID, dayCol{&s.Day}, dayCol{&s.GlobalDay}, &s.Cost)
		return s, err
	}, q, a...)
	return out, failed("UsageSumsByDays", db.d.wrap(err))
}

func usageSumsByDaysSQL(days []string) (string, args, error) {
	for _, d := range days {
		if err := validDay("UsageSumsByDays", d); err != nil {
			return "", nil, err
		}
	}
	var a args
	in := list(&a, days)
	return `SELECT tenant_id, day, global_day, CAST(SUM(cost_micros) AS BIGINT) FROM (
			SELECT tenant_id, day, global_day, cost_micros FROM usage_ledger WHERE day IN (` + in + `)
			UNION ALL
			SELECT tenant_id, day, global_day, cost_micros FROM usage_daily WHERE day IN (` + in + `)
		) AS u GROUP BY tenant_id, day, global_day`, a, nil
}

// UsageStreamByTenantDay calls fn with each ledger row (not rolled up) of
// the tenant's budget day written at or after since, oldest first.
func (db *DB) UsageStreamByTenantDay(ctx context.Context, tenantID, day string, since time.Time, fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error {
	return db.streamUsage(ctx, "UsageStreamByTenantDay", day, since, `day = $1 AND tenant_id = $2`, args{day, tenantID}, fn)
}

// UsageStreamByDay is UsageStreamByTenantDay for the UTC day of every
// tenant, from usage_ledger_global_day_rows.
func (db *DB) UsageStreamByDay(ctx context.Context, day string, since time.Time, fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error {
	return db.streamUsage(ctx, "UsageStreamByDay", day, since, `global_day = $1`, args{day}, fn)
}

type usageRow struct {
	tenantID, jobID string
	cost            money.Micros
	at              time.Time
}

func (db *DB) streamUsage(ctx context.Context, method, day string, since time.Time, where string, a args, fn func(tenantID, jobID string, cost money.Micros, written time.Time) error) error {
	if err := validDay(method, day); err != nil {
		return err
	}
	scan := func(r row) (*usageRow, error) {
		var u usageRow
		return &u, r.Scan(&u.tenantID, &u.jobID, &u.cost, timeCol{&u.at})
	}
	return stream(ctx, db, "ledger rows of a day", scan, func(last *usageRow) (string, args) {
		at, after := since, ""
		if last != nil {
			at, after = last.at, last.jobID
		}
		return usageStreamSQL(where, slices.Clone(a), db.d.ts(at), after, db.streamBatch)
	}, func(u *usageRow) error { return fn(u.tenantID, u.jobID, u.cost, u.at) })
}

// usageStreamSQL pages in (created_at, job_id) order, both indexes' last columns.
func usageStreamSQL(where string, a args, at any, after string, limit int) (string, args) {
	return `SELECT tenant_id, job_id, cost_micros, created_at FROM usage_ledger WHERE ` + where +
		` AND (created_at, job_id) > (` + a.add(at) + `, ` + a.add(after) + `) ORDER BY created_at, job_id LIMIT ` + a.add(limit), a
}

// LedgerDetailMinAge is the least age at which a ledger row may be rolled
// up into usage_daily. JobComplete never charges a job that finished longer
// ago, so a job whose row was rolled up is never charged again.
const LedgerDetailMinAge = 72 * time.Hour

// UsageRollUp folds up to limit ledger rows written before before (at
// least LedgerDetailMinAge ago) into usage_daily, and returns how many.
func (db *DB) UsageRollUp(ctx context.Context, before time.Time, limit int) (int64, error) {
	if err := positive("UsageRollUp", limit); err != nil {
		return 0, err
	}
	if latest := db.now().Add(-LedgerDetailMinAge); before.After(latest) {
		return 0, fmt.Errorf("store: UsageRollUp: cut-off %s is less than %s ago", before.UTC().Format(time.RFC3339), LedgerDetailMinAge)
	}
	var n int64
	var err error
	if db.d.name == "postgres" {
		err = db.rw.queryRow(ctx, sqlUsageRollUp, db.d.ts(before), limit).Scan(&n)
	} else {
		err = db.tx(ctx, func(tx querier) error {
			if _, err := tx.exec(ctx, sqlUsageRollUpSums(`SELECT * FROM usage_ledger WHERE job_id IN (`+sqlUsageRollable+`)`), db.d.ts(before), limit); err != nil {
				return err
			}
			n, err = tx.exec(ctx, `DELETE FROM usage_ledger WHERE job_id IN (`+sqlUsageRollable+`)`, db.d.ts(before), limit)
			return err
		})
	}
	if err != nil {
		return 0, failed("UsageRollUp", db.d.wrap(err))
	}
	return n, nil
}

// sqlUsageRollable is ordered, to pick the same rows twice in one SQLite
// transaction.
const sqlUsageRollable = `SELECT job_id FROM usage_ledger WHERE created_at < $1 ORDER BY created_at, job_id LIMIT $2`

// sqlUsageRollUpSums adds rows to usage_daily in key order, so two
// rollups lock the same totals in one order.
func sqlUsageRollUpSums(rows string) string {
	return `INSERT INTO usage_daily AS d (tenant_id, day, global_day, model, requests, prompt_tokens, completion_tokens, cached_tokens, cost_micros)
		SELECT tenant_id, day, global_day, model, count(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(cached_tokens), SUM(cost_micros)
		FROM (` + rows + `) AS r WHERE true
		GROUP BY tenant_id, day, global_day, model ORDER BY tenant_id, day, model, global_day
		ON CONFLICT (tenant_id, day, model, global_day) DO UPDATE SET
			requests = d.requests + excluded.requests, prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
			completion_tokens = d.completion_tokens + excluded.completion_tokens,
			cached_tokens = d.cached_tokens + excluded.cached_tokens, cost_micros = d.cost_micros + excluded.cost_micros`
}

// sqlUsageRollUp is Postgres's; SKIP LOCKED keeps two rollups apart.
var sqlUsageRollUp = `WITH gone AS (
		DELETE FROM usage_ledger WHERE job_id IN (` + sqlUsageRollable + ` FOR UPDATE SKIP LOCKED)
		RETURNING tenant_id, day, global_day, model, prompt_tokens, completion_tokens, cached_tokens, cost_micros),
	sums AS (` + sqlUsageRollUpSums(`SELECT * FROM gone`) + ` RETURNING 1)
	SELECT count(*) FROM gone`

const sqlUsageCountRollable = `SELECT count(*) FROM usage_ledger WHERE created_at < $1`

// UsageCountRollable counts the ledger rows UsageRollUp would fold.
func (db *DB) UsageCountRollable(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := db.ro.queryRow(ctx, sqlUsageCountRollable, db.d.ts(before)).Scan(&n)
	return n, failed("UsageCountRollable", err)
}
