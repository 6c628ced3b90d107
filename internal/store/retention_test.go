package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/money"
)

// JobPurgeBodies on both backends: a finished job past the cut-off loses
// its request and response and keeps its usage; a running one and a later
// one keep everything; the count says what a purge would take.
func TestJobPurgeBodies(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openURL(t, url)
			ten := mkTenant(t, db)
			done, running := mkJob(t, db, jobParams(ten.ID)), mkJob(t, db, jobParams(ten.ID))
			if _, _, err := db.JobStart(ctx, running.ID, ""); err != nil {
				t.Fatal(err)
			}
			if _, _, err := db.JobStart(ctx, done.ID, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: done.ID, Day: "2026-12-01", ResponseBody: json.RawMessage(`{"choices":[]}`),
				PromptTokens: 7, CompletionTokens: 3, Cost: 5}); err != nil {
				t.Fatal(err)
			}
			if n, err := db.JobCountPurgeable(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
				t.Fatalf("purgeable before the cut-off passed = %d, %v; want 0", n, err)
			}
			before := time.Now().Add(time.Hour)
			if n, err := db.JobCountPurgeable(ctx, before); err != nil || n != 1 {
				t.Fatalf("purgeable = %d, %v; want 1", n, err)
			}
			if n, err := db.JobPurgeBodies(ctx, before, 10); err != nil || n != 1 {
				t.Fatalf("JobPurgeBodies = %d, %v; want 1", n, err)
			}
			j, err := db.JobGetByID(ctx, done.ID)
			if err != nil || len(j.ResponseBody) != 0 || string(j.Request) != "{}" || j.PromptTokens != 7 || j.Cost != 5 {
				t.Fatalf("purged job: request %s, response %s, usage %d, cost %d, %v", j.Request, j.ResponseBody, j.PromptTokens, j.Cost, err)
			}
			if r, err := db.JobGetByID(ctx, running.ID); err != nil || string(r.Request) == "{}" {
				t.Fatalf("the running job was purged: %s, %v", r.Request, err)
			}
			if n, err := db.JobPurgeBodies(ctx, before, 10); err != nil || n != 0 {
				t.Fatalf("a second purge = %d, %v; want 0", n, err)
			}
			if _, err := db.JobPurgeBodies(ctx, before, 0); err == nil {
				t.Fatal("a limit of 0 was taken")
			}
		})
	}
}

// UsageRollUp on both backends: old ledger rows fold into daily totals and
// go, in batches; the budget's sums and the usage report read the same
// before, between and after; a job whose row was folded is never charged
// again; a cut-off younger than LedgerDetailMinAge is refused.
func TestUsageRollUp(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openURL(t, url)
			ten := mkTenant(t, db)
			now := time.Now().UTC().Truncate(time.Second)
			old := now.Add(-5 * 24 * time.Hour)
			type charge struct {
				at             time.Time
				day, globalDay string
				model          string
				cost           int64
			}
			charges := []charge{
				{old, "2026-11-28", "2026-11-28", "gpt-4o-mini", 5},
				{old, "2026-11-28", "2026-11-28", "gpt-4o-mini", 7},
				{old, "2026-11-28", "2026-11-29", "gpt-4o-mini", 11}, // a budget day across UTC midnight
				{old, "2026-11-28", "2026-11-28", "gpt-4o", 13},
				{old.Add(time.Minute), "2026-11-29", "2026-11-29", "gpt-4o", 17},
				{now, "2026-11-28", "2026-11-28", "gpt-4o", 19}, // recent: stays in the ledger
			}
			var ids []string
			for _, c := range charges {
				p := jobParams(ten.ID)
				p.Model = c.model
				j := mkJob(t, db, p)
				if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
					t.Fatal(err)
				}
				db.now = func() time.Time { return c.at }
				if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: c.day, GlobalDay: c.globalDay,
					PromptTokens: 10, CompletionTokens: 2, CachedTokens: 1, Cost: money.Micros(c.cost)}); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, j.ID)
			}
			db.now = func() time.Time { return now }

			type view struct {
				tenant28, tenant29, global28, global29 money.Micros
				report28                               string
			}
			read := func() view {
				t.Helper()
				var v view
				var err error
				for _, s := range []struct {
					to  *money.Micros
					sum func() (money.Micros, error)
				}{
					{&v.tenant28, func() (money.Micros, error) { return db.UsageSumByTenantDay(ctx, ten.ID, "2026-11-28") }},
					{&v.tenant29, func() (money.Micros, error) { return db.UsageSumByTenantDay(ctx, ten.ID, "2026-11-29") }},
					{&v.global28, func() (money.Micros, error) { return db.UsageSumByDay(ctx, "2026-11-28") }},
					{&v.global29, func() (money.Micros, error) { return db.UsageSumByDay(ctx, "2026-11-29") }},
				} {
					if *s.to, err = s.sum(); err != nil {
						t.Fatal(err)
					}
				}
				rows, err := db.UsageReport(ctx, &UsageReportParams{Day: "2026-11-28", TenantID: ten.ID})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rows {
					v.report28 += fmt.Sprintf("%s: %d requests, %d/%d/%d tokens, %d; ", r.Model, r.Requests, r.PromptTokens, r.CompletionTokens, r.CachedTokens, r.Cost)
				}
				return v
			}
			want := view{tenant28: 5 + 7 + 11 + 13 + 19, tenant29: 17, global28: 5 + 7 + 13 + 19, global29: 11 + 17,
				report28: "gpt-4o: 2 requests, 20/4/2 tokens, 32; gpt-4o-mini: 3 requests, 30/6/3 tokens, 23; "}
			if got := read(); got != want {
				t.Fatalf("before the rollup: %+v, want %+v", got, want)
			}

			cutoff := now.Add(-LedgerDetailMinAge)
			if _, err := db.UsageRollUp(ctx, now.Add(-time.Hour), 10); err == nil {
				t.Fatal("a cut-off an hour ago was taken")
			}
			if _, err := db.UsageRollUp(ctx, cutoff, 0); err == nil {
				t.Fatal("a limit of 0 was taken")
			}
			if n, err := db.UsageCountRollable(ctx, cutoff); err != nil || n != 5 {
				t.Fatalf("rollable = %d, %v; want 5", n, err)
			}
			for i, wantN := range []int64{2, 2, 1, 0} {
				n, err := db.UsageRollUp(ctx, cutoff, 2)
				if err != nil || n != wantN {
					t.Fatalf("rollup %d = %d, %v; want %d", i, n, err, wantN)
				}
				if got := read(); got != want {
					t.Fatalf("after rollup %d: %+v, want %+v", i, got, want)
				}
			}
			if n, err := db.UsageCountRollable(ctx, cutoff); err != nil || n != 0 {
				t.Fatalf("rollable after = %d, %v; want 0", n, err)
			}
			if _, err := db.UsageGetByJob(ctx, ids[0]); !errors.Is(err, ErrNotFound) {
				t.Fatalf("a folded row: %v, want ErrNotFound", err)
			}
			if e, err := db.UsageGetByJob(ctx, ids[5]); err != nil || e.Cost != 19 {
				t.Fatalf("the recent row: %+v, %v", e, err)
			}
			// A late delivery of a folded job stores nothing and charges nothing.
			res, err := db.JobComplete(ctx, &JobCompleteParams{ID: ids[0], Day: "2026-11-28", Cost: 1000})
			if err != nil || res.Completed || res.Charged {
				t.Fatalf("a late JobComplete of a folded job = %+v, %v; want neither completed nor charged", res, err)
			}
			if got := read(); got != want {
				t.Fatalf("after a late JobComplete: %+v, want %+v", got, want)
			}
			// Going below the daily totals' migration would lose their spend.
			for {
				have, _, err := db.SchemaVersion(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if have <= 15 {
					break
				}
				if _, err := db.MigrateDown(ctx); err != nil {
					t.Fatal(err)
				}
			}
			const version = 15
			if _, err := db.MigrateDown(ctx); err == nil || !strings.Contains(err.Error(), "usage_daily") {
				t.Fatalf("MigrateDown with rolled-up spend = %v, want refused", err)
			}
			if have, _, err := db.SchemaVersion(ctx); err != nil || have != version {
				t.Fatalf("schema at %d after a refused down (%v), want %d", have, err, version)
			}
		})
	}
}

// Rollups running at once (two dispatchers) on Postgres fold each row once.
func TestUsageRollUpConcurrently(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openURL(t, postgresURL(t))
	ten := mkTenant(t, db)
	now := time.Now().UTC()
	const jobs = 300
	var total money.Micros
	db.now = func() time.Time { return now.Add(-4 * 24 * time.Hour) }
	for i := range jobs {
		p := jobParams(ten.ID)
		p.Model = []string{"gpt-4o", "gpt-4o-mini", "o3"}[i%3]
		j := mkJob(t, db, p)
		if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
			t.Fatal(err)
		}
		cost := money.Micros(100 + i)
		total += cost
		if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-11-30", Cost: cost, PromptTokens: 1}); err != nil {
			t.Fatal(err)
		}
	}
	db.now = func() time.Time { return now }
	var folded atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				n, err := db.UsageRollUp(ctx, now.Add(-LedgerDetailMinAge), 7)
				if err != nil {
					t.Error(err)
					return
				}
				folded.Add(n)
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if folded.Load() != jobs {
		t.Fatalf("folded %d rows, want %d", folded.Load(), jobs)
	}
	if sum, err := db.UsageSumByTenantDay(ctx, ten.ID, "2026-11-30"); err != nil || sum != total {
		t.Fatalf("spend after = %d, %v; want %d", sum, err, total)
	}
	rows, err := db.UsageReport(ctx, &UsageReportParams{Day: "2026-11-30"})
	if err != nil || len(rows) != 3 {
		t.Fatalf("report = %d rows, %v; want 3", len(rows), err)
	}
	for _, r := range rows {
		if r.Requests != jobs/3 || r.PromptTokens != jobs/3 {
			t.Fatalf("report row %+v: want %d requests", r, jobs/3)
		}
	}
}
