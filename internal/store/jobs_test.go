package store

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestJobErrorJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(&JobError{Message: "m", Type: "invalid_request_error"})
	if err != nil || string(b) != `{"message":"m","type":"invalid_request_error","code":null,"param":null}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	b, _ = json.Marshal(JobError{Message: "m", Type: "t", Code: "c", Param: "p"})
	var back JobError
	if err := json.Unmarshal(b, &back); err != nil || back != (JobError{Message: "m", Type: "t", Code: "c", Param: "p"}) {
		t.Fatalf("round trip of %s = %+v, %v", b, back, err)
	}
}

func TestWithoutNUL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"a":"x"}`:               `{"a":"x"}`,
		`{"a":"\u0000"}`:          `{"a":"\ufffd"}`,
		`{"a":"\\u0000"}`:         `{"a":"\\u0000"}`, // an escaped backslash, then text
		`{"a":"\\\u0000\u00001"}`: `{"a":"\\\ufffd\ufffd1"}`,
		`{"a":"\u00001"}`:         `{"a":"\ufffd1"}`,
	} {
		if got := string(withoutNUL([]byte(in))); got != want {
			t.Errorf("withoutNUL(%s) = %s, want %s", in, got, want)
		}
	}
}

// scanJob reads every column of a job row on both drivers: a row with every
// column set, and one with every nullable column NULL. The tenant's view
// reads the same row less its request.
func TestJobRowReadsEveryColumn(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"postgres": postgresURL(t), "sqlite": sqliteURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := openURL(t, url)
			ctx := t.Context()
			ten := mkTenant(t, db)
			b := mkBatch(t, db, ten.ID)
			at := time.Date(2026, 12, 3, 7, 8, 9, 123456000, time.UTC)
			ts := func(d time.Duration) any { return db.d.ts(at.Add(d)) }
			// JSON as jsonb prints it, so that both backends return the text stored.
			_, err := db.rw.exec(ctx, `
				INSERT INTO jobs (id, tenant_id, batch_id, line_no, custom_id, endpoint, model, request, queue, status,
					attempts, rate_limited, est_prompt_tokens, est_max_tokens, est_cost_micros,
					response_status, response_body, provider_request_id, error,
					prompt_tokens, completion_tokens, cached_tokens, total_tokens, cost_micros,
					webhook_url, metadata, idempotency_key, created_at, started_at, finished_at, updated_at, next_run_at,
					sync, usage_estimated)
				VALUES ('job_full', $1, $2, 7, 'c-7', '/v1/chat/completions', 'gpt-4o-mini', '{"n": 1, "model": "m"}', 'low', 'failed',
					3, 2, -5, 4096, 123456789012,
					429, '{"id": "x", "usage": {"total_tokens": 9}}', 'req_1', '{"message":"slow down","type":"rate_limit","code":"rate_limited","param":null}',
					11, 22, 33, 44, 987654321,
					'https://example.com/hook', '{"k": "v"}', 'idem-1', $3, $4, $5, $6, $7, TRUE, TRUE),
				('job_null', $1, NULL, NULL, NULL, '/v1/embeddings', 'm', '{}', 'default', 'queued',
					0, 0, 0, 0, 0, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, NULL, $3, NULL, NULL, $3, NULL, FALSE, FALSE)`,
				ten.ID, b.ID, ts(0), ts(time.Second), ts(2*time.Second), ts(3*time.Second), ts(-24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			tp := func(d time.Duration) *time.Time { t := at.Add(d); return &t }
			want := map[string]*Job{
				"job_full": {ID: "job_full", TenantID: ten.ID, BatchID: b.ID, LineNo: 7, CustomID: "c-7",
					Endpoint: "/v1/chat/completions", Model: "gpt-4o-mini", Request: json.RawMessage(`{"n": 1, "model": "m"}`),
					Queue: "low", Status: JobFailed, Attempts: 3, RateLimited: 2, EstPromptTokens: -5, EstMaxTokens: 4096,
					EstCost: 123456789012, ResponseStatus: 429, ResponseBody: json.RawMessage(`{"id": "x", "usage": {"total_tokens": 9}}`),
					ProviderRequestID: "req_1", Error: &JobError{Message: "slow down", Type: "rate_limit", Code: "rate_limited"},
					PromptTokens: 11, CompletionTokens: 22, CachedTokens: 33, TotalTokens: 44, Cost: 987654321,
					WebhookURL: "https://example.com/hook", Metadata: json.RawMessage(`{"k": "v"}`), IdempotencyKey: "idem-1",
					CreatedAt: at, StartedAt: tp(time.Second), FinishedAt: tp(2 * time.Second), UpdatedAt: at.Add(3 * time.Second),
					NextRunAt: tp(-24 * time.Hour), Sync: true, UsageEstimated: true},
				"job_null": {ID: "job_null", TenantID: ten.ID, Endpoint: "/v1/embeddings", Model: "m", Request: json.RawMessage(`{}`),
					Queue: "default", Status: JobQueued, CreatedAt: at, UpdatedAt: at},
			}
			for id, w := range want {
				got, err := db.JobGetByID(ctx, id)
				if err != nil || !reflect.DeepEqual(got, w) {
					t.Errorf("JobGetByID(%s) = %+v, %v\nwant %+v", id, got, err, w)
				}
				view := *w
				view.Request = nil
				got, err = db.JobGetForTenant(ctx, ten.ID, id)
				if err != nil || !reflect.DeepEqual(got, &view) {
					t.Errorf("JobGetForTenant(%s) = %+v, %v\nwant %+v", id, got, err, &view)
				}
			}
		})
	}
}
