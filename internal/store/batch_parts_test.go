package store

import (
	"errors"
	"testing"
	"time"
)

// Batch parts on both backends: a part takes only queued jobs of its batch
// in no part (else nothing is stored), saves compare the state, the parts
// due and the tokens in flight read back, and a job in a part is the
// part's: a batch's cancel and the reconciler's list leave it, until it
// leaves the part.
func TestBatchParts(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openURL(t, url)
			ten := mkTenant(t, db)
			b := mkBatch(t, db, ten.ID)
			var jobs []string
			for i := range 5 {
				p := jobParams(ten.ID)
				p.BatchID, p.LineNo = b.ID, i+1
				jobs = append(jobs, mkJob(t, db, p).ID)
			}
			other := mkJob(t, db, jobParams(ten.ID)) // in no batch
			part := &BatchPart{BatchID: b.ID, TenantID: ten.ID, Model: "gpt-4o-mini", Deployment: "sim/gpt-4o-mini",
				Endpoint: "/v1/chat/completions", Bytes: 500, Tokens: 50, Reserved: 1234}
			if err := db.BatchPartInsert(ctx, part, append(jobs[:3:3], other.ID)); !errors.Is(err, ErrConflict) {
				t.Fatalf("a part with a job of no batch: %v, want ErrConflict", err)
			}
			if ps, _ := db.BatchPartListByBatch(ctx, b.ID); len(ps) != 0 {
				t.Fatalf("a refused part was stored: %d", len(ps))
			}
			part.ID = ""
			if err := db.BatchPartInsert(ctx, part, jobs[:3]); err != nil {
				t.Fatal(err)
			}
			got, err := db.BatchPartGet(ctx, part.ID)
			if err != nil || got.State != PartPending || got.Lines != 3 || got.Reserved != 1234 || got.Tokens != 50 {
				t.Fatalf("stored part = %+v, %v", got, err)
			}
			if err := db.BatchPartInsert(ctx, &BatchPart{BatchID: b.ID, TenantID: ten.ID, Model: "m", Deployment: "d"}, jobs[2:4]); !errors.Is(err, ErrConflict) {
				t.Fatalf("a job in two parts: %v", err)
			}

			// The jobs in the part are its own.
			if n, err := db.JobCancelByBatch(ctx, b.ID); err != nil || n != 2 {
				t.Fatalf("JobCancelByBatch = %d, %v; want the 2 jobs in no part", n, err)
			}
			un, _, err := db.JobListUnfinished(ctx, &JobListUnfinishedParams{SkipOffloaded: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range un {
				if j.BatchPartID != "" {
					t.Fatalf("the reconciler's list holds %s of a part", j.ID)
				}
			}
			var streamed []string
			if err := db.JobStreamByPart(ctx, part.ID, func(j *Job) error { streamed = append(streamed, j.ID); return nil }); err != nil || len(streamed) != 3 {
				t.Fatalf("JobStreamByPart = %v, %v", streamed, err)
			}

			// Saves compare the state; the due list and the tokens in flight follow it.
			now := time.Now()
			got.State, got.ProviderFileID, got.NextCheckAt = PartUploading, "file-x", now.Add(time.Hour)
			if ok, err := db.BatchPartSave(ctx, got, PartPending); err != nil || !ok {
				t.Fatalf("save = %v, %v", ok, err)
			}
			if ok, err := db.BatchPartSave(ctx, got, PartPending); err != nil || ok {
				t.Fatalf("a save from a state it left = %v, %v", ok, err)
			}
			if due, err := db.BatchPartListDue(ctx, now, 10); err != nil || len(due) != 0 {
				t.Fatalf("due before its check = %d, %v", len(due), err)
			}
			if due, err := db.BatchPartListDue(ctx, now.Add(2*time.Hour), 10); err != nil || len(due) != 1 || due[0].ProviderFileID != "file-x" {
				t.Fatalf("due after its check = %v, %v", due, err)
			}
			if n, err := db.BatchPartTokensInFlight(ctx, "sim/gpt-4o-mini"); err != nil || n != 50 {
				t.Fatalf("tokens in flight = %d, %v", n, err)
			}

			// A job leaves the part (back to llmq's path) only while pending.
			if _, _, err := db.JobStart(ctx, jobs[0], ""); err != nil {
				t.Fatal(err)
			}
			left, err := db.JobLeavePart(ctx, part.ID, jobs[:3])
			if err != nil || len(left) != 2 {
				t.Fatalf("JobLeavePart = %v, %v; want the 2 pending jobs", left, err)
			}
			if j, _ := db.JobGetByID(ctx, jobs[1]); j.BatchPartID != "" {
				t.Fatalf("job %s still in part %s", j.ID, j.BatchPartID)
			}
		})
	}
}
