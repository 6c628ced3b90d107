package store

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// Migration 006 records when webhook deliveries ended. What finished before
// it was delivered by the version before: its backfill marks those done, so
// the reconciler does not send them all again; what finishes after it is
// pending until delivered. Its Down section undoes it cleanly.
func TestWebhookDoneMigrationBackfills(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openURL(t, url)
			ten := mkTenant(t, db)
			hooked := func() *Job {
				p := jobParams(ten.ID)
				p.WebhookURL = "https://example.com/hook"
				return mkJob(t, db, p)
			}
			before, unfinished := hooked(), hooked()
			if _, _, err := db.JobFail(ctx, &JobFailParams{ID: before.ID, Error: JobError{Message: "x"}}); err != nil {
				t.Fatal(err)
			}

			// Back to the schema before 006, then forward again: the
			// failed job stands for one finished under the version before.
			remigrate(t, db, 5)
			pending := func() []string {
				t.Helper()
				refs, _, err := db.WebhookListPending(context.Background(), &WebhookListPendingParams{Kind: WebhookJob,
					FinishedBefore: time.Now().Add(time.Hour)})
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, r := range refs {
					ids = append(ids, r.ID)
				}
				return ids
			}
			if got := pending(); len(got) != 0 {
				t.Fatalf("after the migration %v are pending; want the job finished before it marked done", got)
			}
			if _, _, err := db.JobFail(ctx, &JobFailParams{ID: unfinished.ID, Error: JobError{Message: "x"}}); err != nil {
				t.Fatal(err)
			}
			if got := pending(); len(got) != 1 || got[0] != unfinished.ID {
				t.Fatalf("a job finished after the migration: pending %v, want [%s]", got, unfinished.ID)
			}
		})
	}
}

// Migration 007 makes keys exempt on their own: keys made before it are not,
// and its Down section removes the column cleanly.
func TestKeyExemptMigration(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openURL(t, url)
			ten := mkTenant(t, db) // with today's columns, kept going down
			p, done, err := db.migrator()
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = done() }()
			if _, err := p.DownTo(ctx, 6); err != nil {
				t.Fatalf("down to 6: %v", err)
			}
			// A key as the version before 007 stored it.
			if _, err := db.rw.exec(ctx, `INSERT INTO api_keys (id, tenant_id, prefix, hash, created_at) VALUES ($1, $2, $3, $4, $5)`,
				"key_old", ten.ID, "llmq_old", make([]byte, 32), db.d.ts(db.nowUTC())); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Up(ctx); err != nil {
				t.Fatalf("up: %v", err)
			}
			keys, err := db.APIKeyListByTenant(ctx, ten.ID)
			if err != nil || len(keys) != 1 || keys[0].APIExempt {
				t.Fatalf("the key made before 007 = %+v, %v; want it not exempt", keys, err)
			}
			if exempt, _, err := db.APIKeyListExempt(ctx, &APIKeyListExemptParams{}); err != nil || len(exempt) != 0 {
				t.Fatalf("exempt keys = %v, %v", exempt, err)
			}
		})
	}
}

// Migration 017 records the stored responses llmq relayed before it, from
// their jobs, so a follow-up of one still reaches it: the response and its
// output items, as its tenant's, on the deployment that answered; not a
// response stored with store: false, nor another endpoint's answer.
func TestStoredResponsesMigrationBackfills(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openURL(t, url)
			ten := mkTenant(t, db)
			answered := func(request, response string) {
				p := jobParams(ten.ID)
				p.Endpoint, p.Request = "/v1/responses", json.RawMessage(request)
				j := mkJob(t, db, p)
				if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
					t.Fatal(err)
				}
				if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-12-07", ResponseBody: json.RawMessage(response),
					PromptTokens: 120, CompletionTokens: 30, Cost: 1, Deployment: "openai/gpt-4o"}); err != nil {
					t.Fatal(err)
				}
			}
			answered(`{"model":"gpt-4o","input":"hi"}`,
				`{"id":"resp_kept","object":"response","output":[{"id":"rs_1","type":"reasoning"},{"id":"msg_1","type":"message"}]}`)
			answered(`{"model":"gpt-4o","input":"hi","store":false}`, `{"id":"resp_unstored","object":"response","output":[{"id":"msg_2","type":"message"}]}`)
			answered(`{"model":"gpt-4o","input":"hi"}`, `{"id":"chatcmpl-1","object":"chat.completion"}`)

			remigrate(t, db, 16)
			got, err := db.StoredResponseGet(ctx, []string{"resp_kept", "rs_1", "msg_1", "resp_unstored", "msg_2", "chatcmpl-1"})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 3 || got["resp_kept"].Tokens != 150 || got["msg_1"].Tokens != 30 || got["msg_1"].ResponseID != "resp_kept" ||
				got["rs_1"].TenantID != ten.ID || got["resp_kept"].Deployment != "openai/gpt-4o" {
				t.Fatalf("backfilled %v", got)
			}
		})
	}
}

// remigrate takes db's schema back to version, then up again: what is in
// the tables stands for what the versions before wrote.
func remigrate(t *testing.T, db *DB, version int64) {
	t.Helper()
	p, done, err := db.migrator()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = done() }()
	if _, err := p.DownTo(t.Context(), version); err != nil {
		t.Fatalf("down to %d: %v", version, err)
	}
	if _, err := p.Up(t.Context()); err != nil {
		t.Fatalf("up: %v", err)
	}
}
