package store

import (
	"strings"
	"testing"
	"time"
)

// TestQueriesUseIndexes asks each backend's planner how it runs the queries
// that are hot or scan a large table, and fails on a full scan of the table
// (or, for pages, on a sort): a missing index there is how a budget query
// takes a database to 94% CPU. Postgres plans with sequential scans
// discouraged, since on near-empty tables it would rightly prefer them.
func TestQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]func(testing.TB) string{"postgres": postgresURL, "sqlite": sqliteURL} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := openURL(t, url(t))
			checkPlans(t, db)
		})
	}
}

func checkPlans(t *testing.T, db *DB) {
	type query struct {
		name    string
		sql     string
		args    args
		ordered bool // a page: must come in index order, not be sorted
	}
	var qs []query
	add := func(name string, ordered bool, q string, a args) {
		qs = append(qs, query{name, q, a, ordered})
	}
	for _, p := range []JobListParams{
		{TenantID: "t"},
		{TenantID: "t", After: "job_x"},
		{TenantID: "t", Status: JobFailed, After: "job_x"},
		{TenantID: "t", BatchID: "b", After: "job_x"},
		{TenantID: "t", BatchID: "b", Status: JobFailed},
	} {
		pq := jobListSQL(&p)
		add("JobList "+p.Status.str()+p.BatchID, true, pq.sql, pq.args)
	}
	pq := jobListUnfinishedSQL(db.d, &JobListUnfinishedParams{After: "job_x", UpdatedBefore: time.Now(), SkipValidating: true})
	add("JobListUnfinished", true, pq.sql, pq.args)
	for _, kind := range []string{WebhookJob, WebhookBatch} {
		pq := webhookListPendingSQL(db.d, webhookTables[kind], &WebhookListPendingParams{Kind: kind, After: "x", FinishedBefore: time.Now()})
		add("WebhookListPending "+kind, true, pq.sql, pq.args)
	}
	q, a := jobStreamSQL("b", 10, []any{"succeeded"}, 500)
	add("JobStreamByBatch", true, q, a)
	add("JobCountsByBatch", false, sqlJobCountsByBatch, args{"b"})
	add("JobCancelByBatch", false, sqlJobCancelByBatch, args{"b", db.d.ts(time.Now())})
	add("JobInsert idempotency key", false, `SELECT `+jobColumns+` FROM jobs WHERE `+whereIdempotencyKey, args{"t", "k"})
	add("JobGetByID", false, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, args{"job_x"})
	add("UsageSumByTenantDay", false, sqlUsageSumByTenantDay, args{"t", "2026-03-01"})
	add("UsageSumByDay", false, sqlUsageSumByDay, args{"2026-03-01"})
	add("UsageRollUp rows", false, sqlUsageRollable, args{db.d.ts(time.Now()), 500})
	q, a, err := usageSumsByDaysSQL([]string{"2026-02-28", "2026-03-01", "2026-03-02"})
	if err != nil {
		t.Fatal(err)
	}
	add("UsageSumsByDays", false, q, a)
	q, a = usageStreamSQL(`day = $1 AND tenant_id = $2`, args{"2026-03-01", "t"}, db.d.ts(time.Now()), "job_x", 500)
	add("UsageStreamByTenantDay", true, q, a)
	q, a = usageStreamSQL(`global_day = $1`, args{"2026-03-01"}, db.d.ts(time.Now()), "job_x", 500)
	add("UsageStreamByDay", true, q, a)
	add("UsageCountRollable", false, sqlUsageCountRollable, args{db.d.ts(time.Now())})
	q, a = usageReportSQL(&UsageReportParams{Day: "2026-03-01"})
	add("UsageReport", false, q, a)
	q, a = usageReportSQL(&UsageReportParams{Day: "2026-03-01", TenantID: "t"})
	add("UsageReport tenant", false, q, a)
	add("APIKeyGetByHash", false, sqlAPIKeyGetByHash, args{make([]byte, 32)})
	pq = batchListSQL(&BatchListParams{TenantID: "t", After: "batch_x"})
	add("BatchList", true, pq.sql, pq.args)
	pq = batchListActiveSQL(&BatchListActiveParams{After: "batch_x"})
	add("BatchListActive", true, pq.sql, pq.args)
	pq = fileListSQL(&FileListParams{TenantID: "t", After: "file-x"})
	add("FileList", true, pq.sql, pq.args)
	pq = fileListSQL(&FileListParams{TenantID: "t", Purpose: FilePurposeBatch, After: "file-x"})
	add("FileList purpose", true, pq.sql, pq.args)
	add("FileDelete used by batches", false, sqlFileUsedByBatches, args{"file-x"})

	for _, q := range qs {
		plan := explain(t, db, q.sql, q.args)
		bad := ""
		subqueries := map[string]bool{"CONSTANT ROW": true} // SQLite: what a SCAN of is no table's
		for _, line := range plan {
			line := strings.TrimSpace(line)
			if name, ok := strings.CutPrefix(line, "CO-ROUTINE "); ok {
				subqueries[name] = true
			}
			switch {
			case strings.Contains(line, "Seq Scan"):
				bad = line
			case strings.HasPrefix(line, "SCAN ") && !strings.Contains(line, "USING") && !subqueries[strings.TrimPrefix(line, "SCAN ")]:
				bad = line // SQLite: a scan of the table itself
			case q.ordered && (strings.Contains(line, "Sort") || strings.Contains(line, "TEMP B-TREE FOR ORDER BY")):
				bad = line
			}
		}
		if bad != "" {
			t.Errorf("%s: %q\nplan:\n%s", q.name, bad, strings.Join(plan, "\n"))
		} else if testing.Verbose() {
			t.Logf("%s:\n%s", q.name, strings.Join(plan, "\n"))
		}
	}
}

func (s JobStatus) str() string { return string(s) }

// explain returns the plan of q, one line per node.
func explain(t *testing.T, db *DB, q string, a args) []string {
	t.Helper()
	ctx := t.Context()
	var plan []string
	err := db.tx(ctx, func(tx querier) error {
		if db.Dialect() == "postgres" {
			if _, err := tx.exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
				return err
			}
			return tx.query(ctx, "EXPLAIN "+q, a, func(r row) error {
				var line string
				err := r.Scan(&line)
				plan = append(plan, line)
				return err
			})
		}
		return tx.query(ctx, "EXPLAIN QUERY PLAN "+q, a, func(r row) error {
			var (
				id, parent, notUsed int
				detail              string
			)
			err := r.Scan(&id, &parent, &notUsed, &detail)
			plan = append(plan, detail)
			return err
		})
	})
	if err != nil {
		t.Fatalf("explain %s: %v", q, err)
	}
	return plan
}
