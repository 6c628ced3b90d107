package batch_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/batch/batchtest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// TestUnstorableLinesAreRefused runs a file whose valid lines are mixed
// with lines the database could not store (invalid UTF-8, NUL raw or
// escaped, unpaired surrogates, a number beyond numeric's range): those are
// refused with their line numbers, the batch completes, and its valid lines
// run, on both backends.
func TestUnstorableLinesAreRefused(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			var env func(*config.Env)
			if backend == "sqlite" {
				dir := t.TempDir()
				env = func(e *config.Env) { e.DatabaseURL = "sqlite://" + dir + "/llmq.db" }
			}
			testUnstorableLinesAreRefused(t, start(t, 0, env))
		})
	}
}

func testUnstorableLinesAreRefused(t *testing.T, a *apptest.App) {
	_, key := a.Tenant("standard")
	withPrompt := func(id, prompt string) string { return strings.Replace(batchtest.ChatLine(id), "Say hi", prompt, 1) }
	// batchtest.ChatLine quotes its custom id: these are written as they are.
	withCustomID := func(raw string) string {
		return strings.Replace(batchtest.ChatLine("x"), `"custom_id":"x"`, `"custom_id":"`+raw+`"`, 1)
	}
	in := []string{
		batchtest.ChatLine("ok-1"),
		withPrompt("latin1", "Caf\xe9 au lait"), // 2: a raw Latin-1 byte
		withCustomID(`bad\u0000`),               // 3
		batchtest.ChatLine("ok-2"),
		withPrompt("nul-body", `a\u0000b`), // 5
		withPrompt("lone-high", `\ud83d!`), // 6
		strings.Replace(batchtest.ChatLine("huge"), `"max_tokens":20`, `"max_tokens":20,"seed":1e200000`, 1), // 7
		withPrompt("raw-nul", "a\x00b"), // 8
		withCustomID(`lone-low\udc00`),  // 9
		// What must pass: an escaped backslash before "u0000", a surrogate
		// pair, and text that is UTF-8 beyond ASCII.
		withPrompt("ok-3", `C:\\u0000 \ud83d\ude00 café`),
		// A member named twice, and nesting deeper than any store takes
		// (SQLite refuses past 1,000; this is 2,000).
		strings.Replace(batchtest.ChatLine("twice"), `"max_tokens":20`, `"max_tokens":100000,"max_tokens":20`, 1),                                            // 11
		strings.Replace(batchtest.ChatLine("deep"), `"max_tokens":20`, `"max_tokens":20,"metadata":`+strings.Repeat("[", 2000)+strings.Repeat("]", 2000), 1), // 12
	}
	type refusal struct {
		code            client.Code
		param, customID string
	}
	want := map[int]refusal{
		2:  {client.CodeInvalidEncoding, "", ""},
		3:  {client.CodeInvalidEncoding, "custom_id", ""},
		5:  {client.CodeInvalidEncoding, "body", "nul-body"},
		6:  {client.CodeInvalidEncoding, "body", "lone-high"},
		7:  {client.CodeNumberOutOfRange, "body", "huge"},
		8:  {client.CodeInvalidEncoding, "", ""},
		9:  {client.CodeInvalidEncoding, "custom_id", ""},
		11: {client.CodeDuplicateKey, "body", "twice"},
		12: {client.CodeTooDeep, "body", "deep"},
	}
	b := validated(t, a, key, in, nil)
	if b.Status != "in_progress" || b.RequestCounts.Total != int64(len(in)) {
		t.Fatalf("validated batch = %+v", b)
	}
	runJobs(t, a, b.ID, len(in))
	b = waitStatus(t, a, key, b.ID, "completed", 10*time.Second)
	if wantCounts := (client.BatchRequestCounts{Total: 12, Completed: 3, Failed: 9}); b.RequestCounts != wantCounts {
		t.Fatalf("counts = %+v, want %+v", b.RequestCounts, wantCounts)
	}
	out := results(t, a, key, *b.OutputFileID)
	if len(out) != 3 {
		t.Fatalf("output has %d lines, want 3", len(out))
	}
	for i, id := range []string{"ok-1", "ok-2", "ok-3"} {
		if out[i].CustomID != id || !strings.HasPrefix(batchtest.AnswerOf(out[i].Response.Body), id) {
			t.Fatalf("output line %d = %+v, want the answer to %s", i+1, out[i], id)
		}
	}
	errs := results(t, a, key, *b.ErrorFileID)
	if len(errs) != len(want) {
		t.Fatalf("error file has %d lines, want %d: %+v", len(errs), len(want), errs)
	}
	for _, r := range errs {
		w, ok := want[r.Error.Line]
		if !ok || r.Error.Code != w.code || r.CustomID != w.customID || !strings.HasPrefix(r.Error.Message, "Line ") ||
			!strings.Contains(r.Error.Message, "cannot be stored") && !strings.Contains(r.Error.Message, "must be UTF-8") &&
				!strings.Contains(r.Error.Message, "may be named once") && !strings.Contains(r.Error.Message, "does not take") {
			t.Fatalf("error line for input line %d = %+v (custom_id %q), want %+v", r.Error.Line, r.Error, r.CustomID, w)
		}
	}
	if b.Errors == nil || len(b.Errors.Data) != len(want) {
		t.Fatalf("errors = %+v", b.Errors)
	}
	for _, e := range b.Errors.Data {
		w := want[*e.Line]
		if e.Code != w.code || (e.Param == nil) != (w.param == "") || e.Param != nil && *e.Param != w.param {
			t.Fatalf("errors entry for line %d = %+v, want %+v", *e.Line, e, w)
		}
	}
}

// TestValidatingBatchExpires expires a batch still validating at the end of
// its window (an injected clock), as one whose validation kept failing
// would be: the jobs it stored are cancelled, nothing was enqueued, and its
// counts agree with its error file.
func TestValidatingBatchExpires(t *testing.T) {
	t.Parallel()
	a := start(t, 0, nil)
	tenant, key := a.Tenant("standard")
	fileID := upload(t, a, key, []byte(strings.Join(lines(20), "\n")+"\n"))
	ctx := context.Background()
	// A pass stored lines 1-8, then stopped.
	bt := partlyValidated(t, a, tenant, fileID, 8)
	late := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{
		Now: func() time.Time { return bt.ExpiresAt.Add(time.Second) }})
	t.Cleanup(func() { _ = late.Close() })
	if err := late.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	b := getBatch(t, a, key, bt.ID)
	if want := (client.BatchRequestCounts{Total: 8, Failed: 8}); b.Status != "expired" || b.ExpiredAt == nil || b.RequestCounts != want ||
		b.OutputFileID != nil || b.ErrorFileID == nil {
		t.Fatalf("batch = %+v, want expired with counts %+v", b, want)
	}
	if b.Errors == nil || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != client.CodeBatchExpired {
		t.Fatalf("errors = %+v", b.Errors)
	}
	errs := results(t, a, key, *b.ErrorFileID)
	if len(errs) != 8 {
		t.Fatalf("error file has %d lines, want 8", len(errs))
	}
	for i, r := range errs {
		if r.Error == nil || r.Error.Code != client.CodeBatchExpired || r.Error.Line != i+1 {
			t.Fatalf("error line %d = %+v", i+1, r)
		}
	}
	// Validating it now, or sweeping again, changes nothing.
	if err := late.Validate(ctx, bt.ID); err != nil {
		t.Fatal(err)
	}
	if err := late.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if again := getBatch(t, a, key, bt.ID); again.Status != "expired" || again.RequestCounts != b.RequestCounts {
		t.Fatalf("batch after another sweep = %+v", again)
	}
	if n := a.TaskCount(); n != 0 {
		t.Fatalf("%d tasks in Redis for a batch that expired while validating", n)
	}
}

// unstorableBatch validates a batch of six lines, in groups of two, after
// adding constraint to the jobs table: the database refuses some line for
// good (SQLSTATE 23514), as it refuses a value it cannot hold.
func unstorableBatch(t *testing.T, constraint string, in []string) (*apptest.App, string, *client.Batch, *batch.Service) {
	t.Helper()
	a := start(t, 0, nil)
	tenant, key := a.Tenant("standard")
	db, err := sql.Open("pgx", testutil.PlainDSN(envValue(a.Environ, "LLMQ_DATABASE_URL")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `ALTER TABLE jobs ADD CONSTRAINT unstorable CHECK (`+constraint+`)`); err != nil {
		t.Fatal(err)
	}
	fileID := upload(t, a, key, []byte(strings.Join(in, "\n")+"\n"))
	bt, err := a.Store.BatchInsert(ctx, &store.BatchInsertParams{TenantID: tenant, InputFileID: fileID,
		Endpoint: "/v1/chat/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	svc := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{GroupLines: 2})
	t.Cleanup(func() { _ = svc.Close() })
	if err := svc.Validate(ctx, bt.ID); err != nil {
		t.Fatalf("Validate = %v, want no error", err)
	}
	b := getBatch(t, a, key, bt.ID)
	for _, e := range b.Errors.Data {
		if strings.Contains(e.Message, "SQLSTATE") || strings.Contains(e.Message, "violates") {
			t.Fatalf("the database's words reached the tenant: %+v", e)
		}
	}
	return a, key, &b, svc
}

// A line the database refuses for good fails alone, in llmq's words: the
// rest of the batch runs.
func TestUnstorableLineFailsAlone(t *testing.T) {
	t.Parallel()
	in := lines(6)
	in[3] = batchtest.ChatLine("poison") // line 4, in the second group of two
	a, key, b, _ := unstorableBatch(t, "custom_id IS DISTINCT FROM 'poison'", in)
	if want := (client.BatchRequestCounts{Total: 6, Failed: 1}); b.Status != "in_progress" || b.RequestCounts != want {
		t.Fatalf("batch = %+v, want in progress with counts %+v", b, want)
	}
	if b.Errors == nil || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != client.CodeLineUnstorable || b.Errors.Data[0].Line == nil ||
		*b.Errors.Data[0].Line != 4 {
		t.Fatalf("errors = %+v, want line 4's alone", b.Errors)
	}
	var page struct {
		Data []client.Job `json:"data"`
	}
	a.Do("GET", "/v1/jobs?status=queued&batch_id="+b.ID, key, nil).JSON(t, &page)
	if len(page.Data) != 5 {
		t.Fatalf("%d queued jobs, want the 5 good lines", len(page.Data))
	}
}

// When even a line's failure cannot be stored, the batch fails, in llmq's
// words: what it stored is cancelled, nothing runs, and the sweeper leaves
// it alone.
func TestUnstorableGroupFailsTheBatch(t *testing.T) {
	t.Parallel()
	a, key, b, svc := unstorableBatch(t, "line_no IS DISTINCT FROM 4", lines(6))
	ctx := context.Background()
	// lines 1 and 2 stored, then line 3 alone before line 4 failed for good
	if want := (client.BatchRequestCounts{Total: 3, Failed: 3}); b.Status != "failed" || b.FailedAt == nil || b.RequestCounts != want ||
		b.InProgressAt != nil || b.ErrorFileID == nil {
		t.Fatalf("batch = %+v, want failed with counts %+v", b, want)
	}
	if b.Errors == nil || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != client.CodeValidationFailed ||
		!strings.Contains(b.Errors.Data[0].Message, "Lines 3 to 4 could not be stored") {
		t.Fatalf("errors = %+v", b.Errors)
	}
	errs := results(t, a, key, *b.ErrorFileID)
	if len(errs) != 3 || errs[0].Error.Code != client.CodeBatchFailed || errs[0].Error.Line != 1 || errs[2].Error.Line != 3 {
		t.Fatalf("error file = %+v", errs)
	}
	if err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if again := getBatch(t, a, key, b.ID); again.Status != "failed" || again.RequestCounts != b.RequestCounts {
		t.Fatalf("batch after a sweep = %+v", again)
	}
	if n := a.TaskCount(); n != 0 {
		t.Fatalf("%d tasks in Redis for a batch that failed validating", n)
	}
}
