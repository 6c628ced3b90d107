package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/testutil"
)

// holdRow locks a row FOR UPDATE in a transaction of its own until the
// returned function is called: a statement that needs the row waits.
func holdRow(t *testing.T, db *DB, table, id string) (release func()) {
	t.Helper()
	tx, err := db.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM `+table+` WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// TestJobWritesAreGrouped: inserts, starts and results made while another
// of their kind is under way go in the next one's transaction, and each
// caller gets its own outcome: a conflict, an unknown tenant or a
// repeated idempotency key in a group fail or answer alone, and the rest
// are stored.
func TestJobWritesAreGrouped(t *testing.T) {
	t.Parallel()
	db := openURL(t, postgresURL(t))
	ctx := t.Context()
	ten := mkTenant(t, db)
	taken := mkJob(t, db, jobParams(ten.ID))

	// Inserts: the first waits for the tenant's row (its reference
	// check), the others queue behind it.
	calls := db.groups.jobRows.Calls()
	release := holdRow(t, db, "tenants", ten.ID)
	first := make(chan error, 1)
	go func() { _, _, err := db.JobInsert(ctx, jobParams(ten.ID)); first <- err }()
	testutil.Eventually(t, 10*time.Second, func() bool { return db.groups.jobRows.Calls() == calls+1 })
	const n = 20
	type outcome struct {
		job     *Job
		created bool
		err     error
	}
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		p := jobParams(ten.ID)
		switch {
		case i == 3:
			p.ID = taken.ID // ErrConflict
		case i == 5:
			p.TenantID = "ten_missing" // ErrNotFound
		case i >= 10 && i < 14:
			p.IdempotencyKey = fmt.Sprintf("key-%d", i/2) // two callers a key
		}
		p.CustomID = fmt.Sprint(i)
		wg.Go(func() {
			j, created, err := db.JobInsert(ctx, p)
			out[i] = outcome{j, created, err}
		})
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return db.groups.jobRows.Queued("insert") == n })
	release()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("first insert: %v", err)
	}
	if c := db.groups.jobRows.Calls() - calls; c != 2 {
		t.Fatalf("%d inserts in %d calls, want 2", n+1, c)
	}
	created := map[string]bool{}
	for i, o := range out {
		switch {
		case i == 3:
			if !errors.Is(o.err, ErrConflict) {
				t.Errorf("insert of a taken id: %v", o.err)
			}
		case i == 5:
			if !errors.Is(o.err, ErrNotFound) {
				t.Errorf("insert for an unknown tenant: %v", o.err)
			}
		case o.err != nil:
			t.Errorf("insert %d: %v", i, o.err)
		case i >= 10 && i < 14:
			if o.created {
				if created[o.job.IdempotencyKey] {
					t.Errorf("idempotency key %s created twice", o.job.IdempotencyKey)
				}
				created[o.job.IdempotencyKey] = true
			}
		case !o.created || o.job.CustomID != fmt.Sprint(i) || o.job.Status != JobQueued:
			t.Errorf("insert %d: created=%v %+v", i, o.created, o.job)
		}
	}
	if len(created) != 2 {
		t.Errorf("idempotency keys created: %v, want 2", created)
	}

	// Starts: the first waits for its job's row, the others queue. Then
	// results, likewise.
	var ids []string
	for i, o := range out {
		if o.err == nil && o.created && i != 0 {
			ids = append(ids, o.job.ID)
		}
	}
	for _, step := range []struct {
		kind  string
		calls func() int
		do    func(id string) error
	}{
		{"start", func() int { return db.groups.jobRows.Calls() }, func(id string) error {
			j, started, err := db.JobStart(ctx, id, "")
			if err == nil && (!started || j.Status != JobRunning || j.ID != id) {
				err = fmt.Errorf("started=%v %+v", started, j)
			}
			return err
		}},
		{"complete", func() int { return db.groups.complete.Calls() }, func(id string) error {
			res, err := db.JobComplete(ctx, &JobCompleteParams{ID: id, Day: "2026-03-01", Cost: 7, PromptTokens: 3})
			if err == nil && (!res.Completed || !res.Charged) {
				err = fmt.Errorf("%+v", res)
			}
			return err
		}},
	} {
		before := step.calls()
		release := holdRow(t, db, "jobs", ids[0])
		errs := make([]error, len(ids))
		firstDone := make(chan error, 1)
		go func() { firstDone <- step.do(ids[0]) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return step.calls() == before+1 })
		var wg sync.WaitGroup
		for i := 1; i < len(ids); i++ {
			wg.Go(func() { errs[i] = step.do(ids[i]) })
		}
		queued := func() int {
			if step.kind == "start" {
				return db.groups.jobRows.Queued("start")
			}
			return db.groups.complete.Queued(struct{}{})
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return queued() == len(ids)-1 })
		release()
		wg.Wait()
		errs[0] = <-firstDone
		if c := step.calls() - before; c != 2 {
			t.Errorf("%d %ss in %d calls, want 2", len(ids), step.kind, c)
		}
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s %d: %v", step.kind, i, err)
			}
		}
	}
	for _, id := range ids {
		j, err := db.JobGetByID(ctx, id)
		if err != nil || j.Status != JobSucceeded || j.Cost != 7 || j.PromptTokens != 3 {
			t.Fatalf("job %s after the groups: %+v, %v", id, j, err)
		}
	}
	if _, err := db.JobComplete(context.Background(), &JobCompleteParams{ID: "job_missing", Day: "2026-03-01"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a missing job completed: %v", err)
	}
}

// A cancel committed while JobComplete waits for the job's row (it began
// before the cancel committed, so its snapshot shows the job running): the
// job stays cancelled, is charged once, and shows what it was charged.
func TestJobCompleteAfterACancelItWaitedFor(t *testing.T) {
	t.Parallel()
	db := openURL(t, postgresURL(t))
	ctx := t.Context()
	ten := mkTenant(t, db)
	j := mkJob(t, db, jobParams(ten.ID))
	if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
		t.Fatal(err)
	}
	cancel, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cancel.Rollback(context.Background()) }()
	var pid int
	if err := cancel.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := cancel.Exec(ctx, `UPDATE jobs SET status = 'cancelled', finished_at = now(), updated_at = now() WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res *JobCompleteResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01", Cost: 1234, PromptTokens: 12, CompletionTokens: 30})
		done <- outcome{res, err}
	}()
	testutil.Eventually(t, 10*time.Second, func() bool {
		var waiting int
		err := db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, pid).Scan(&waiting)
		return err == nil && waiting == 1
	})
	if err := cancel.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil || o.res.Completed || !o.res.Charged {
		t.Fatalf("JobComplete after the cancel it waited for = %+v, %v", o.res, o.err)
	}
	got, err := db.JobGetByID(ctx, j.ID)
	if err != nil || got.Status != JobCancelled || got.Cost != 1234 || got.TotalTokens != 42 || got.ResponseStatus != 0 {
		t.Fatalf("job = %+v, %v; want cancelled, costing 1234 for 42 tokens", got, err)
	}
	if sum, err := db.UsageSumByTenantDay(ctx, ten.ID, "2026-03-01"); err != nil || sum != 1234 {
		t.Fatalf("spend = %d, %v; want 1234", sum, err)
	}
}
