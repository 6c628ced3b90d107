package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/llmq/llmq/internal/money"
)

// The job row is on every request's and every run's path. On Postgres it
// is read through pgx's own interface, on a connection of database/sql's
// pool, and decoded here from the bytes Postgres sent (decodeJobRaw):
// database/sql's adapter converts every column to a driver.Value first and
// then again into the destination, and pgx's Scan plans each column's
// conversion again for every row.

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
		j, err = readJobPgx(c.Query(ctx, query, a...))
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

// readJobPgx reads the one job row of rows (jobColumns), as pgx's QueryRow
// would: no row is pgx.ErrNoRows, and an error the server sends after the
// row is returned. The row is decoded from the bytes Postgres sent by
// decodeJobRaw or, should a column come in a form it does not read, by
// scanJobPgx.
func readJobPgx(rows pgx.Rows, err error) (*Job, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, err
		}
		return nil, pgx.ErrNoRows
	}
	j, ok, err := decodeJobRaw(rows.FieldDescriptions(), rows.RawValues())
	if !ok {
		j, err = scanJobPgx(rows)
	}
	rows.Close()
	if rerr := rows.Err(); rerr != nil {
		return nil, rerr
	}
	return j, err
}

// decodeJobRaw decodes a row of jobColumns from the values Postgres sent,
// when every column is of its type in the schema and came in the form pgx
// asks for (text for text and jsonb, binary for the others) or the binary
// one; ok is false, and nothing decoded, when one did not. pgx would plan
// the scan of each of the 34 columns again for every row it reads (its
// plans live in one Rows), which cost more than the decoding itself.
func decodeJobRaw(fds []pgconn.FieldDescription, vals [][]byte) (j *Job, ok bool, err error) {
	if len(fds) != jobColumnCount || len(vals) != jobColumnCount {
		return nil, false, nil
	}
	r := rawRow{fds: fds, vals: vals}
	j = &Job{}
	j.ID, j.TenantID, j.BatchID = r.text(), r.text(), r.text()
	j.LineNo = int(r.int())
	j.CustomID, j.Endpoint, j.Model = r.text(), r.text(), r.text()
	j.Request = r.json()
	j.Queue, j.Status = r.text(), JobStatus(r.text())
	j.Attempts, j.RateLimited = int(r.int()), int(r.int())
	j.EstPromptTokens, j.EstMaxTokens, j.EstCost = r.int(), r.int(), money.Micros(r.int())
	j.ResponseStatus = int(r.int())
	j.ResponseBody = r.json()
	j.ProviderRequestID = r.text()
	errJSON := r.json()
	j.PromptTokens, j.CompletionTokens, j.CachedTokens, j.TotalTokens = r.int(), r.int(), r.int(), r.int()
	j.Cost = money.Micros(r.int())
	j.WebhookURL = r.text()
	j.Metadata = r.json()
	j.IdempotencyKey = r.text()
	var created, updated *time.Time
	created, j.StartedAt, j.FinishedAt, updated, j.NextRunAt = r.time(), r.time(), r.time(), r.time(), r.time()
	j.Sync, j.UsageEstimated = r.bool(), r.bool()
	if r.unsupported || created == nil || updated == nil {
		return nil, false, nil
	}
	j.CreatedAt, j.UpdatedAt = *created, *updated
	if err := j.setError(errJSON); err != nil {
		return nil, true, err
	}
	return j, true, nil
}

// jobColumnCount is how many columns jobColumns names.
var jobColumnCount = strings.Count(jobColumns, ",") + 1

// rawRow decodes a row's binary values column by column; a column in
// another form, or of another type, marks the row unsupported.
type rawRow struct {
	fds         []pgconn.FieldDescription
	vals        [][]byte
	i           int
	unsupported bool
}

// next returns the next column's value (nil when NULL) and its form, if
// it is of one of oids and in binary form or, when textOK, in text form.
func (r *rawRow) next(textOK bool, oids ...uint32) ([]byte, int16) {
	fd, v := r.fds[r.i], r.vals[r.i]
	r.i++
	if v == nil && fd.DataTypeOID == pgtype.TextOID {
		return nil, fd.Format // NULL AS request has no type of its own
	}
	if (fd.Format != pgx.BinaryFormatCode && !(textOK && fd.Format == pgx.TextFormatCode)) || !slices.Contains(oids, fd.DataTypeOID) {
		r.unsupported = true
	}
	return v, fd.Format
}

// text returns a text column: its text and binary forms are the same bytes.
func (r *rawRow) text() string {
	v, _ := r.next(true, pgtype.TextOID, pgtype.VarcharOID)
	return string(v)
}

func (r *rawRow) int() int64 {
	v, _ := r.next(false, pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID)
	switch len(v) {
	case 0:
		return 0
	case 2:
		return int64(int16(binary.BigEndian.Uint16(v)))
	case 4:
		return int64(int32(binary.BigEndian.Uint32(v)))
	case 8:
		return int64(binary.BigEndian.Uint64(v))
	}
	r.unsupported = true
	return 0
}

func (r *rawRow) bool() bool {
	v, _ := r.next(false, pgtype.BoolOID)
	if len(v) != 1 {
		r.unsupported = true
		return false
	}
	return v[0] == 1
}

// postgresEpoch is 2000-01-01 UTC in µs since 1970: a binary timestamptz
// counts µs from it.
const postgresEpoch = 946684800000000

func (r *rawRow) time() *time.Time {
	v, _ := r.next(false, pgtype.TimestamptzOID)
	if v == nil {
		return nil
	}
	if len(v) != 8 {
		r.unsupported = true
		return nil
	}
	us := int64(binary.BigEndian.Uint64(v))
	if us == math.MaxInt64 || us == math.MinInt64 { // ±infinity
		r.unsupported = true
		return nil
	}
	t := time.UnixMicro(postgresEpoch + us).UTC()
	return &t
}

// json returns a jsonb column's JSON text, copied out of the connection's
// buffer: its text form, or its binary form less the version byte (1) that
// leads it.
func (r *rawRow) json() []byte {
	v, format := r.next(true, pgtype.JSONBOID)
	if v == nil {
		return nil
	}
	if format == pgx.BinaryFormatCode {
		if len(v) == 0 || v[0] != 1 {
			r.unsupported = true
			return nil
		}
		v = v[1:]
	}
	return bytes.Clone(v)
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
		&createdAt, &startedAt, &finishedAt, &updatedAt, &nextRunAt, &j.Sync, &j.UsageEstimated)
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
	if err := j.setError(errJSON); err != nil {
		return nil, err
	}
	return &j, nil
}

// setError decodes the error column, when set.
func (j *Job) setError(errJSON []byte) error {
	if errJSON == nil {
		return nil
	}
	j.Error = new(JobError)
	if err := json.Unmarshal(errJSON, j.Error); err != nil {
		j.Error = nil
		return fmt.Errorf("store: job %s: error column: %w", j.ID, err)
	}
	return nil
}
