package store

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/llmq/llmq/internal/money"
)

// runConformance runs every behaviour the store promises against the
// databases open returns (a fresh, migrated, empty one per call), so both
// backends are held to one contract.
func runConformance(t *testing.T, open func(t *testing.T) *DB) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, db *DB)
	}{
		{"Tenants", testTenants},
		{"WorkerLease", testWorkerLease},
		{"TenantListPages", testTenantListPages},
		{"APIKeys", testAPIKeys},
		{"APIKeyExempt", testAPIKeyExempt},
		{"JobInsertRoundTrip", testJobInsertRoundTrip},
		{"JobInsertIdempotent", testJobInsertIdempotent},
		{"JobInsertIdempotentConcurrent", testJobInsertIdempotentConcurrent},
		{"JobTransitions", testJobTransitions},
		{"TerminalIsFinal", testTerminalIsFinal},
		{"JobCounters", testJobCounters},
		{"JobCompleteChargesOnceConcurrently", testJobCompleteChargesOnce},
		{"JobCompleteAfterCancelStillCharges", testJobCompleteAfterCancel},
		{"JobCompleteRacesCancel", testJobCompleteRacesCancel},
		{"JobCompleteWithNUL", testJobCompleteWithNUL},
		{"JobCompleteMany", testJobCompleteMany},
		{"CrossTenantIsolation", testCrossTenant},
		{"JobListPages", testJobListPages},
		{"JobListUnfinished", testJobListUnfinished},
		{"JobCancelByBatch", testJobCancelByBatch},
		{"JobInsertManyAndStream", testJobInsertManyAndStream},
		{"Files", testFiles},
		{"FileFailedReadStoresNothing", testFileFailedRead},
		{"Batches", testBatches},
		{"BatchRefusedLinesAndGeneratedFiles", testBatchRefusedLines},
		{"Usage", testUsage},
		{"UsageDayRows", testUsageDayRows},
		{"TryLock", testTryLock},
		{"TimesAreUTC", testTimesAreUTC},
		{"WebhooksPendingUntilDone", testWebhooksPending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// --- fixtures ---

func mkTenant(t testing.TB, db *DB) *Tenant {
	t.Helper()
	ten, err := db.TenantInsert(t.Context(), &TenantInsertParams{Name: "acme", Tier: "standard"})
	if err != nil {
		t.Fatalf("TenantInsert: %v", err)
	}
	return ten
}

func jobParams(tenantID string) *JobInsertParams {
	return &JobInsertParams{
		TenantID:        tenantID,
		Endpoint:        "/v1/chat/completions",
		Model:           "gpt-4o-mini",
		Request:         json.RawMessage(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`),
		Queue:           "default",
		EstPromptTokens: 10,
		EstMaxTokens:    100,
		EstCost:         61,
	}
}

func mkJob(t testing.TB, db *DB, p *JobInsertParams) *Job {
	t.Helper()
	j, created, err := db.JobInsert(t.Context(), p)
	if err != nil || !created {
		t.Fatalf("JobInsert: created=%v err=%v", created, err)
	}
	return j
}

func mkFile(t testing.TB, db *DB, tenantID string, content string) *File {
	t.Helper()
	f, err := db.FileInsert(t.Context(), &FileInsertParams{TenantID: tenantID, Purpose: FilePurposeBatch,
		Filename: "in.jsonl", Content: bytes.NewReader([]byte(content))})
	if err != nil {
		t.Fatalf("FileInsert: %v", err)
	}
	return f
}

func mkBatch(t testing.TB, db *DB, tenantID string) *Batch {
	t.Helper()
	f := mkFile(t, db, tenantID, "{}\n")
	b, err := db.BatchInsert(t.Context(), &BatchInsertParams{TenantID: tenantID, InputFileID: f.ID,
		Endpoint: "/v1/chat/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatalf("BatchInsert: %v", err)
	}
	return b
}

func setStatus(t *testing.T, db *DB, id string, from []JobStatus, to JobStatus) *Job {
	t.Helper()
	j, applied, err := db.JobSetStatus(t.Context(), &JobSetStatusParams{ID: id, From: from, To: to})
	if err != nil || !applied {
		t.Fatalf("JobSetStatus %s -> %s: applied=%v err=%v", id, to, applied, err)
	}
	return j
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want %v", err, target)
	}
}

func jsonEqual(t *testing.T, got, want json.RawMessage) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("stored JSON %q does not parse: %v", got, err)
	}
	_ = json.Unmarshal(want, &w)
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("JSON = %s, want %s", got, want)
	}
}

// --- tenants and keys ---

func testTenants(t *testing.T, db *DB) {
	ctx := t.Context()
	budget := money.Micros(5_000_000)
	ten, err := db.TenantInsert(ctx, &TenantInsertParams{Name: "acme", Tier: "pro", BudgetOverride: &budget, APIExempt: true})
	if err != nil {
		t.Fatal(err)
	}
	if !ten.APIExempt || ten.BudgetOverride == nil || *ten.BudgetOverride != budget || len(ten.WebhookSecret) < 40 {
		t.Fatalf("inserted tenant = %+v", ten)
	}
	got, err := db.TenantGetByID(ctx, ten.ID)
	if err != nil || !reflect.DeepEqual(got, ten) {
		t.Fatalf("TenantGetByID = %+v, %v; want %+v", got, err, ten)
	}
	other := mkTenant(t, db)
	if other.WebhookSecret == ten.WebhookSecret {
		t.Fatal("two tenants share a webhook secret")
	}
	_, err = db.TenantGetByID(ctx, "ten_missing")
	wantErr(t, err, ErrNotFound)

	tier, exempt := "enterprise", false
	up, err := db.TenantUpdate(ctx, &TenantUpdateParams{ID: ten.ID, Tier: &tier, APIExempt: &exempt})
	if err != nil || up.Tier != tier || up.APIExempt || up.BudgetOverride == nil || up.Name != "acme" {
		t.Fatalf("TenantUpdate tier = %+v, %v", up, err)
	}
	up, err = db.TenantUpdate(ctx, &TenantUpdateParams{ID: ten.ID, SetBudgetOverride: true})
	if err != nil || up.BudgetOverride != nil || up.Tier != tier {
		t.Fatalf("TenantUpdate clearing the budget = %+v, %v", up, err)
	}
	nb := money.Micros(7)
	up, err = db.TenantUpdate(ctx, &TenantUpdateParams{ID: ten.ID, SetBudgetOverride: true, BudgetOverride: &nb})
	if err != nil || up.BudgetOverride == nil || *up.BudgetOverride != 7 {
		t.Fatalf("TenantUpdate setting the budget = %+v, %v", up, err)
	}
	if up.UpdatedAt.Before(ten.UpdatedAt) || !up.CreatedAt.Equal(ten.CreatedAt) {
		t.Fatalf("timestamps after update: %+v", up)
	}
	_, err = db.TenantUpdate(ctx, &TenantUpdateParams{ID: "ten_missing", Tier: &tier})
	wantErr(t, err, ErrNotFound)
	if _, err := db.TenantInsert(ctx, &TenantInsertParams{Name: "x"}); err == nil {
		t.Fatal("TenantInsert without a tier succeeded")
	}
	_, err = db.TenantInsert(ctx, &TenantInsertParams{ID: ten.ID, Name: "dup", Tier: "t"})
	wantErr(t, err, ErrConflict)
}

// checkPages walks a list with page size 'size' and checks it returns want
// exactly, in order, with hasMore true on every page but the last.
func checkPages[T any](t *testing.T, want []string, size int, page func(after string, limit int) ([]*T, bool, error), id func(*T) string) {
	t.Helper()
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > len(want)+1 {
			t.Fatal("pagination does not end")
		}
		rows, more, err := page(after, size)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			got = append(got, id(r))
		}
		if more != (len(got) < len(want)) {
			t.Fatalf("after %d rows hasMore = %v (of %d)", len(got), more, len(want))
		}
		if !more {
			break
		}
		if len(rows) != size {
			t.Fatalf("a page with more after it has %d rows, want %d", len(rows), size)
		}
		after = id(rows[len(rows)-1])
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("paged ids = %v\nwant %v", got, want)
	}
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

func testTenantListPages(t *testing.T, db *DB) {
	var ids []string
	for i := 0; i < 7; i++ {
		ids = append(ids, mkTenant(t, db).ID)
	}
	want := reversed(sortedCopy(ids))
	for _, size := range []int{1, 3, 7, 10} {
		checkPages(t, want, size, func(after string, limit int) ([]*Tenant, bool, error) {
			return db.TenantList(t.Context(), &TenantListParams{After: after, Limit: limit})
		}, func(x *Tenant) string { return x.ID })
	}
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func testAPIKeys(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	h := sha256.Sum256([]byte("llmq-secret-key-1"))
	k, err := db.APIKeyInsert(ctx, &APIKeyInsertParams{TenantID: ten.ID, Prefix: "llmq-secret-", Hash: h[:]})
	if err != nil {
		t.Fatal(err)
	}
	gk, gt, err := db.APIKeyGetByHash(ctx, h[:])
	if err != nil || gk.ID != k.ID || gt.ID != ten.ID || gt.WebhookSecret != ten.WebhookSecret || !bytes.Equal(gk.Hash, h[:]) {
		t.Fatalf("APIKeyGetByHash = %+v, %+v, %v", gk, gt, err)
	}
	_, err = db.APIKeyInsert(ctx, &APIKeyInsertParams{TenantID: ten.ID, Prefix: "x", Hash: h[:]})
	wantErr(t, err, ErrConflict)
	h2 := sha256.Sum256([]byte("llmq-secret-key-2"))
	_, err = db.APIKeyInsert(ctx, &APIKeyInsertParams{TenantID: "ten_missing", Prefix: "x", Hash: h2[:]})
	wantErr(t, err, ErrNotFound)
	if _, err := db.APIKeyInsert(ctx, &APIKeyInsertParams{TenantID: ten.ID, Prefix: "x", Hash: []byte("short")}); err == nil {
		t.Fatal("a 5-byte hash was accepted")
	}
	k2, err := db.APIKeyInsert(ctx, &APIKeyInsertParams{TenantID: ten.ID, Prefix: "y", Hash: h2[:]})
	if err != nil {
		t.Fatal(err)
	}
	rk, err := db.APIKeyRevoke(ctx, k.ID)
	if err != nil || rk.RevokedAt == nil {
		t.Fatalf("APIKeyRevoke = %+v, %v", rk, err)
	}
	again, err := db.APIKeyRevoke(ctx, k.ID)
	if err != nil || !again.RevokedAt.Equal(*rk.RevokedAt) {
		t.Fatalf("second revoke changed revoked_at: %v -> %v (%v)", rk.RevokedAt, again.RevokedAt, err)
	}
	_, _, err = db.APIKeyGetByHash(ctx, h[:])
	wantErr(t, err, ErrNotFound)
	if _, _, err := db.APIKeyGetByHash(ctx, h2[:]); err != nil {
		t.Fatalf("the other key stopped working: %v", err)
	}
	_, err = db.APIKeyRevoke(ctx, "key_missing")
	wantErr(t, err, ErrNotFound)
	keys, err := db.APIKeyListByTenant(ctx, ten.ID)
	if err != nil || len(keys) != 2 || keys[0].ID < keys[1].ID || (keys[0].ID == k.ID) == (keys[0].RevokedAt == nil) {
		t.Fatalf("APIKeyListByTenant = %+v, %v", keys, err)
	}
	if keys[0].ID != k2.ID && keys[0].ID != k.ID {
		t.Fatalf("APIKeyListByTenant lists %s", keys[0].ID)
	}
	if keys, _ := db.APIKeyListByTenant(ctx, mkTenant(t, db).ID); len(keys) != 0 {
		t.Fatalf("another tenant lists %d keys", len(keys))
	}
}

// A key is exempt from the API limit on its own: set at insert or by
// APIKeyUpdate, read back by authentication and listings, and listed among
// the exempt keys while unrevoked; exempt tenants are listed apart.
func testAPIKeyExempt(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	mk := func(secret string, exempt bool) (*APIKey, []byte) {
		t.Helper()
		h := sha256.Sum256([]byte(secret))
		k, err := db.APIKeyInsert(ctx, &APIKeyInsertParams{TenantID: ten.ID, Prefix: secret[:6], Hash: h[:], APIExempt: exempt})
		if err != nil || k.APIExempt != exempt {
			t.Fatalf("APIKeyInsert(exempt %v) = %+v, %v", exempt, k, err)
		}
		return k, h[:]
	}
	plain, ph := mk("plain-key", false)
	service, sh := mk("service-key", true)
	if k, _, err := db.APIKeyGetByHash(ctx, sh); err != nil || !k.APIExempt {
		t.Fatalf("APIKeyGetByHash of the exempt key = %+v, %v", k, err)
	}
	yes, no := true, false
	up, err := db.APIKeyUpdate(ctx, &APIKeyUpdateParams{ID: plain.ID, APIExempt: &yes})
	if err != nil || !up.APIExempt || up.ID != plain.ID || !bytes.Equal(up.Hash, ph) || up.RevokedAt != nil {
		t.Fatalf("APIKeyUpdate exempt = %+v, %v", up, err)
	}
	if k, _, _ := db.APIKeyGetByHash(ctx, ph); !k.APIExempt {
		t.Fatal("authentication does not see the exemption")
	}
	if got, err := db.APIKeyUpdate(ctx, &APIKeyUpdateParams{ID: plain.ID}); err != nil || !got.APIExempt {
		t.Fatalf("APIKeyUpdate changing nothing = %+v, %v", got, err)
	}
	list := func() []string {
		t.Helper()
		keys, more, err := db.APIKeyListExempt(ctx, &APIKeyListExemptParams{})
		if err != nil || more {
			t.Fatalf("APIKeyListExempt: %v, more %v", err, more)
		}
		var ids []string
		for _, k := range keys {
			ids = append(ids, k.ID)
		}
		return ids
	}
	if got := list(); len(got) != 2 || got[0] != service.ID || got[1] != plain.ID {
		t.Fatalf("exempt keys = %v, want [%s %s] newest first", got, service.ID, plain.ID)
	}
	if _, err := db.APIKeyRevoke(ctx, service.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.APIKeyUpdate(ctx, &APIKeyUpdateParams{ID: plain.ID, APIExempt: &no}); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("exempt keys after a revoke and an update = %v, want none", got)
	}
	keys, err := db.APIKeyListByTenant(ctx, ten.ID)
	if err != nil || len(keys) != 2 || !keys[0].APIExempt || keys[1].APIExempt {
		t.Fatalf("APIKeyListByTenant = %+v, %v; want the revoked exempt key and the plain one", keys, err)
	}
	_, err = db.APIKeyUpdate(ctx, &APIKeyUpdateParams{ID: "key_missing", APIExempt: &yes})
	wantErr(t, err, ErrNotFound)
	_, err = db.APIKeyUpdate(ctx, &APIKeyUpdateParams{ID: "key_missing"})
	wantErr(t, err, ErrNotFound)

	exempt, err := db.TenantInsert(ctx, &TenantInsertParams{Name: "svc", Tier: "t", APIExempt: true})
	if err != nil {
		t.Fatal(err)
	}
	ts, more, err := db.TenantList(ctx, &TenantListParams{APIExempt: true})
	if err != nil || more || len(ts) != 1 || ts[0].ID != exempt.ID {
		t.Fatalf("exempt tenants = %+v, %v", ts, err)
	}
}

// --- jobs ---

func testJobInsertRoundTrip(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	b := mkBatch(t, db, ten.ID)
	next := time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.FixedZone("X", 3600))
	p := jobParams(ten.ID)
	p.BatchID, p.LineNo, p.CustomID = b.ID, 7, "req-7"
	p.WebhookURL = "https://example.com/hook"
	p.Metadata = json.RawMessage(`{"b": 2, "a": [1, "x"]}`)
	p.Status, p.NextRunAt = JobDeferred, &next
	j := mkJob(t, db, p)
	if j.TenantID != ten.ID || j.BatchID != b.ID || j.LineNo != 7 || j.CustomID != "req-7" || j.Status != JobDeferred ||
		j.Endpoint != p.Endpoint || j.Model != p.Model || j.Queue != "default" || j.EstPromptTokens != 10 ||
		j.EstMaxTokens != 100 || j.EstCost != 61 || j.WebhookURL != p.WebhookURL || j.Attempts != 0 || j.Error != nil ||
		j.StartedAt != nil || j.FinishedAt != nil || j.ResponseBody != nil || j.IdempotencyKey != "" {
		t.Fatalf("inserted job = %+v", j)
	}
	if j.NextRunAt == nil || !j.NextRunAt.Equal(next.Truncate(time.Microsecond)) || j.NextRunAt.Location() != time.UTC {
		t.Fatalf("NextRunAt = %v, want %v in UTC", j.NextRunAt, next)
	}
	jsonEqual(t, j.Request, p.Request)
	jsonEqual(t, j.Metadata, p.Metadata)
	got, err := db.JobGetByID(ctx, j.ID)
	if err != nil || !reflect.DeepEqual(got, j) {
		t.Fatalf("JobGetByID = %+v, %v\nwant %+v", got, err, j)
	}
	_, err = db.JobGetByID(ctx, "job_missing")
	wantErr(t, err, ErrNotFound)

	// Outside a batch there is no line; metadata "null" is no metadata.
	p2 := jobParams(ten.ID)
	p2.Metadata = json.RawMessage("null")
	j2 := mkJob(t, db, p2)
	if j2.BatchID != "" || j2.LineNo != 0 || j2.Metadata != nil || j2.Status != JobQueued {
		t.Fatalf("plain job = %+v", j2)
	}
	// Constraint errors are classified.
	dup := jobParams(ten.ID)
	dup.ID = j.ID
	_, _, err = db.JobInsert(ctx, dup)
	wantErr(t, err, ErrConflict)
	_, _, err = db.JobInsert(ctx, jobParams("ten_missing"))
	wantErr(t, err, ErrNotFound)
	bad := jobParams(ten.ID)
	bad.Request = json.RawMessage(`{"not json`)
	if _, _, err := db.JobInsert(ctx, bad); err == nil {
		t.Fatal("invalid JSON request was stored")
	}
	term := jobParams(ten.ID)
	term.Status = JobSucceeded
	if _, _, err := db.JobInsert(ctx, term); err == nil {
		t.Fatal("a job was inserted already succeeded")
	}
}

func testJobInsertIdempotent(t *testing.T, db *DB) {
	ctx := t.Context()
	ten, other := mkTenant(t, db), mkTenant(t, db)
	p := jobParams(ten.ID)
	p.IdempotencyKey = "order-42"
	first := mkJob(t, db, p)
	p2 := jobParams(ten.ID)
	p2.IdempotencyKey = "order-42"
	p2.CustomID = "different body, same key"
	again, created, err := db.JobInsert(ctx, p2)
	if err != nil || created || again.ID != first.ID || again.CustomID != "" {
		t.Fatalf("second insert with the key = %+v created=%v err=%v; want the first job", again, created, err)
	}
	// Keys are per tenant.
	po := jobParams(other.ID)
	po.IdempotencyKey = "order-42"
	oj := mkJob(t, db, po)
	if oj.ID == first.ID {
		t.Fatal("another tenant's key returned the first tenant's job")
	}
	// No key: always a new job.
	a, b := mkJob(t, db, jobParams(ten.ID)), mkJob(t, db, jobParams(ten.ID))
	if a.ID == b.ID {
		t.Fatal("two keyless inserts made one job")
	}
	js, _, err := db.JobList(ctx, &JobListParams{TenantID: ten.ID, Limit: 100})
	if err != nil || len(js) != 3 {
		t.Fatalf("tenant has %d jobs (%v), want 3", len(js), err)
	}
}

func testJobInsertIdempotentConcurrent(t *testing.T, db *DB) {
	ten := mkTenant(t, db)
	const n = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
		idsSeen = map[string]bool{}
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := jobParams(ten.ID)
			p.IdempotencyKey = "same"
			j, c, err := db.JobInsert(t.Context(), p)
			if err != nil {
				t.Errorf("JobInsert: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			idsSeen[j.ID] = true
			if c {
				created++
			}
		}()
	}
	wg.Wait()
	if created != 1 || len(idsSeen) != 1 {
		t.Fatalf("%d concurrent inserts with one key: created %d, distinct jobs %d; want 1 and 1", n, created, len(idsSeen))
	}
}

func testJobTransitions(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	j := mkJob(t, db, jobParams(ten.ID))

	s, started, err := db.JobStart(ctx, j.ID, "")
	if err != nil || !started || s.Status != JobRunning || s.StartedAt == nil {
		t.Fatalf("JobStart = %+v started=%v err=%v", s, started, err)
	}
	due := time.Now().Add(time.Minute)
	w, applied, err := db.JobSetStatus(ctx, &JobSetStatusParams{ID: j.ID, From: []JobStatus{JobRunning}, To: JobWaiting,
		NextRunAt: &due, Error: &JobError{Message: "rate limited", Type: "rate_limit_error", Code: "429"}})
	if err != nil || !applied || w.Status != JobWaiting || w.NextRunAt == nil || w.Error == nil || w.Error.Code != "429" {
		t.Fatalf("running -> waiting = %+v applied=%v err=%v", w, applied, err)
	}
	// From does not match: nothing changes, the job comes back as it is.
	same, applied, err := db.JobSetStatus(ctx, &JobSetStatusParams{ID: j.ID, From: []JobStatus{JobQueued, JobDeferred}, To: JobRunning})
	if err != nil || applied || same.Status != JobWaiting {
		t.Fatalf("unmatched From = %+v applied=%v err=%v", same, applied, err)
	}
	// A redelivered start keeps the first start time and clears next_run_at.
	s2, started, err := db.JobStart(ctx, j.ID, "")
	if err != nil || !started || !s2.StartedAt.Equal(*s.StartedAt) || s2.NextRunAt != nil || s2.Error == nil {
		t.Fatalf("second JobStart = %+v started=%v err=%v", s2, started, err)
	}
	// A nil Error leaves the error; NextRunAt nil clears.
	q, applied, err := db.JobSetStatus(ctx, &JobSetStatusParams{ID: j.ID, From: []JobStatus{JobRunning}, To: JobQueued})
	if err != nil || !applied || q.Error == nil || q.NextRunAt != nil || q.FinishedAt != nil {
		t.Fatalf("running -> queued = %+v applied=%v err=%v", q, applied, err)
	}
	f, applied, err := db.JobFail(ctx, &JobFailParams{ID: j.ID, Error: JobError{Message: "bad request", Type: "invalid_request_error"},
		ResponseStatus: 400, ResponseBody: json.RawMessage(`{"error":{"message":"bad request"}}`)})
	if err != nil || !applied || f.Status != JobFailed || f.FinishedAt == nil || f.Error.Message != "bad request" || f.ResponseStatus != 400 {
		t.Fatalf("JobFail = %+v applied=%v err=%v", f, applied, err)
	}
	// Terminal: JobStart returns it unchanged.
	t2, started, err := db.JobStart(ctx, j.ID, "")
	if err != nil || started || t2.Status != JobFailed || !reflect.DeepEqual(t2, f) {
		t.Fatalf("JobStart on a failed job = %+v started=%v err=%v", t2, started, err)
	}
	_, _, err = db.JobStart(ctx, "job_missing", "")
	wantErr(t, err, ErrNotFound)
	_, _, err = db.JobSetStatus(ctx, &JobSetStatusParams{ID: "job_missing", From: []JobStatus{JobQueued}, To: JobRunning})
	wantErr(t, err, ErrNotFound)

	// A move to a terminal status through JobSetStatus stamps finished_at.
	j2 := mkJob(t, db, jobParams(ten.ID))
	c := setStatus(t, db, j2.ID, []JobStatus{JobQueued}, JobCancelled)
	if c.FinishedAt == nil {
		t.Fatal("terminal JobSetStatus did not stamp finished_at")
	}
}

func testTerminalIsFinal(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	for _, final := range []JobStatus{JobSucceeded, JobFailed, JobCancelled} {
		j := mkJob(t, db, jobParams(ten.ID))
		switch final {
		case JobSucceeded:
			if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01", Cost: 5}); err != nil {
				t.Fatal(err)
			}
		case JobFailed:
			if _, _, err := db.JobFail(ctx, &JobFailParams{ID: j.ID, Error: JobError{Message: "x"}}); err != nil {
				t.Fatal(err)
			}
		case JobCancelled:
			if _, changed, err := db.JobCancel(ctx, ten.ID, j.ID); err != nil || !changed {
				t.Fatal(changed, err)
			}
		}
		before, _ := db.JobGetByID(ctx, j.ID)
		if before.Status != final {
			t.Fatalf("status %s, want %s", before.Status, final)
		}
		if _, _, err := db.JobSetStatus(ctx, &JobSetStatusParams{ID: j.ID, From: []JobStatus{final}, To: JobQueued}); err == nil {
			t.Fatal("JobSetStatus accepted a terminal From")
		}
		for _, to := range []JobStatus{JobQueued, JobRunning, JobWaiting, JobDeferred, JobFailed, JobCancelled} {
			_, applied, err := db.JobSetStatus(ctx, &JobSetStatusParams{ID: j.ID, To: to,
				From: []JobStatus{JobQueued, JobRunning, JobWaiting, JobDeferred}})
			if err != nil || applied {
				t.Fatalf("%s -> %s applied=%v err=%v", final, to, applied, err)
			}
		}
		if _, applied, _ := db.JobFail(ctx, &JobFailParams{ID: j.ID, Error: JobError{Message: "late"}}); applied {
			t.Fatalf("JobFail overwrote %s", final)
		}
		if _, changed, _ := db.JobCancel(ctx, ten.ID, j.ID); changed {
			t.Fatalf("JobCancel overwrote %s", final)
		}
		// A call that ends after the job did is charged once (a job that
		// succeeded was charged already): the job keeps its state and shows
		// the call's usage and cost, which its ledger row charged.
		res, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01", Cost: 5})
		if err != nil || res.Completed || res.Charged != (final != JobSucceeded) {
			t.Fatalf("JobComplete of a %s job: %+v %v", final, res, err)
		}
		if res.Charged {
			before.Attempts++
			before.Cost = 5
		}
		after, _ := db.JobGetByID(ctx, j.ID)
		before.UpdatedAt, after.UpdatedAt = time.Time{}, time.Time{}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("a %s job changed:\n%+v\n%+v", final, before, after)
		}
	}
}

func testJobCounters(t *testing.T, db *DB) {
	ctx := t.Context()
	j := mkJob(t, db, jobParams(mkTenant(t, db).ID))
	for want := 1; want <= 3; want++ {
		n, err := db.JobIncrRateLimited(ctx, j.ID)
		if err != nil || n != want {
			t.Fatalf("JobIncrRateLimited = %d, %v; want %d", n, err, want)
		}
	}
	// Attempts count provider calls where their outcome is recorded: a
	// retried fault, then a success. Starting a job counts none.
	if _, started, err := db.JobStart(ctx, j.ID, ""); err != nil || !started {
		t.Fatalf("JobStart = %v, %v", started, err)
	}
	if _, ok, err := db.JobSetStatus(ctx, &JobSetStatusParams{ID: j.ID, From: []JobStatus{JobRunning}, To: JobWaiting, CountAttempt: true}); err != nil || !ok {
		t.Fatalf("JobSetStatus = %v, %v", ok, err)
	}
	if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01"}); err != nil {
		t.Fatal(err)
	}
	got, _ := db.JobGetByID(ctx, j.ID)
	if got.RateLimited != 3 || got.Attempts != 2 {
		t.Fatalf("counters = %d rate limited, %d attempts; want 3 and 2 (a fault and a success)", got.RateLimited, got.Attempts)
	}
	_, err := db.JobIncrRateLimited(ctx, "job_missing")
	wantErr(t, err, ErrNotFound)
}

func testJobCompleteChargesOnce(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	j := mkJob(t, db, jobParams(ten.ID))
	if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
		t.Fatal(err)
	}
	const n = 24
	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		charged, completed int
	)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01",
				ResponseBody: json.RawMessage(`{"id":"chatcmpl-1","choices":[]}`), ProviderRequestID: "req_1",
				PromptTokens: 12, CompletionTokens: 30, CachedTokens: 2, Cost: 1234})
			if err != nil {
				t.Errorf("JobComplete: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if res.Charged {
				charged++
			}
			if res.Completed {
				completed++
			}
		}()
	}
	close(start)
	wg.Wait()
	if charged != 1 || completed != 1 {
		t.Fatalf("%d concurrent completions: charged %d, completed %d; want exactly 1 each", n, charged, completed)
	}
	sum, err := db.UsageSumByTenantDay(ctx, ten.ID, "2026-03-01")
	if err != nil || sum != 1234 {
		t.Fatalf("spend = %d, %v; want 1234 (charged once)", sum, err)
	}
	rows, err := db.UsageReport(ctx, &UsageReportParams{Day: "2026-03-01"})
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 {
		t.Fatalf("ledger rows = %+v, %v; want one request", rows, err)
	}
	got, _ := db.JobGetByID(ctx, j.ID)
	if got.PromptTokens != 12 || got.CompletionTokens != 30 || got.CachedTokens != 2 || got.TotalTokens != 42 ||
		got.Cost != 1234 || got.ResponseStatus != 200 || got.ProviderRequestID != "req_1" || got.FinishedAt == nil || got.Error != nil {
		t.Fatalf("completed job = %+v", got)
	}
	jsonEqual(t, got.ResponseBody, json.RawMessage(`{"id":"chatcmpl-1","choices":[]}`))
	e, err := db.UsageGetByJob(ctx, j.ID)
	if err != nil || e.TenantID != ten.ID || e.Day != "2026-03-01" || e.Model != "gpt-4o-mini" || e.Cost != 1234 ||
		e.PromptTokens != 12 || e.CompletionTokens != 30 || e.CachedTokens != 2 {
		t.Fatalf("ledger row = %+v, %v", e, err)
	}
	_, err = db.JobComplete(ctx, &JobCompleteParams{ID: "job_missing", Day: "2026-03-01"})
	wantErr(t, err, ErrNotFound)
	if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "03/01/2026"}); err == nil {
		t.Fatal("a malformed day was accepted")
	}
}

// JobCompleteMany: each job's outcome is its own (completed and charged, a
// missing job's ErrNotFound, a bad day's error), a second call charges none,
// and a job the transaction cannot hold (a NUL) does not fail the others.
func testJobCompleteMany(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	a, b := mkJob(t, db, jobParams(ten.ID)), mkJob(t, db, jobParams(ten.ID))
	body := json.RawMessage(`{"id":"chatcmpl-1","choices":[]}`)
	ps := &JobCompleteManyParams{Jobs: []*JobCompleteParams{
		{ID: a.ID, Day: "2026-03-01", ResponseBody: body, PromptTokens: 3, CompletionTokens: 4, Cost: 10},
		{ID: "job_missing", Day: "2026-03-01"},
		{ID: b.ID, Day: "2026-03-01", ResponseBody: body, Cost: 20},
		{ID: b.ID, Day: "03/01/2026"},
	}}
	res, errs := db.JobCompleteMany(ctx, ps)
	if errs[0] != nil || !res[0].Completed || !res[0].Charged || errs[2] != nil || !res[2].Completed || !res[2].Charged {
		t.Fatalf("JobCompleteMany: %+v %+v, %v %v", res[0], res[2], errs[0], errs[2])
	}
	wantErr(t, errs[1], ErrNotFound)
	if errs[3] == nil {
		t.Fatal("a malformed day was accepted")
	}
	got, err := db.JobGetByID(ctx, a.ID)
	if err != nil || got.Status != JobSucceeded || got.TotalTokens != 7 || got.Cost != 10 {
		t.Fatalf("completed job = %+v, %v", got, err)
	}
	if sum, err := db.UsageSumByTenantDay(ctx, ten.ID, "2026-03-01"); err != nil || sum != 30 {
		t.Fatalf("spend = %d, %v; want 30", sum, err)
	}
	res, errs = db.JobCompleteMany(ctx, &JobCompleteManyParams{Jobs: ps.Jobs[:3:3]})
	if errs[0] != nil || res[0].Completed || res[0].Charged || errs[2] != nil || res[2].Charged {
		t.Fatalf("a second JobCompleteMany: %+v %+v, %v %v", res[0], res[2], errs[0], errs[2])
	}
	c, d := mkJob(t, db, jobParams(ten.ID)), mkJob(t, db, jobParams(ten.ID))
	res, errs = db.JobCompleteMany(ctx, &JobCompleteManyParams{Jobs: []*JobCompleteParams{
		{ID: c.ID, Day: "2026-03-01", ResponseBody: json.RawMessage(`{"content":"a\u0000b"}`)},
		{ID: d.ID, Day: "2026-03-01", ResponseBody: body},
	}})
	for i := range res {
		if errs[i] != nil || !res[i].Completed {
			t.Fatalf("JobCompleteMany beside a NUL: job %d: %+v, %v", i, res[i], errs[i])
		}
	}
}

// A provider body holding an escaped NUL is stored (Postgres jsonb refuses
// NUL), with U+FFFD in its place on both backends.
func testJobCompleteWithNUL(t *testing.T, db *DB) {
	ctx := t.Context()
	j := mkJob(t, db, jobParams(mkTenant(t, db).ID))
	res, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01",
		ResponseBody: json.RawMessage(`{"content":"a\u0000b","path":"C:\\u0000"}`)})
	if err != nil || !res.Completed {
		t.Fatalf("JobComplete with a NUL = %+v, %v", res, err)
	}
	got, err := db.JobGetByID(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, got.ResponseBody, json.RawMessage(`{"content":"a\ufffdb","path":"C:\\u0000"}`))
}

func testJobCompleteAfterCancel(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	j := mkJob(t, db, jobParams(ten.ID))
	if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, changed, err := db.JobCancel(ctx, ten.ID, j.ID); err != nil || !changed {
		t.Fatal(changed, err)
	}
	cancelled, _ := db.JobGetByID(ctx, j.ID)
	// The provider call was already made: it is paid for, and the job
	// stays cancelled, showing the usage and cost its ledger row charged
	// (not the call's answer: nobody wants it any more).
	res, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01", Cost: 99,
		PromptTokens: 12, CompletionTokens: 30, CachedTokens: 2, ProviderRequestID: "req_1",
		ResponseBody: json.RawMessage(`{"id":"chatcmpl-1"}`), Deployment: "sim/east", ServedModel: "gpt-4o"})
	if err != nil || res.Completed || !res.Charged {
		t.Fatalf("JobComplete after cancel = %+v, %v", res, err)
	}
	got, _ := db.JobGetByID(ctx, j.ID)
	e, err := db.UsageGetByJob(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != JobCancelled || !got.FinishedAt.Equal(*cancelled.FinishedAt) || got.Error != nil || got.ResponseStatus != 0 || got.ResponseBody != nil {
		t.Fatalf("a completion that came too late changed the cancelled job's state: %+v", got)
	}
	if got.Cost != e.Cost || got.Cost != 99 || got.PromptTokens != e.PromptTokens || got.CompletionTokens != e.CompletionTokens ||
		got.CachedTokens != e.CachedTokens || got.TotalTokens != 42 || got.Attempts != 1 || got.ProviderRequestID != "req_1" ||
		got.Deployment != "sim/east" || got.ServedModel != "gpt-4o" || e.Model != "gpt-4o" {
		t.Fatalf("cancelled job %+v; its ledger row %+v", got, e)
	}
	// A second delivery's result is neither charged nor shown.
	res, err = db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01", Cost: 7, PromptTokens: 1, CompletionTokens: 1})
	if err != nil || res.Completed || res.Charged {
		t.Fatalf("a second JobComplete after cancel = %+v, %v", res, err)
	}
	again, _ := db.JobGetByID(ctx, j.ID)
	got.UpdatedAt, again.UpdatedAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, again) {
		t.Fatalf("a second completion changed the job:\n%+v\n%+v", got, again)
	}
	if sum, _ := db.UsageSumByTenantDay(ctx, ten.ID, "2026-03-01"); sum != 99 {
		t.Fatalf("spend = %d, want 99", sum)
	}
}

// A cancel racing the completion of the job's call: whichever commits
// first, the job ends once (succeeded and completed by the call, or
// cancelled), is charged once, and shows the usage and cost of its ledger
// row.
func testJobCompleteRacesCancel(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	outcomes := map[JobStatus]int{}
	for i := range 30 {
		j := mkJob(t, db, jobParams(ten.ID))
		if _, _, err := db.JobStart(ctx, j.ID, ""); err != nil {
			t.Fatal(err)
		}
		cost := money.Micros(100 + i)
		var (
			wg  sync.WaitGroup
			res *JobCompleteResult
			err error
		)
		wg.Go(func() {
			res, err = db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01", Cost: cost, PromptTokens: 5, CompletionTokens: int64(i)})
		})
		wg.Go(func() {
			if _, _, err := db.JobCancel(ctx, ten.ID, j.ID); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if err != nil || !res.Charged {
			t.Fatalf("JobComplete racing a cancel = %+v, %v", res, err)
		}
		got, _ := db.JobGetByID(ctx, j.ID)
		outcomes[got.Status]++
		if res.Completed != (got.Status == JobSucceeded) || (got.Status != JobSucceeded && got.Status != JobCancelled) {
			t.Fatalf("job %s after the race, completed %v", got.Status, res.Completed)
		}
		e, err := db.UsageGetByJob(ctx, j.ID)
		if err != nil || e.Cost != cost || got.Cost != cost || got.PromptTokens != 5 || got.CompletionTokens != int64(i) || got.Attempts != 1 {
			t.Fatalf("job %+v after the race; ledger row %+v, %v", got, e, err)
		}
	}
	t.Logf("outcomes of the race: %v", outcomes)
}

func testCrossTenant(t *testing.T, db *DB) {
	ctx := t.Context()
	a, b := mkTenant(t, db), mkTenant(t, db)
	j := mkJob(t, db, jobParams(a.ID))
	batch := mkBatch(t, db, a.ID)
	// The tenant's own reads are the stored job but for the body it sent.
	got, err := db.JobGetForTenant(ctx, a.ID, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	page, _, err := db.JobList(ctx, &JobListParams{TenantID: a.ID})
	if err != nil || len(page) != 1 {
		t.Fatalf("JobList = %d jobs, %v", len(page), err)
	}
	want := *j
	want.Request = nil
	if !reflect.DeepEqual(got, &want) || !reflect.DeepEqual(page[0], &want) {
		t.Fatalf("JobGetForTenant = %+v\nJobList[0] = %+v\nwant %+v", got, page[0], &want)
	}
	_, err = db.JobGetForTenant(ctx, b.ID, j.ID)
	wantErr(t, err, ErrNotFound)
	_, _, err = db.JobCancel(ctx, b.ID, j.ID)
	wantErr(t, err, ErrNotFound)
	if got, _ := db.JobGetByID(ctx, j.ID); got.Status != JobQueued {
		t.Fatalf("another tenant's cancel changed the job to %s", got.Status)
	}
	_, err = db.BatchGetForTenant(ctx, b.ID, batch.ID)
	wantErr(t, err, ErrNotFound)
	_, err = db.FileGetForTenant(ctx, b.ID, batch.InputFileID)
	wantErr(t, err, ErrNotFound)
	_, applied, err := db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: batch.ID, TenantID: b.ID,
		From: []BatchStatus{BatchValidating}, To: BatchCancelling})
	if applied || !errors.Is(err, ErrNotFound) {
		t.Fatalf("another tenant's BatchSetStatus: applied=%v err=%v", applied, err)
	}
	for _, list := range []func() (int, error){
		func() (int, error) {
			js, _, err := db.JobList(ctx, &JobListParams{TenantID: b.ID})
			return len(js), err
		},
		func() (int, error) {
			bs, _, err := db.BatchList(ctx, &BatchListParams{TenantID: b.ID})
			return len(bs), err
		},
		func() (int, error) {
			fs, _, err := db.FileList(ctx, &FileListParams{TenantID: b.ID})
			return len(fs), err
		},
		func() (int, error) {
			js, _, err := db.JobList(ctx, &JobListParams{TenantID: b.ID, BatchID: batch.ID})
			return len(js), err
		},
	} {
		if n, err := list(); err != nil || n != 0 {
			t.Fatalf("tenant b lists %d of tenant a's rows (%v)", n, err)
		}
	}
}

func testJobListPages(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	other := mkTenant(t, db)
	batch := mkBatch(t, db, ten.ID)
	var all, failed, inBatch []string
	for i := 0; i < 23; i++ {
		p := jobParams(ten.ID)
		if i%3 == 0 {
			p.BatchID, p.LineNo = batch.ID, i
		}
		j := mkJob(t, db, p)
		all = append(all, j.ID)
		if i%3 == 0 {
			inBatch = append(inBatch, j.ID)
		}
		if i%4 == 0 {
			if _, _, err := db.JobFail(ctx, &JobFailParams{ID: j.ID, Error: JobError{Message: "x"}}); err != nil {
				t.Fatal(err)
			}
			failed = append(failed, j.ID)
		}
		mkJob(t, db, jobParams(other.ID))
	}
	var failedInBatch []string
	for _, id := range sortedCopy(inBatch) {
		for _, f := range failed {
			if f == id {
				failedInBatch = append(failedInBatch, id)
			}
		}
	}
	for _, c := range []struct {
		name string
		p    JobListParams
		want []string
	}{
		{"all", JobListParams{}, all},
		{"failed", JobListParams{Status: JobFailed}, failed},
		{"batch", JobListParams{BatchID: batch.ID}, inBatch},
		{"failed in batch", JobListParams{BatchID: batch.ID, Status: JobFailed}, failedInBatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, size := range []int{1, 4, 23, 50} {
				checkPages(t, reversed(sortedCopy(c.want)), size, func(after string, limit int) ([]*Job, bool, error) {
					p := c.p
					p.TenantID, p.After, p.Limit = ten.ID, after, limit
					return db.JobList(ctx, &p)
				}, func(j *Job) string { return j.ID })
			}
		})
	}
	js, more, err := db.JobList(ctx, &JobListParams{TenantID: ten.ID})
	if err != nil || len(js) != defaultListLimit || !more {
		t.Fatalf("default page: %d rows more=%v err=%v", len(js), more, err)
	}
	if _, _, err := db.JobList(ctx, &JobListParams{}); err == nil {
		t.Fatal("JobList without a tenant succeeded")
	}
}

func testJobListUnfinished(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	var unfinished []string
	for i := 0; i < 30; i++ {
		j := mkJob(t, db, jobParams(ten.ID))
		switch i % 6 {
		case 0:
			unfinished = append(unfinished, j.ID)
		case 1:
			setStatus(t, db, j.ID, []JobStatus{JobQueued}, JobRunning)
			unfinished = append(unfinished, j.ID)
		case 2:
			setStatus(t, db, j.ID, []JobStatus{JobQueued}, JobWaiting)
			unfinished = append(unfinished, j.ID)
		case 3:
			setStatus(t, db, j.ID, []JobStatus{JobQueued}, JobDeferred)
			unfinished = append(unfinished, j.ID)
		case 4:
			if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01"}); err != nil {
				t.Fatal(err)
			}
		case 5:
			setStatus(t, db, j.ID, []JobStatus{JobQueued}, JobCancelled)
		}
	}
	for _, size := range []int{1, 7, 20, 100} {
		checkPages(t, sortedCopy(unfinished), size, func(after string, limit int) ([]*Job, bool, error) {
			return db.JobListUnfinished(ctx, &JobListUnfinishedParams{After: after, Limit: limit})
		}, func(j *Job) string { return j.ID })
	}
	js, _, err := db.JobListUnfinished(ctx, &JobListUnfinishedParams{UpdatedBefore: time.Now().Add(-time.Hour)})
	if err != nil || len(js) != 0 {
		t.Fatalf("UpdatedBefore an hour ago: %d jobs, %v", len(js), err)
	}
	js, _, err = db.JobListUnfinished(ctx, &JobListUnfinishedParams{UpdatedBefore: time.Now().Add(time.Hour)})
	if err != nil || len(js) != len(unfinished) {
		t.Fatalf("UpdatedBefore in an hour: %d jobs, %v", len(js), err)
	}

	// The jobs of a batch still validating are its validation's to enqueue.
	b := mkBatch(t, db, ten.ID)
	p := jobParams(ten.ID)
	p.BatchID, p.LineNo = b.ID, 1
	inBatch := mkJob(t, db, p)
	listed := func(skip bool) bool {
		t.Helper()
		js, _, err := db.JobListUnfinished(ctx, &JobListUnfinishedParams{SkipValidating: skip, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(js) < len(unfinished) {
			t.Fatalf("SkipValidating=%v lists %d jobs, want at least the %d outside batches", skip, len(js), len(unfinished))
		}
		return slices.ContainsFunc(js, func(j *Job) bool { return j.ID == inBatch.ID })
	}
	if !listed(false) || listed(true) {
		t.Fatalf("a validating batch's job: listed=%v, with SkipValidating=%v; want true, false", listed(false), listed(true))
	}
	setBatch(t, db, b.ID, BatchValidating, BatchInProgress)
	if !listed(true) {
		t.Fatal("a batch in progress: its job is skipped")
	}
}

func testJobCancelByBatch(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	batch, otherBatch := mkBatch(t, db, ten.ID), mkBatch(t, db, ten.ID)
	want := map[string]JobStatus{}
	for i, st := range []JobStatus{JobQueued, JobRunning, JobWaiting, JobDeferred, JobSucceeded, JobFailed, JobQueued} {
		p := jobParams(ten.ID)
		p.BatchID, p.LineNo = batch.ID, i
		j := mkJob(t, db, p)
		switch st {
		case JobRunning, JobWaiting, JobDeferred:
			setStatus(t, db, j.ID, []JobStatus{JobQueued}, st)
		case JobSucceeded:
			if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: "2026-03-01"}); err != nil {
				t.Fatal(err)
			}
		case JobFailed:
			if _, _, err := db.JobFail(ctx, &JobFailParams{ID: j.ID, Error: JobError{Message: "x"}}); err != nil {
				t.Fatal(err)
			}
		}
		switch st {
		case JobQueued, JobWaiting, JobDeferred:
			want[j.ID] = JobCancelled
		default:
			want[j.ID] = st
		}
	}
	p := jobParams(ten.ID)
	p.BatchID = otherBatch.ID
	untouched := mkJob(t, db, p)
	want[untouched.ID] = JobQueued

	n, err := db.JobCancelByBatch(ctx, batch.ID)
	if err != nil || n != 4 {
		t.Fatalf("JobCancelByBatch = %d, %v; want 4", n, err)
	}
	for id, st := range want {
		j, _ := db.JobGetByID(ctx, id)
		if j.Status != st {
			t.Fatalf("job %s is %s, want %s", id, j.Status, st)
		}
		if st == JobCancelled && j.FinishedAt == nil {
			t.Fatal("cancelled job without finished_at")
		}
	}
	c, err := db.JobCountsByBatch(ctx, batch.ID)
	want2 := JobCounts{Running: 1, Succeeded: 1, Failed: 1, Cancelled: 4, Total: 7}
	if err != nil || *c != want2 || c.Unfinished() != 1 {
		t.Fatalf("JobCountsByBatch = %+v, %v; want %+v", c, err, want2)
	}
	if c, _ := db.JobCountsByBatch(ctx, "batch_none"); *c != (JobCounts{}) {
		t.Fatalf("counts of no batch = %+v", c)
	}
}

// testJobInsertManyAndStream inserts a full-size batch (50,000 lines, in
// shuffled order) in one call and streams it back in line order.
func testJobInsertManyAndStream(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	batch := mkBatch(t, db, ten.ID)
	n := 50_000
	if raceEnabled {
		// Under the race detector SQLite itself runs instrumented (30 s for
		// 10,000 lines), and Postgres's 50,000 take 11 s beside the rest of
		// the suite; 5,000 lines still cross every boundary ten times (the
		// stream's pages and SQLite's inserts are of 500 rows). The full
		// size runs without -race and in BenchmarkJobInsertMany50k.
		n = 5_000
	}
	rng := mathrand.New(mathrand.NewPCG(1, 2))
	jobs := make([]*JobInsertParams, n)
	for i, line := range rng.Perm(n) {
		p := jobParams(ten.ID)
		p.BatchID, p.LineNo, p.CustomID = batch.ID, line, "req-"+strconv.Itoa(line)
		jobs[i] = p
	}
	ids, err := db.JobInsertMany(ctx, &JobInsertManyParams{Jobs: jobs})
	if err != nil {
		t.Fatalf("JobInsertMany: %v", err)
	}
	if len(ids) != n || !isSorted(ids) {
		t.Fatalf("JobInsertMany returned %d ids, sorted=%v", len(ids), isSorted(ids))
	}
	idByLine := make([]string, n)
	for i, p := range jobs {
		idByLine[p.LineNo] = ids[i]
	}

	// Streaming reads page by page: a change made to a later line while the
	// stream runs is seen when that line arrives, so the batch was not
	// loaded whole.
	probe := n * 4 / 5
	next := 0
	err = db.JobStreamByBatch(ctx, batch.ID, nil, func(j *Job) error {
		if j.LineNo != next || j.ID != idByLine[next] || j.CustomID != "req-"+strconv.Itoa(next) {
			return fmt.Errorf("line %d: got job %s line %d custom_id %q", next, j.ID, j.LineNo, j.CustomID)
		}
		if next == n/50 {
			setStatus(t, db, idByLine[probe], []JobStatus{JobQueued}, JobWaiting)
		}
		if next == probe && j.Status != JobWaiting {
			return fmt.Errorf("line %d streamed as %s: it was read before the stream reached it", probe, j.Status)
		}
		next++
		return nil
	})
	if err != nil || next != n {
		t.Fatalf("stream: %v after %d of %d jobs", err, next, n)
	}
	var only []int
	if err := db.JobStreamByBatch(ctx, batch.ID, []JobStatus{JobWaiting}, func(j *Job) error {
		only = append(only, j.LineNo)
		return nil
	}); err != nil || !reflect.DeepEqual(only, []int{probe}) {
		t.Fatalf("stream of waiting jobs = %v, %v", only, err)
	}
	stop := errors.New("stop")
	calls := 0
	if err := db.JobStreamByBatch(ctx, batch.ID, nil, func(*Job) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("fn's error: %v after %d calls", err, calls)
	}
	c, err := db.JobCountsByBatch(ctx, batch.ID)
	if err != nil || c.Total != int64(n) || c.Queued != int64(n-1) || c.Waiting != 1 {
		t.Fatalf("counts = %+v, %v", c, err)
	}
	// A retried insert of lines already there conflicts; nothing is added.
	retry := jobParams(ten.ID)
	retry.BatchID, retry.LineNo = batch.ID, 0
	fresh := jobParams(ten.ID)
	fresh.BatchID, fresh.LineNo = batch.ID, n
	_, err = db.JobInsertMany(ctx, &JobInsertManyParams{Jobs: []*JobInsertParams{fresh, retry}})
	wantErr(t, err, ErrConflict)
	if c, _ := db.JobCountsByBatch(ctx, batch.ID); c.Total != int64(n) {
		t.Fatalf("a failed bulk insert left %d rows", c.Total-int64(n))
	}
	withKey := jobParams(ten.ID)
	withKey.IdempotencyKey = "k"
	if _, err := db.JobInsertMany(ctx, &JobInsertManyParams{Jobs: []*JobInsertParams{withKey}}); err == nil {
		t.Fatal("JobInsertMany accepted an idempotency key")
	}
}

func isSorted(s []string) bool {
	for i := 1; i < len(s); i++ {
		if s[i] < s[i-1] {
			return false
		}
	}
	return true
}

// --- files ---

// slowReader hides every method but Read, like a network body.
type slowReader struct{ r io.Reader }

func (s slowReader) Read(p []byte) (int, error) { return s.r.Read(p) }

func testFiles(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	// 2.5 MiB of random bytes with newlines: three chunks, the last partial.
	content := make([]byte, 5<<19)
	_, _ = rand.Read(content)
	for i := range content {
		if content[i] < 8 {
			content[i] = '\n'
		}
	}
	lines := bytes.Count(content, []byte{'\n'})
	if content[len(content)-1] != '\n' {
		lines++ // the last line has no newline
	}
	for _, reader := range []struct {
		name string
		r    io.Reader
	}{
		{"ReaderAt", bytes.NewReader(content)},
		{"stream", slowReader{bytes.NewReader(content)}}, // spooled on SQLite
	} {
		f, err := db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatch, Filename: "big.jsonl", Content: reader.r})
		if err != nil {
			t.Fatalf("%s: FileInsert: %v", reader.name, err)
		}
		if f.Bytes != int64(len(content)) || f.Lines != int64(lines) || f.Purpose != FilePurposeBatch || f.Filename != "big.jsonl" {
			t.Fatalf("%s: file = %+v; want %d bytes, %d lines", reader.name, f, len(content), lines)
		}
		got, err := db.FileGetForTenant(ctx, ten.ID, f.ID)
		if err != nil || !reflect.DeepEqual(got, f) {
			t.Fatalf("FileGetForTenant = %+v, %v", got, err)
		}
		rc, err := db.FileOpen(ctx, f.ID)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if _, err := io.Copy(&out, rc); err != nil || !bytes.Equal(out.Bytes(), content) {
			t.Fatalf("%s: content differs (%d bytes read, %v)", reader.name, out.Len(), err)
		}
		_ = rc.Close()
		// Small reads of every size see the same bytes.
		rc, _ = db.FileOpen(ctx, f.ID)
		if err := iotest.TestReader(rc, content); err != nil {
			t.Fatalf("%s: %v", reader.name, err)
		}
		_ = rc.Close()
	}
	for content, want := range map[string]int64{"": 0, "a": 1, "a\n": 1, "a\nb": 2, "\n\n": 2} {
		f := mkFile(t, db, ten.ID, content)
		if f.Lines != want || f.Bytes != int64(len(content)) {
			t.Fatalf("%q: %d lines, %d bytes; want %d lines", content, f.Lines, f.Bytes, want)
		}
		rc, _ := db.FileOpen(ctx, f.ID)
		b, err := io.ReadAll(rc)
		if err != nil || string(b) != content {
			t.Fatalf("%q read back as %q, %v", content, b, err)
		}
	}
	_, err := db.FileOpen(ctx, "file-missing")
	wantErr(t, err, ErrNotFound)
	_, err = db.FileGetByID(ctx, "file-missing")
	wantErr(t, err, ErrNotFound)

	batch := mkBatch(t, db, ten.ID)
	out, err := db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatchOutput, Filename: "out.jsonl",
		BatchID: batch.ID, Content: bytes.NewReader([]byte("{}\n"))})
	if err != nil || out.BatchID != batch.ID {
		t.Fatalf("output file = %+v, %v", out, err)
	}
	if got, err := db.FileGetByID(ctx, out.ID); err != nil || got.BatchID != batch.ID {
		t.Fatalf("FileGetByID = %+v, %v", got, err)
	}
	all, _, err := db.FileList(ctx, &FileListParams{TenantID: ten.ID, Limit: 100})
	if err != nil || len(all) != 2+5+2 {
		t.Fatalf("FileList: %d files, %v", len(all), err)
	}
	var wantIDs []string
	for _, f := range all {
		wantIDs = append(wantIDs, f.ID)
	}
	checkPages(t, wantIDs, 4, func(after string, limit int) ([]*File, bool, error) {
		return db.FileList(ctx, &FileListParams{TenantID: ten.ID, After: after, Limit: limit})
	}, func(f *File) string { return f.ID })
	outs, _, err := db.FileList(ctx, &FileListParams{TenantID: ten.ID, Purpose: FilePurposeBatchOutput})
	if err != nil || len(outs) != 1 || outs[0].ID != out.ID {
		t.Fatalf("FileList by purpose = %d files, %v", len(outs), err)
	}
	if _, err := db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: "fine-tune", Filename: "x", Content: bytes.NewReader(nil)}); err == nil {
		t.Fatal("an unknown purpose was accepted")
	}
}

func testFileFailedRead(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	db.chunkSize = 1000 // fail after some chunks are written
	boom := errors.New("connection reset")
	r := io.MultiReader(bytes.NewReader(make([]byte, 4500)), iotest.ErrReader(boom))
	_, err := db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatch, Filename: "x", Content: r})
	if !errors.Is(err, boom) {
		t.Fatalf("FileInsert = %v, want the read error", err)
	}
	fs, _, err := db.FileList(ctx, &FileListParams{TenantID: ten.ID})
	if err != nil || len(fs) != 0 {
		t.Fatalf("a failed upload left %d files (%v)", len(fs), err)
	}
}

// --- batches ---

func testBatches(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	in := mkFile(t, db, ten.ID, "{}\n{}\n")
	exp := time.Now().Add(24 * time.Hour)
	b, err := db.BatchInsert(ctx, &BatchInsertParams{TenantID: ten.ID, InputFileID: in.ID, Endpoint: "/v1/chat/completions",
		CompletionWindow: "24h", Metadata: json.RawMessage(`{"project":"x"}`), ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != BatchValidating || b.InputFileID != in.ID || b.ExpiresAt == nil || !b.ExpiresAt.Equal(normTime(exp)) ||
		b.OutputFileID != "" || b.InProgressAt != nil {
		t.Fatalf("inserted batch = %+v", b)
	}
	jsonEqual(t, b.Metadata, json.RawMessage(`{"project":"x"}`))
	if got, err := db.BatchGetByID(ctx, b.ID); err != nil || !reflect.DeepEqual(got, b) {
		t.Fatalf("BatchGetByID = %+v, %v", got, err)
	}
	_, err = db.BatchInsert(ctx, &BatchInsertParams{TenantID: ten.ID, InputFileID: "file-missing", Endpoint: "e", CompletionWindow: "24h"})
	wantErr(t, err, ErrNotFound)

	total := int64(2)
	ip, applied, err := db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: b.ID, TenantID: ten.ID,
		From: []BatchStatus{BatchValidating}, To: BatchInProgress, Total: &total})
	if err != nil || !applied || ip.Status != BatchInProgress || ip.InProgressAt == nil || ip.Total != 2 {
		t.Fatalf("validating -> in_progress = %+v applied=%v err=%v", ip, applied, err)
	}
	same, applied, err := db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: b.ID, From: []BatchStatus{BatchValidating}, To: BatchFailed})
	if err != nil || applied || same.Status != BatchInProgress || same.FailedAt != nil {
		t.Fatalf("unmatched From = %+v applied=%v err=%v", same, applied, err)
	}
	fin, _, _ := db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: b.ID, From: []BatchStatus{BatchInProgress}, To: BatchFinalizing})
	outFile := mkFile(t, db, ten.ID, "{}\n")
	done, applied, err := db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: b.ID, From: []BatchStatus{BatchFinalizing},
		To: BatchCompleted, OutputFileID: outFile.ID})
	if err != nil || !applied || done.CompletedAt == nil || done.OutputFileID != outFile.ID || done.ErrorFileID != "" ||
		!done.FinalizingAt.Equal(*fin.FinalizingAt) || !done.InProgressAt.Equal(*ip.InProgressAt) {
		t.Fatalf("finalizing -> completed = %+v applied=%v err=%v", done, applied, err)
	}
	if _, _, err := db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: b.ID, From: []BatchStatus{BatchCompleted}, To: BatchExpired}); err == nil {
		t.Fatal("BatchSetStatus accepted a terminal From")
	}
	_, _, err = db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: "batch_missing", From: []BatchStatus{BatchValidating}, To: BatchFailed})
	wantErr(t, err, ErrNotFound)

	// A failed validation stores its errors.
	bad := mkBatch(t, db, ten.ID)
	errs := json.RawMessage(`{"object":"list","data":[{"code":"invalid_json","line":1}]}`)
	failed, applied, err := db.BatchSetStatus(ctx, &BatchSetStatusParams{ID: bad.ID, From: []BatchStatus{BatchValidating}, To: BatchFailed, Errors: errs})
	if err != nil || !applied || failed.FailedAt == nil {
		t.Fatalf("validating -> failed = %+v applied=%v err=%v", failed, applied, err)
	}
	jsonEqual(t, failed.Errors, errs)

	var active, all []string
	all = append(all, b.ID, bad.ID)
	for i := 0; i < 5; i++ {
		x := mkBatch(t, db, ten.ID)
		all = append(all, x.ID)
		active = append(active, x.ID)
		if i == 1 {
			setBatch(t, db, x.ID, BatchValidating, BatchInProgress)
		}
		if i == 2 {
			setBatch(t, db, x.ID, BatchValidating, BatchInProgress)
			setBatch(t, db, x.ID, BatchInProgress, BatchCancelling)
		}
	}
	checkPages(t, reversed(sortedCopy(all)), 2, func(after string, limit int) ([]*Batch, bool, error) {
		return db.BatchList(ctx, &BatchListParams{TenantID: ten.ID, After: after, Limit: limit})
	}, func(b *Batch) string { return b.ID })
	checkPages(t, sortedCopy(active), 2, func(after string, limit int) ([]*Batch, bool, error) {
		return db.BatchListActive(ctx, &BatchListActiveParams{After: after, Limit: limit})
	}, func(b *Batch) string { return b.ID })
}

func setBatch(t *testing.T, db *DB, id string, from, to BatchStatus) {
	t.Helper()
	if _, applied, err := db.BatchSetStatus(t.Context(), &BatchSetStatusParams{ID: id, From: []BatchStatus{from}, To: to}); err != nil || !applied {
		t.Fatalf("batch %s -> %s: applied=%v err=%v", from, to, applied, err)
	}
}

// --- usage ---

func testUsage(t *testing.T, db *DB) {
	ctx := t.Context()
	a, b := mkTenant(t, db), mkTenant(t, db)
	complete := func(tenant, model, day string, cost money.Micros) {
		p := jobParams(tenant)
		p.Model = model
		j := mkJob(t, db, p)
		res, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: day, PromptTokens: 10, CompletionTokens: 5, Cost: cost})
		if err != nil || !res.Charged {
			t.Fatalf("JobComplete: %+v %v", res, err)
		}
	}
	complete(a.ID, "gpt-4o", "2026-03-01", 100)
	complete(a.ID, "gpt-4o", "2026-03-01", 50)
	complete(a.ID, "gpt-4o-mini", "2026-03-01", 7)
	complete(a.ID, "gpt-4o", "2026-03-02", 1000)
	complete(b.ID, "gpt-4o", "2026-03-01", 3)

	for _, c := range []struct {
		tenant, day string
		want        money.Micros
	}{{a.ID, "2026-03-01", 157}, {a.ID, "2026-03-02", 1000}, {b.ID, "2026-03-01", 3}, {b.ID, "2026-03-02", 0}, {"ten_none", "2026-03-01", 0}} {
		if got, err := db.UsageSumByTenantDay(ctx, c.tenant, c.day); err != nil || got != c.want {
			t.Fatalf("UsageSumByTenantDay(%s, %s) = %d, %v; want %d", c.tenant, c.day, got, err, c.want)
		}
	}
	if got, err := db.UsageSumByDay(ctx, "2026-03-01"); err != nil || got != 160 {
		t.Fatalf("UsageSumByDay = %d, %v; want 160", got, err)
	}
	if got, _ := db.UsageSumByDay(ctx, "2026-01-01"); got != 0 {
		t.Fatalf("UsageSumByDay of an empty day = %d", got)
	}
	// A tenant west of UTC: its day 03-02 ends on UTC's 03-03; the global
	// cap counts the spend on the UTC day, the tenant's cap on its own.
	late := mkJob(t, db, jobParams(b.ID))
	if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: late.ID, Day: "2026-03-02", GlobalDay: "2026-03-03", Cost: 9}); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.UsageSumByDay(ctx, "2026-03-03"); got != 9 {
		t.Fatalf("UsageSumByDay(UTC 03-03) = %d, want 9", got)
	}
	if got, _ := db.UsageSumByTenantDay(ctx, b.ID, "2026-03-02"); got != 9 {
		t.Fatalf("UsageSumByTenantDay(03-02) = %d, want 9", got)
	}
	if e, err := db.UsageGetByJob(ctx, late.ID); err != nil || e.Day != "2026-03-02" || e.GlobalDay != "2026-03-03" {
		t.Fatalf("UsageGetByJob = %+v, %v", e, err)
	}
	rows, err := db.UsageReport(ctx, &UsageReportParams{Day: "2026-03-01"})
	if err != nil {
		t.Fatal(err)
	}
	want := []*UsageReportRow{
		{TenantID: a.ID, Model: "gpt-4o", Requests: 2, PromptTokens: 20, CompletionTokens: 10, Cost: 150},
		{TenantID: a.ID, Model: "gpt-4o-mini", Requests: 1, PromptTokens: 10, CompletionTokens: 5, Cost: 7},
		{TenantID: b.ID, Model: "gpt-4o", Requests: 1, PromptTokens: 10, CompletionTokens: 5, Cost: 3},
	}
	if a.ID > b.ID {
		want = []*UsageReportRow{want[2], want[0], want[1]}
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("UsageReport = %+v\nwant %+v", rows, want)
	}
	rows, err = db.UsageReport(ctx, &UsageReportParams{Day: "2026-03-02", TenantID: a.ID})
	if err != nil || len(rows) != 1 || rows[0].Cost != 1000 {
		t.Fatalf("UsageReport for a tenant = %+v, %v", rows, err)
	}
	if _, err := db.UsageSumByDay(ctx, "yesterday"); err == nil {
		t.Fatal("a malformed day was accepted")
	}
}

// The budget's check of a day against the ledger: the sums of the days
// asked for, by tenant, budget day and UTC day, and a day's rows from a
// time on, oldest first, across pages.
func testUsageDayRows(t *testing.T, db *DB) {
	ctx := t.Context()
	db.streamBatch = 2
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var clock time.Time
	db.now = func() time.Time { return clock }
	a, b := mkTenant(t, db), mkTenant(t, db)
	type row struct {
		tenant, job string
		cost        money.Micros
		at          time.Time
	}
	var rows []row
	complete := func(tenant, day, gday string, cost money.Micros, at time.Duration) row {
		clock = base.Add(at)
		j := mkJob(t, db, jobParams(tenant))
		if res, err := db.JobComplete(ctx, &JobCompleteParams{ID: j.ID, Day: day, GlobalDay: gday, Cost: cost}); err != nil || !res.Charged {
			t.Fatalf("JobComplete: %+v %v", res, err)
		}
		r := row{tenant, j.ID, cost, clock}
		rows = append(rows, r)
		return r
	}
	a1 := complete(a.ID, "2026-03-01", "2026-03-01", 100, 0)
	a2 := complete(a.ID, "2026-03-01", "2026-03-01", 50, time.Second)
	a3 := complete(a.ID, "2026-03-01", "2026-03-01", 7, time.Second) // the same instant: job id orders them
	complete(a.ID, "2026-03-02", "2026-03-02", 1000, 2*time.Second)
	b1 := complete(b.ID, "2026-03-01", "2026-03-01", 3, 3*time.Second)
	complete(b.ID, "2026-03-02", "2026-03-03", 9, 4*time.Second)

	sums, err := db.UsageSumsByDays(ctx, []string{"2026-03-01", "2026-03-02"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[UsageDaySum]bool{}
	for _, s := range sums {
		got[s] = true
	}
	want := map[UsageDaySum]bool{
		{a.ID, "2026-03-01", "2026-03-01", 157}: true, {a.ID, "2026-03-02", "2026-03-02", 1000}: true,
		{b.ID, "2026-03-01", "2026-03-01", 3}: true, {b.ID, "2026-03-02", "2026-03-03", 9}: true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("UsageSumsByDays = %+v, want %+v", sums, want)
	}
	if sums, err := db.UsageSumsByDays(ctx, []string{"2026-01-01"}); err != nil || len(sums) != 0 {
		t.Fatalf("UsageSumsByDays of an empty day = %+v, %v", sums, err)
	}
	if _, err := db.UsageSumsByDays(ctx, []string{"yesterday"}); err == nil {
		t.Fatal("a malformed day was accepted")
	}

	stream := func(read func(func(string, string, money.Micros, time.Time) error) error) []row {
		var out []row
		if err := read(func(tenant, job string, cost money.Micros, at time.Time) error {
			out = append(out, row{tenant, job, cost, at.UTC()})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if a2.job > a3.job {
		a2, a3 = a3, a2
	}
	if got := stream(func(fn func(string, string, money.Micros, time.Time) error) error {
		return db.UsageStreamByTenantDay(ctx, a.ID, "2026-03-01", time.Time{}, fn)
	}); !reflect.DeepEqual(got, []row{a1, a2, a3}) {
		t.Fatalf("UsageStreamByTenantDay = %+v, want %+v", got, []row{a1, a2, a3})
	}
	if got := stream(func(fn func(string, string, money.Micros, time.Time) error) error {
		return db.UsageStreamByTenantDay(ctx, a.ID, "2026-03-01", base.Add(time.Second), fn)
	}); !reflect.DeepEqual(got, []row{a2, a3}) {
		t.Fatalf("UsageStreamByTenantDay from the second row's time = %+v, want %+v", got, []row{a2, a3})
	}
	if got := stream(func(fn func(string, string, money.Micros, time.Time) error) error {
		return db.UsageStreamByDay(ctx, "2026-03-01", time.Time{}, fn)
	}); !reflect.DeepEqual(got, []row{a1, a2, a3, b1}) {
		t.Fatalf("UsageStreamByDay = %+v, want %+v", got, []row{a1, a2, a3, b1})
	}
	stop := errors.New("stop")
	n := 0
	if err := db.UsageStreamByDay(ctx, "2026-03-01", time.Time{}, func(string, string, money.Micros, time.Time) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("a stream fn's error: %v after %d rows, want stop after 1", err, n)
	}
}

// --- locks and times ---

func testTryLock(t *testing.T, db *DB) {
	ctx := t.Context()
	unlock, ok, err := db.TryLock(ctx, "reconciler")
	if err != nil || !ok {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	// Held: nobody else gets it, from any goroutine.
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok, err := db.TryLock(ctx, "reconciler"); err != nil || ok {
				t.Errorf("TryLock while held = %v, %v", ok, err)
			}
		}()
	}
	wg.Wait()
	other, ok, err := db.TryLock(ctx, "sweeper")
	if err != nil || !ok {
		t.Fatalf("another name is independent: %v, %v", ok, err)
	}
	other()
	unlock()
	unlock() // harmless
	again, ok, err := db.TryLock(ctx, "reconciler")
	if err != nil || !ok {
		t.Fatalf("TryLock after unlock = %v, %v", ok, err)
	}
	again()
}

func testTimesAreUTC(t *testing.T, db *DB) {
	ctx := t.Context()
	local := time.FixedZone("UTC+5", 5*3600)
	db.now = func() time.Time { return time.Date(2026, 3, 1, 23, 59, 59, 987654321, local) }
	ten := mkTenant(t, db)
	j := mkJob(t, db, jobParams(ten.ID))
	got, err := db.JobGetByID(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 3, 1, 18, 59, 59, 987654000, time.UTC)
	for name, ts := range map[string]time.Time{"tenant": ten.CreatedAt, "inserted": j.CreatedAt, "read": got.CreatedAt, "updated": got.UpdatedAt} {
		if !ts.Equal(want) || ts.Location() != time.UTC {
			t.Fatalf("%s time = %v, want %v", name, ts, want)
		}
	}
}

// testBatchRefusedLines stores a batch's refused lines as failed jobs in the
// same bulk insert as its valid ones, and its generated output file as a
// description only.
func testBatchRefusedLines(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	in := mkFile(t, db, ten.ID, "{}\nnot json\n")
	b, err := db.BatchInsert(ctx, &BatchInsertParams{TenantID: ten.ID, InputFileID: in.ID, Endpoint: "/v1/chat/completions",
		CompletionWindow: "24h", WebhookURL: "https://example.com/hook"})
	if err != nil || b.WebhookURL != "https://example.com/hook" {
		t.Fatalf("BatchInsert = %+v, %v", b, err)
	}
	ok := jobParams(ten.ID)
	ok.BatchID, ok.LineNo, ok.Queue = b.ID, 1, "batch"
	refusal := &JobError{Message: "Line 2 is not JSON.", Type: "invalid_request_error", Code: "invalid_json"}
	refused := &JobInsertParams{TenantID: ten.ID, BatchID: b.ID, LineNo: 2, Endpoint: "/v1/chat/completions",
		Queue: "batch", Status: JobFailed, Error: refusal}
	ids, err := db.JobInsertMany(ctx, &JobInsertManyParams{Jobs: []*JobInsertParams{ok, refused}})
	if err != nil {
		t.Fatalf("JobInsertMany: %v", err)
	}
	j, err := db.JobGetByID(ctx, ids[1])
	if err != nil || j.Status != JobFailed || j.FinishedAt == nil || j.Error == nil || *j.Error != *refusal || j.Model != "" {
		t.Fatalf("refused line = %+v, %v", j, err)
	}
	if c, _ := db.JobCountsByBatch(ctx, b.ID); c.Queued != 1 || c.Failed != 1 {
		t.Fatalf("counts = %+v", c)
	}
	// Only a failed job may carry an Error, and only failed is terminal at insert.
	bad := jobParams(ten.ID)
	bad.Error = refusal
	if _, err := db.JobInsertMany(ctx, &JobInsertManyParams{Jobs: []*JobInsertParams{bad}}); err == nil {
		t.Fatal("JobInsertMany accepted an Error on a queued job")
	}
	done := jobParams(ten.ID)
	done.Status = JobSucceeded
	if _, err := db.JobInsertMany(ctx, &JobInsertManyParams{Jobs: []*JobInsertParams{done}}); err == nil {
		t.Fatal("JobInsertMany accepted a succeeded job")
	}

	out, err := db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatchOutput, Filename: "out.jsonl",
		BatchID: b.ID, Generated: true, Bytes: 1234, Lines: 7})
	if err != nil || out.Bytes != 1234 || out.Lines != 7 || out.BatchID != b.ID {
		t.Fatalf("generated file = %+v, %v", out, err)
	}
	if _, err := db.FileInsert(ctx, &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatchOutput, Filename: "x",
		Generated: true, Content: bytes.NewReader(nil)}); err == nil {
		t.Fatal("FileInsert accepted content for a generated file")
	}

	// A file a batch uses cannot be deleted; another tenant's is not found;
	// a free one goes with its content.
	wantErr(t, db.FileDelete(ctx, ten.ID, in.ID), ErrConflict)
	other := mkTenant(t, db)
	free := mkFile(t, db, ten.ID, "{}\n")
	wantErr(t, db.FileDelete(ctx, other.ID, free.ID), ErrNotFound)
	if err := db.FileDelete(ctx, ten.ID, free.ID); err != nil {
		t.Fatalf("FileDelete: %v", err)
	}
	_, err = db.FileGetByID(ctx, free.ID)
	wantErr(t, err, ErrNotFound)
	wantErr(t, db.FileDelete(ctx, ten.ID, free.ID), ErrNotFound)
	var chunks int
	if err := db.ro.queryRow(ctx, `SELECT count(*) FROM file_chunks WHERE file_id = $1`, free.ID).Scan(&chunks); err != nil || chunks != 0 {
		t.Fatalf("%d chunks left (%v)", chunks, err)
	}
}

// --- webhooks ---

func testWebhooksPending(t *testing.T, db *DB) {
	ctx := t.Context()
	ten := mkTenant(t, db)
	hooked := func() *Job {
		p := jobParams(ten.ID)
		p.WebhookURL = "https://example.com/hook"
		return mkJob(t, db, p)
	}
	pending := func(kind string, before time.Time) []string {
		t.Helper()
		var ids []string
		for after := ""; ; {
			refs, more, err := db.WebhookListPending(ctx, &WebhookListPendingParams{Kind: kind, FinishedBefore: before, After: after, Limit: 2})
			if err != nil {
				t.Fatalf("WebhookListPending %s: %v", kind, err)
			}
			for _, r := range refs {
				if r.Kind != kind {
					t.Fatalf("ref %+v has kind %q", r, r.Kind)
				}
				ids = append(ids, r.ID)
			}
			if !more {
				return ids
			}
			after = refs[len(refs)-1].ID
		}
	}
	unfinished := hooked()
	succeeded, failed, cancelled := hooked(), hooked(), hooked()
	if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: succeeded.ID, Day: "2026-03-01"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.JobFail(ctx, &JobFailParams{ID: failed.ID, Error: JobError{Message: "x"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.JobCancel(ctx, ten.ID, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	plain := mkJob(t, db, jobParams(ten.ID)) // no webhook
	if _, err := db.JobComplete(ctx, &JobCompleteParams{ID: plain.ID, Day: "2026-03-01"}); err != nil {
		t.Fatal(err)
	}
	soon := time.Now().Add(time.Hour)
	want := sortedCopy([]string{succeeded.ID, failed.ID, cancelled.ID})
	if got := pending(WebhookJob, soon); !slices.Equal(got, want) {
		t.Fatalf("pending job webhooks = %v, want the three finished ones %v (not %s, unfinished)", got, want, unfinished.ID)
	}
	if got := pending(WebhookJob, time.Now().Add(-time.Hour)); len(got) != 0 {
		t.Fatalf("finished before an hour ago: %v", got)
	}
	if err := db.WebhookDone(ctx, WebhookRef{Kind: WebhookJob, ID: failed.ID}); err != nil {
		t.Fatal(err)
	}
	if err := db.WebhookDone(ctx, WebhookRef{Kind: WebhookJob, ID: failed.ID}); err != nil {
		t.Fatalf("done twice: %v", err)
	}
	if got := pending(WebhookJob, soon); !slices.Equal(got, sortedCopy([]string{succeeded.ID, cancelled.ID})) {
		t.Fatalf("after one is done: %v", got)
	}
	wantErr(t, db.WebhookDone(ctx, WebhookRef{Kind: WebhookJob, ID: "job_nope"}), ErrNotFound)
	if err := db.WebhookDone(ctx, WebhookRef{Kind: "file", ID: failed.ID}); err == nil {
		t.Fatal("an unknown kind was accepted")
	}

	f := mkFile(t, db, ten.ID, "{}\n")
	b, err := db.BatchInsert(ctx, &BatchInsertParams{TenantID: ten.ID, InputFileID: f.ID, Endpoint: "/v1/chat/completions",
		CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour), WebhookURL: "https://example.com/b"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pending(WebhookBatch, soon); len(got) != 0 {
		t.Fatalf("a validating batch's webhook is pending: %v", got)
	}
	setBatch(t, db, b.ID, BatchValidating, BatchFailed)
	if got := pending(WebhookBatch, soon); !slices.Equal(got, []string{b.ID}) {
		t.Fatalf("pending batch webhooks = %v, want %s", got, b.ID)
	}
	if err := db.WebhookDone(ctx, WebhookRef{Kind: WebhookBatch, ID: b.ID}); err != nil {
		t.Fatal(err)
	}
	if got := pending(WebhookBatch, soon); len(got) != 0 {
		t.Fatalf("a done batch webhook is pending: %v", got)
	}
}

// A running job is held by the worker that started it: no other delivery
// starts it while that worker beats; once it has not beaten for
// WorkerDeadAfter, JobHandOff takes the job back, once, and another worker
// may start it.
func testWorkerLease(t *testing.T, db *DB) {
	ctx := t.Context()
	now := time.Now()
	db.now = func() time.Time { return now }
	defer func() { db.now = time.Now }()
	ten := mkTenant(t, db)
	j := mkJob(t, db, jobParams(ten.ID))
	other := mkJob(t, db, jobParams(ten.ID))
	for _, w := range []string{"wa", "wb"} {
		if err := db.WorkerBeat(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if _, started, err := db.JobStart(ctx, j.ID, "wa"); err != nil || !started {
		t.Fatalf("wa's JobStart = %v, %v", started, err)
	}
	if _, started, err := db.JobStart(ctx, other.ID, "wa"); err != nil || !started {
		t.Fatalf("wa's JobStart of another = %v, %v", started, err)
	}
	// wa's own redelivery starts it again; wb's does not while wa beats.
	if _, started, err := db.JobStart(ctx, j.ID, "wa"); err != nil || !started {
		t.Fatalf("wa's second JobStart = %v, %v", started, err)
	}
	if got, started, err := db.JobStart(ctx, j.ID, "wb"); err != nil || started || got.Status != JobRunning {
		t.Fatalf("wb's JobStart while wa beats = %v, %v, %v; want refused", started, err, got)
	}
	if handed, err := db.JobHandOff(ctx, 10); err != nil || len(handed) != 0 {
		t.Fatalf("JobHandOff while wa beats = %d, %v", len(handed), err)
	}
	// A move lets go: the other job, released by wa, is wb's to start.
	if err := db.JobRelease(ctx, other.ID, "wa"); err != nil {
		t.Fatal(err)
	}
	if _, started, err := db.JobStart(ctx, other.ID, "wb"); err != nil || !started {
		t.Fatalf("wb's JobStart of a released job = %v, %v", started, err)
	}

	// wa stops beating; wb goes on.
	now = now.Add(WorkerDeadAfter + time.Second)
	if err := db.WorkerBeat(ctx, "wb"); err != nil {
		t.Fatal(err)
	}
	handed, err := db.JobHandOff(ctx, 10)
	if err != nil || len(handed) != 1 || handed[0].ID != j.ID || handed[0].Status != JobQueued {
		t.Fatalf("JobHandOff after wa died = %+v, %v; want %s queued", handed, err, j.ID)
	}
	if again, err := db.JobHandOff(ctx, 10); err != nil || len(again) != 0 {
		t.Fatalf("second JobHandOff = %d, %v; want none", len(again), err)
	}
	if _, started, err := db.JobStart(ctx, j.ID, "wb"); err != nil || !started {
		t.Fatalf("wb's JobStart after the hand-off = %v, %v", started, err)
	}
	// A worker that leaves (WorkerGone) has its jobs handed on at once.
	if err := db.WorkerGone(ctx, "wb"); err != nil {
		t.Fatal(err)
	}
	handed, err = db.JobHandOff(ctx, 10)
	if err != nil || len(handed) != 2 {
		t.Fatalf("JobHandOff after wb left = %d, %v; want its 2 jobs", len(handed), err)
	}
	// Finishing clears the hold.
	if _, _, err := db.JobStart(ctx, j.ID, "wc"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.JobFail(ctx, &JobFailParams{ID: j.ID, Error: JobError{Type: "server_error", Code: "x", Message: "x"}}); err != nil {
		t.Fatal(err)
	}
	var holder *string
	if err := db.rw.queryRow(ctx, `SELECT worker_id FROM jobs WHERE id = $1`, j.ID).Scan(&holder); err != nil || holder != nil {
		t.Fatalf("a failed job's worker_id = %v, %v; want NULL", holder, err)
	}
}
