package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/llmq/llmq/internal/money"
)

// The job row is on every request's and every run's path. On Postgres it
// is read through pgx's own interface, on a connection of database/sql's
// pool: pgx decodes each column straight into its Go field, where
// database/sql's adapter converts every column to a driver.Value first and
// then converts it again into the destination.

// queryJob reads the one job row query returns (a SELECT or an UPDATE ...
// RETURNING jobColumns); no row is sql.ErrNoRows, as with database/sql.
func (db *DB) queryJob(ctx context.Context, q querier, query string, a ...any) (*Job, error) {
	pool, ok := q.(*sql.DB)
	if !ok || db.d.name != "postgres" {
		return scanJob(q.QueryRowContext(ctx, query, a...))
	}
	var j *Job
	err := pgxOn(ctx, pool, func(c *pgx.Conn) error {
		var err error
		j, err = scanJobPgx(c.QueryRow(ctx, query, a...))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, sql.ErrNoRows
	}
	return j, err
}

// withPgx runs fn on a connection of the write pool (Postgres only).
func (db *DB) withPgx(ctx context.Context, fn func(*pgx.Conn) error) error {
	return pgxOn(ctx, db.rw, fn)
}

func pgxOn(ctx context.Context, pool *sql.DB, fn func(*pgx.Conn) error) error {
	conn, err := pool.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("store: a postgres connection of type %T", dc)
		}
		return fn(c.Conn())
	})
}

// scanJobPgx is scanJob for a pgx row of jobColumns.
func scanJobPgx(r pgx.Row) (*Job, error) {
	var (
		j                                    Job
		status                               string
		batchID, customID, providerRequestID *string
		webhookURL, idempotencyKey           *string
		lineNo, responseStatus               *int64
		estCost, cost                        int64
		request, responseBody, errJSON, meta []byte
		createdAt, updatedAt                 time.Time
		startedAt, finishedAt, nextRunAt     *time.Time
	)
	err := r.Scan(&j.ID, &j.TenantID, &batchID, &lineNo, &customID, &j.Endpoint, &j.Model, &request, &j.Queue, &status,
		&j.Attempts, &j.RateLimited, &j.EstPromptTokens, &j.EstMaxTokens, &estCost,
		&responseStatus, &responseBody, &providerRequestID, &errJSON,
		&j.PromptTokens, &j.CompletionTokens, &j.CachedTokens, &j.TotalTokens, &cost,
		&webhookURL, &meta, &idempotencyKey,
		&createdAt, &startedAt, &finishedAt, &updatedAt, &nextRunAt, &j.Sync)
	if err != nil {
		return nil, err
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	num := func(p *int64) int {
		if p == nil {
			return 0
		}
		return int(*p)
	}
	utc := func(p *time.Time) *time.Time {
		if p == nil {
			return nil
		}
		t := p.UTC()
		return &t
	}
	j.Status = JobStatus(status)
	j.BatchID, j.CustomID, j.ProviderRequestID = str(batchID), str(customID), str(providerRequestID)
	j.WebhookURL, j.IdempotencyKey = str(webhookURL), str(idempotencyKey)
	j.LineNo, j.ResponseStatus = num(lineNo), num(responseStatus)
	j.EstCost, j.Cost = money.Micros(estCost), money.Micros(cost)
	j.Request, j.ResponseBody, j.Metadata = request, responseBody, meta
	j.CreatedAt, j.UpdatedAt = createdAt.UTC(), updatedAt.UTC()
	j.StartedAt, j.FinishedAt, j.NextRunAt = utc(startedAt), utc(finishedAt), utc(nextRunAt)
	if errJSON != nil {
		j.Error = new(JobError)
		if err := json.Unmarshal(errJSON, j.Error); err != nil {
			return nil, fmt.Errorf("store: job %s: error column: %w", j.ID, err)
		}
	}
	return &j, nil
}
