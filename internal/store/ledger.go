package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/money"
)

// UsageEntry is a job's row in the usage ledger: what it cost, written once
// by JobComplete and never updated.
type UsageEntry struct {
	JobID            string
	TenantID         string
	BatchID          string
	Day              string // the tenant's budget day, "YYYY-MM-DD"
	GlobalDay        string // the UTC day of the global cap
	Model            string // the model charged: a fallback's when one answered
	Deployment       string // the deployment that answered; "" on rows older than deployments
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64
	Cost             money.Micros
	CreatedAt        time.Time
}

// UsageGetByJob returns the job's ledger row, or ErrNotFound if it was never charged.
func (db *DB) UsageGetByJob(ctx context.Context, jobID string) (*UsageEntry, error) {
	var e UsageEntry
	err := db.ro.queryRow(ctx, `
		SELECT job_id, tenant_id, batch_id, day, global_day, model, deployment, prompt_tokens, completion_tokens, cached_tokens, cost_micros, created_at
		FROM usage_ledger WHERE job_id = $1`, jobID).
		Scan(&e.JobID, &e.TenantID, orZero[string]{&e.BatchID}, dayCol{&e.Day}, dayCol{&e.GlobalDay}, &e.Model, &e.Deployment, &e.PromptTokens,
			&e.CompletionTokens, &e.CachedTokens, &e.Cost, timeCol{&e.CreatedAt})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("ledger row of job", jobID)
	}
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// The ledger sums read usage_ledger_tenant_day and usage_ledger_day_model:
// the budget is rebuilt from them, so they must never scan the ledger.
const (
	sqlUsageSumByTenantDay = `SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM usage_ledger WHERE tenant_id = $1 AND day = $2`
	sqlUsageSumByDay       = `SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM usage_ledger WHERE global_day = $1`
)

// UsageSumByTenantDay is the tenant's spend on the budget day ("YYYY-MM-DD"),
// from the index on (tenant_id, day).
func (db *DB) UsageSumByTenantDay(ctx context.Context, tenantID, day string) (money.Micros, error) {
	if err := validDay("UsageSumByTenantDay", day); err != nil {
		return 0, err
	}
	var sum money.Micros
	err := db.ro.queryRow(ctx, sqlUsageSumByTenantDay, tenantID, day).Scan(&sum)
	return sum, err
}

// UsageSumByDay is every tenant's spend on the budget day, for the global cap.
func (db *DB) UsageSumByDay(ctx context.Context, day string) (money.Micros, error) {
	if err := validDay("UsageSumByDay", day); err != nil {
		return 0, err
	}
	var sum money.Micros
	err := db.ro.queryRow(ctx, sqlUsageSumByDay, day).Scan(&sum)
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

// UsageReport returns the day's usage grouped by tenant and model, ordered by
// tenant id then model.
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

// usageReportSQL reads usage_ledger_day_model, or usage_ledger_tenant_day for one tenant.
func usageReportSQL(p *UsageReportParams) (string, args) {
	var a args
	q := `SELECT tenant_id, model, count(*),
			CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT),
			CAST(SUM(cached_tokens) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT)
		FROM usage_ledger WHERE day = ` + a.add(p.Day)
	if p.TenantID != "" {
		q += ` AND tenant_id = ` + a.add(p.TenantID)
	}
	return q + ` GROUP BY tenant_id, model ORDER BY tenant_id, model`, a
}

// UsageCharge is one ledger row, as a budget audit reads it.
type UsageCharge struct {
	JobID     string
	TenantID  string
	Day       string
	GlobalDay string
	Cost      money.Micros
	CreatedAt time.Time
}

// UsageChargesSince returns the ledger rows written at or after since (at
// most limit, oldest first), for a budget audit after a failover.
func (db *DB) UsageChargesSince(ctx context.Context, since time.Time, limit int) ([]UsageCharge, error) {
	var out []UsageCharge
	err := db.ro.query(ctx, `SELECT job_id, tenant_id, day, global_day, cost_micros, created_at FROM usage_ledger
		WHERE created_at >= $1 ORDER BY created_at LIMIT $2`, []any{db.d.ts(since), limit}, func(r row) error {
		var c UsageCharge
		err := r.Scan(&c.JobID, &c.TenantID, dayCol{&c.Day}, dayCol{&c.GlobalDay}, &c.Cost, timeCol{&c.CreatedAt})
		out = append(out, c)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: UsageChargesSince: %w", db.d.wrap(err))
	}
	return out, nil
}
