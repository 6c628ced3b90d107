package store

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// decodeJobRaw reads a job row as pgx's Scan of it does: every column set,
// and every nullable one NULL. The same rows asked for in text form take
// the Scan path, and must match too.
func TestJobRowDecodedAsScanned(t *testing.T) {
	t.Parallel()
	db := openURL(t, postgresURL(t))
	ctx := context.Background()
	tenant, err := db.TenantInsert(ctx, &TenantInsertParams{Name: "decode", Tier: "free"})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 7, 8, 9, 123456000, time.UTC)
	// The batch's row is not needed to read the job's: the foreign keys
	// are not checked while the rows go in.
	tx, err := db.rw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO jobs (id, tenant_id, batch_id, line_no, custom_id, endpoint, model, request, queue, status,
			attempts, rate_limited, est_prompt_tokens, est_max_tokens, est_cost_micros,
			response_status, response_body, provider_request_id, error,
			prompt_tokens, completion_tokens, cached_tokens, total_tokens, cost_micros,
			webhook_url, metadata, idempotency_key, created_at, started_at, finished_at, updated_at, next_run_at, sync)
		VALUES ('job_full', $1, 'batch_full', 7, 'c-7', '/v1/chat/completions', 'gpt-4o-mini', '{"model":"gpt-4o-mini","n":1}', 'low', 'failed',
			3, 2, -5, 4096, 123456789012,
			429, '{"id":"x","usage":{"total_tokens":9}}', 'req_1', '{"message":"slow down","type":"rate_limit","code":"rate_limited"}',
			11, 22, 33, 44, 987654321,
			'https://example.com/hook', '{"k":"v"}', 'idem-1', $2, $2::timestamptz + interval '1 second', $2::timestamptz + interval '2 seconds', $2::timestamptz + interval '3 seconds', $2::timestamptz - interval '1 day', true),
		('job_null', $1, NULL, NULL, NULL, '/v1/embeddings', 'm', '{}', 'default', 'queued',
			0, 0, 0, 0, 0, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, NULL, $2, NULL, NULL, $2, NULL, false)`,
		tenant.ID, at); err != nil {
		t.Fatalf("jobs: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"job_full", "job_null"} {
		for _, cols := range []string{jobColumns, jobViewColumns} {
			var raw, scanned, text *Job
			var decoded bool
			err := db.withPgx(ctx, func(c *pgx.Conn) error {
				q := `SELECT ` + cols + ` FROM jobs WHERE id = $1`
				rows, err := c.Query(ctx, q, id)
				if err != nil {
					return err
				}
				if !rows.Next() {
					t.Fatalf("%s: no row", id)
				}
				raw, decoded, err = decodeJobRaw(rows.FieldDescriptions(), rows.RawValues())
				rows.Close()
				if err != nil {
					return err
				}
				if scanned, err = scanJobPgx(c.QueryRow(ctx, q, id)); err != nil {
					return err
				}
				text, err = readJobPgx(c.Query(ctx, q, pgx.QueryResultFormats{pgx.TextFormatCode}, id))
				return err
			})
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			if !decoded {
				t.Fatalf("%s: the binary row was not decoded", id)
			}
			if !reflect.DeepEqual(raw, scanned) {
				t.Errorf("%s: decoded\n%+v\nscanned\n%+v", id, raw, scanned)
			}
			if !reflect.DeepEqual(text, scanned) {
				t.Errorf("%s: read in text form\n%+v\nscanned\n%+v", id, text, scanned)
			}
		}
	}
	// the fields were set, not left zero
	j, err := db.JobGetForTenant(ctx, tenant.ID, "job_full")
	if err != nil {
		t.Fatal(err)
	}
	if j.BatchID != "batch_full" || j.LineNo != 7 || j.EstPromptTokens != -5 || j.EstCost != 123456789012 || !j.Sync ||
		j.Error == nil || j.Error.Code != "rate_limited" || j.NextRunAt == nil || !j.NextRunAt.Equal(at.Add(-24*time.Hour)) ||
		!j.FinishedAt.Equal(at.Add(2*time.Second)) || string(j.Metadata) != `{"k": "v"}` {
		t.Errorf("JobGet(job_full) = %+v", j)
	}
}
