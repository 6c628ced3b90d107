package store

import (
	"encoding/json"
	"testing"
	"time"
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
