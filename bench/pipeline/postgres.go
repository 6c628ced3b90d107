package main

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
)

// postgresSchema creates a schema of the run's own in the database at base
// and returns a DSN whose search_path is that schema, and what drops it.
// It is testutil.Postgres without a testing.TB: the run migrates a fresh
// schema, so earlier runs' rows never slow it down.
func postgresSchema(ctx context.Context, base string) (dsn string, drop func(), err error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, fmt.Errorf("-database: %w", err)
	}
	// pool_max_conns is llmq's own parameter (store.Open), unknown to pgx.
	plain := *u
	q := plain.Query()
	q.Del("pool_max_conns")
	plain.RawQuery = q.Encode()
	admin := plain.String()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("postgres at %s does not answer: %w", u.Redacted(), err)
	}
	defer conn.Close(context.Background())
	schema := "bench_" + randomHex(6)
	if _, err := conn.Exec(cctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, fmt.Errorf("create schema: %w", err)
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	}
	q = u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}
