package store

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

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
