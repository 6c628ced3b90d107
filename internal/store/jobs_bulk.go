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

// sqliteRowsPerInsert keeps a statement's parameters (22 per row) well under
// SQLite's limit of 32766.
const sqliteRowsPerInsert = 500

func multiRowInsertJobs(ctx context.Context, db *DB, rows [][]any) error {
	return db.tx(ctx, func(tx querier) error {
		for chunk := range slices.Chunk(rows, sqliteRowsPerInsert) {
			if _, err := tx.exec(ctx, multiRowInsertSQL(len(chunk)), slices.Concat(chunk...)...); err != nil {
				return err
			}
		}
		return nil
	})
}

// multiRowInsertSQL inserts n rows with ? placeholders, not $N: SQLite
// finds a named parameter by a linear scan, quadratic over thousands.
func multiRowInsertSQL(n int) string {
	row := "(" + strings.Repeat("?, ", len(jobInsertColumns)-1) + "?)"
	return "INSERT INTO jobs (" + strings.Join(jobInsertColumns, ", ") + ") VALUES " +
		strings.Repeat(row+", ", n-1) + row
}
