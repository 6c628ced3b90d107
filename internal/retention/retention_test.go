package retention_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/retention"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// On a table of 100,000 jobs, retention purges exactly the finished jobs
// past their age (their bodies; status, usage and cost stay) and folds the
// ledger rows past their age into daily totals (every day's spend the same
// after), while jobs are inserted, charged and polled: no request waits on a lock more than
// 100 ms (pg_stat_activity sampled every 10 ms; the time since the
// statement began, an upper bound of its wait), and every one is answered.
func TestPurgeOnALargeTableWhileServing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	app := "retention_" + testutil.RandomHex(4)
	url := testutil.Postgres(t) + "&application_name=" + app
	db, err := store.OpenMigrated(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ten, err := db.TenantInsert(ctx, &store.TenantInsertParams{Name: "big", Tier: "standard"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	// 40,000 finished 40 days ago (past a 30-day retention), 30,000
	// finished 10 days ago, 30,000 unfinished, interleaved by id.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `INSERT INTO jobs (id, tenant_id, endpoint, model, request, queue, status, created_at, updated_at,
			finished_at, response_status, response_body, prompt_tokens, cost_micros)
		SELECT 'job_' || lpad(i::text, 8, '0'), $1, '/v1/chat/completions', 'gpt-4o-mini',
			'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"a prompt to keep for a while"}]}', 'default',
			CASE WHEN i % 10 < 4 THEN 'succeeded' WHEN i % 10 < 7 THEN 'failed' ELSE 'queued' END,
			$2::timestamptz - interval '41 days', $2::timestamptz - interval '40 days',
			CASE WHEN i % 10 < 4 THEN $2::timestamptz - interval '40 days'
			     WHEN i % 10 < 7 THEN $2::timestamptz - interval '10 days' END,
			CASE WHEN i % 10 < 4 THEN 200 END, CASE WHEN i % 10 < 4 THEN '{"choices":[]}'::jsonb END, 12, 34
		FROM generate_series(1, 100000) AS i`, ten.ID, now); err != nil {
		t.Fatal(err)
	}
	// Each finished job's ledger row, charged when it finished, on one of
	// four budget days.
	if _, err := conn.Exec(ctx, `INSERT INTO usage_ledger (job_id, tenant_id, day, global_day, model, prompt_tokens, cost_micros, created_at)
		SELECT id, tenant_id, (finished_at - (right(id, 1)::int % 4) * interval '1 day')::date, finished_at::date,
			model, prompt_tokens, cost_micros, finished_at
		FROM jobs WHERE finished_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ANALYZE jobs; ANALYZE usage_ledger"); err != nil {
		t.Fatal(err)
	}
	days := []string{"2026-10-19", "2026-10-20", "2026-10-21", "2026-10-22", "2026-11-18", "2026-11-19", "2026-11-20", "2026-11-21"}
	spend := func() []money.Micros {
		var out []money.Micros
		for _, d := range days {
			tenant, err := db.UsageSumByTenantDay(ctx, ten.ID, d)
			if err != nil {
				t.Fatal(err)
			}
			global, err := db.UsageSumByDay(ctx, d)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tenant, global)
		}
		return out
	}
	spendBefore := spend()

	p := &retention.Purger{Store: db, Now: func() time.Time { return now },
		Retention: func() config.Retention {
			return config.Retention{FinishedJobs: 30 * 24 * time.Hour, Ledger: 30 * 24 * time.Hour}
		}}
	if rep, err := p.Preview(ctx); err != nil || rep.Jobs != 40000 || rep.LedgerRows != 40000 {
		t.Fatalf("Preview = %+v, %v; want 40000 jobs and ledger rows", rep, err)
	}

	// Meanwhile: producers insert jobs, pollers read them, a sampler looks
	// for sessions of this test waiting on a lock.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var latencies []time.Duration
	var ops, failures atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				var err error
				if w%2 == 0 {
					var j *store.Job
					j, _, err = db.JobInsert(ctx, &store.JobInsertParams{TenantID: ten.ID, Endpoint: "/v1/chat/completions", Model: "gpt-4o-mini",
						Request: json.RawMessage(`{"model":"gpt-4o-mini"}`), Queue: "default"})
					if err == nil && w == 2 { // one producer's jobs also run and are charged
						if _, _, err = db.JobStart(ctx, j.ID, ""); err == nil {
							_, err = db.JobComplete(ctx, &store.JobCompleteParams{ID: j.ID, Day: "2026-12-01", Cost: 1})
						}
					}
				} else {
					_, err = db.JobGetForTenant(ctx, ten.ID, fmt.Sprintf("job_%08d", 1+(i*7919)%100000))
				}
				d := time.Since(start)
				ops.Add(1)
				if err != nil {
					failures.Add(1)
				}
				mu.Lock()
				latencies = append(latencies, d)
				mu.Unlock()
				time.Sleep(time.Millisecond) // a busy service's pace, not a load test
			}
		})
	}
	var lockWaits atomic.Int64
	var longestWait string
	var longest atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			rows, err := conn.Query(context.Background(), `SELECT extract(epoch FROM now() - state_change) * 1000, wait_event, left(query, 60)
				FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'
					AND query NOT LIKE 'UPDATE jobs SET request = ''{}''%' AND query NOT LIKE 'WITH gone AS%'`, app) // the requests, not the purge itself
			if err != nil {
				continue
			}
			for rows.Next() {
				var ms float64
				var ev, q string
				if rows.Scan(&ms, &ev, &q) == nil {
					lockWaits.Add(1)
					if int64(ms) > longest.Load() {
						longest.Store(int64(ms))
						mu.Lock()
						longestWait = fmt.Sprintf("%s on %q", ev, q)
						mu.Unlock()
					}
				}
			}
			rows.Close()
		}
	})
	start := time.Now()
	rep, err := p.Purge(ctx)
	took := time.Since(start)
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Jobs != 40000 || rep.LedgerRows != 40000 {
		t.Fatalf("purged %d jobs and %d ledger rows, want the 40000 past their age", rep.Jobs, rep.LedgerRows)
	}
	if after := spend(); !slices.Equal(after, spendBefore) {
		t.Fatalf("spend by day (tenant, global) after the purge %v, before %v", after, spendBefore)
	}
	var ledgerLeft, dailyRows, dailyRequests int64
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_ledger WHERE created_at < $1::timestamptz - interval '1 day'),
			(SELECT count(*) FROM usage_daily), (SELECT COALESCE(SUM(requests), 0) FROM usage_daily)`, now).
		Scan(&ledgerLeft, &dailyRows, &dailyRequests); err != nil {
		t.Fatal(err)
	}
	if ledgerLeft != 30000 || dailyRows != 4 || dailyRequests != 40000 {
		t.Fatalf("ledger rows left %d (want the 30000 younger), daily totals %d rows of %d requests (want 4 of 40000)",
			ledgerLeft, dailyRows, dailyRequests)
	}
	if longest.Load() > 100 {
		t.Fatalf("a session waited %d ms on a lock (%s) while retention ran (%d samples of waits)", longest.Load(), longestWait, lockWaits.Load())
	}
	if f := failures.Load(); f > 0 {
		t.Fatalf("%d of %d inserts and polls failed meanwhile", f, ops.Load())
	}
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100]
	t.Logf("purged %d jobs and %d ledger rows in %v; meanwhile %d inserts and polls, p99 %v, max %v; lock waits seen %d, longest %d ms",
		rep.Jobs, rep.LedgerRows, took.Round(time.Millisecond), ops.Load(), p99, latencies[len(latencies)-1], lockWaits.Load(), longest.Load())

	// Exactly those: the old finished jobs lost their bodies and kept the
	// rest; the recent finished ones and the unfinished kept everything.
	var purged, kept, wrong int
	err = conn.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE purged_at IS NOT NULL AND request = '{}' AND response_body IS NULL AND prompt_tokens = 12 AND cost_micros = 34),
			count(*) FILTER (WHERE purged_at IS NULL AND request <> '{}'),
			count(*) FILTER (WHERE (purged_at IS NOT NULL) <> (status IN ('succeeded', 'failed', 'cancelled') AND finished_at < $1::timestamptz - interval '30 days'))
		FROM jobs WHERE id ~ '^job_[0-9]{8}$'`, now).Scan(&purged, &kept, &wrong)
	if err != nil {
		t.Fatal(err)
	}
	if purged != 40000 || kept != 60000 || wrong != 0 {
		t.Fatalf("purged %d (want 40000), kept %d (want 60000), wrongly treated %d", purged, kept, wrong)
	}
	// A purged job still reads, with its usage and without its bodies.
	j, err := db.JobGetForTenant(ctx, ten.ID, "job_00000001")
	if err != nil || j.Status != store.JobSucceeded || len(j.ResponseBody) != 0 || j.PromptTokens != 12 {
		t.Fatalf("purged job = %+v, %v", j, err)
	}
	// A second pass finds nothing more.
	if rep, err := p.Purge(ctx); err != nil || rep.Jobs != 0 {
		t.Fatalf("second pass = %+v, %v", rep, err)
	}
}

// Files past retention.files go, content and all, unless a running batch
// uses them; newer files stay; the preview counts what a pass deletes.
func TestPurgeFiles(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testutil.Postgres(t)
	db, err := store.OpenMigrated(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ten, err := db.TenantInsert(ctx, &store.TenantInsertParams{Name: "files", Tier: "standard"})
	if err != nil {
		t.Fatal(err)
	}
	file := func(name, content string) *store.File {
		f, err := db.FileInsert(ctx, &store.FileInsertParams{TenantID: ten.ID, Purpose: store.FilePurposeBatch, Filename: name,
			Content: strings.NewReader(content)})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	old, used, recent := file("old.jsonl", `{"custom_id":"a"}`+"\n"), file("used.jsonl", `{"custom_id":"b"}`+"\n"), file("recent.jsonl", "{}\n")
	if _, err := db.BatchInsert(ctx, &store.BatchInsertParams{TenantID: ten.ID, InputFileID: used.ID, Endpoint: "/v1/chat/completions",
		CompletionWindow: "24h"}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "UPDATE files SET created_at = now() - interval '10 days' WHERE id IN ($1, $2)", old.ID, used.ID); err != nil {
		t.Fatal(err)
	}
	p := &retention.Purger{Store: db, Retention: func() config.Retention { return config.Retention{Files: 7 * 24 * time.Hour} }}
	pre, err := p.Preview(ctx)
	if err != nil || pre.Files != 1 || pre.FileBytes != old.Bytes {
		t.Fatalf("Preview = %+v, %v; want the old file alone (%d bytes)", pre, err, old.Bytes)
	}
	rep, err := p.Purge(ctx)
	if err != nil || rep.Files != 1 || rep.FileBytes != old.Bytes {
		t.Fatalf("Purge = %+v, %v", rep, err)
	}
	if _, err := db.FileGetForTenant(ctx, ten.ID, old.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the old file is still there: %v", err)
	}
	for _, f := range []*store.File{used, recent} {
		if _, err := db.FileGetForTenant(ctx, ten.ID, f.ID); err != nil {
			t.Errorf("file %s went: %v", f.Filename, err)
		}
	}
}

// The policy's shortest ledger retention is one the store folds at.
func TestLedgerRetentionFloor(t *testing.T) {
	t.Parallel()
	if config.MinLedgerRetention < store.LedgerDetailMinAge {
		t.Fatalf("the policy accepts retention.ledger %s, the store folds rows only from %s", config.MinLedgerRetention, store.LedgerDetailMinAge)
	}
}

// The records of stored responses go once a provider no longer keeps the
// responses (30 days), whatever the policy's retention; younger ones stay.
func TestPurgeStoredResponses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := store.OpenMigrated(ctx, testutil.Postgres(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ten, err := db.TenantInsert(ctx, &store.TenantInsertParams{Name: "t", Tier: "standard"})
	if err != nil {
		t.Fatal(err)
	}
	rows := []store.StoredResponse{
		{ID: "resp_1", ResponseID: "resp_1", TenantID: ten.ID, Deployment: "openai/gpt-4o", Tokens: 10},
		{ID: "msg_1", ResponseID: "resp_1", TenantID: ten.ID, Deployment: "openai/gpt-4o", Tokens: 4},
	}
	if err := db.StoredResponseInsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		after time.Duration
		want  int64
	}{{29 * 24 * time.Hour, 0}, {31 * 24 * time.Hour, 2}} {
		p := &retention.Purger{Store: db, Retention: func() config.Retention { return config.Retention{} },
			Now: func() time.Time { return time.Now().Add(c.after) }, Batch: 1}
		rep, err := p.Purge(ctx)
		if err != nil || rep.StoredResponses != c.want {
			t.Fatalf("%v later: purged %d, %v; want %d", c.after, rep.StoredResponses, err, c.want)
		}
	}
	if left, err := db.StoredResponseGet(ctx, []string{"resp_1", "msg_1"}); err != nil || len(left) != 0 {
		t.Fatalf("left %v, %v", left, err)
	}
}
