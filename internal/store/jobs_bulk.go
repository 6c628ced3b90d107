package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// copyJobs writes rows with Postgres COPY on one connection of the pool. One
// COPY is one statement, so it is all or nothing without a transaction.
func copyJobs(ctx context.Context, db *DB, rows [][]any) error {
	conn, err := db.rw.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("postgres connection is a %T, not a pgx stdlib connection", dc)
		}
		n, err := c.Conn().CopyFrom(ctx, pgx.Identifier{"jobs"}, jobInsertColumns, pgx.CopyFromRows(rows))
		if err == nil && n != int64(len(rows)) {
			err = fmt.Errorf("COPY wrote %d of %d rows", n, len(rows))
		}
		return err
	})
}

// sqliteRowsPerInsert keeps a statement's parameters (21 per row) well under
// SQLite's limit of 32766.
const sqliteRowsPerInsert = 500

// multiRowInsertJobs writes rows as INSERTs of up to sqliteRowsPerInsert rows
// each, in one transaction, reusing one prepared statement for the full ones.
func multiRowInsertJobs(ctx context.Context, db *DB, rows [][]any) error {
	return db.tx(ctx, func(tx *sql.Tx) error {
		var full *sql.Stmt
		defer func() {
			if full != nil {
				_ = full.Close()
			}
		}()
		flat := make([]any, 0, sqliteRowsPerInsert*len(jobInsertColumns))
		for start := 0; start < len(rows); start += sqliteRowsPerInsert {
			chunk := rows[start:min(start+sqliteRowsPerInsert, len(rows))]
			flat = flat[:0]
			for _, r := range chunk {
				flat = append(flat, r...)
			}
			var err error
			if len(chunk) == sqliteRowsPerInsert {
				if full == nil {
					if full, err = tx.PrepareContext(ctx, multiRowInsertSQL(len(chunk))); err != nil {
						return err
					}
				}
				_, err = full.ExecContext(ctx, flat...)
			} else {
				_, err = tx.ExecContext(ctx, multiRowInsertSQL(len(chunk)), flat...)
			}
			if err != nil {
				return db.d.wrap(err)
			}
		}
		return nil
	})
}

// multiRowInsertSQL is INSERT INTO jobs (...) VALUES (?, ...), (...) for n
// rows. Anonymous ? placeholders here, not $N: SQLite finds a named
// parameter's name by a linear scan, which makes binding thousands of them
// quadratic (ten seconds for 50,000 rows instead of one).
func multiRowInsertSQL(n int) string {
	row := "(" + strings.Repeat("?, ", len(jobInsertColumns)-1) + "?)"
	var b strings.Builder
	b.WriteString("INSERT INTO jobs (" + strings.Join(jobInsertColumns, ", ") + ") VALUES ")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	return b.String()
}
