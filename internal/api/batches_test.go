package api_test

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
)

// part is one field of a multipart body: a file when filename is set.
type part struct{ name, filename, content string }

func multipartBody(parts ...part) ([]byte, http.Header) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, p := range parts {
		if p.filename != "" {
			w, _ := mw.CreateFormFile(p.name, p.filename)
			_, _ = w.Write([]byte(p.content))
		} else {
			_ = mw.WriteField(p.name, p.content)
		}
	}
	_ = mw.Close()
	return b.Bytes(), http.Header{"Content-Type": {mw.FormDataContentType()}}
}

func uploadParts(t *testing.T, a *apptest.App, key string, parts ...part) *apptest.Response {
	t.Helper()
	body, h := multipartBody(parts...)
	return apptest.Do(t, a.URL, "POST", "/v1/files", key, body, h)
}

func jsonl(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, `{"custom_id":"r%d","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}`+"\n", i)
	}
	return b.String()
}

// TestFileUploadRefusalsChangeNothing refuses every bad upload with the one
// error shape and stores nothing for it.
func TestFileUploadRefusalsChangeNothing(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: func(e *config.Env) { e.MaxFileBytes, e.MaxFileLines = 2000, 5 }})
	tenant, key := a.Tenant("standard")
	file := func(content string) part { return part{"file", "in.jsonl", content} }
	purpose := func(p string) part { return part{"purpose", "", p} }
	cases := []struct {
		name   string
		parts  []part
		status int
		code   client.Code
		param  string
	}{
		{"wrong purpose", []part{purpose("fine-tune"), file(jsonl(1))}, 400, client.CodeInvalidValue, "purpose"},
		{"wrong purpose after the file", []part{file(jsonl(1)), purpose("assistants")}, 400, client.CodeInvalidValue, "purpose"},
		{"no purpose", []part{file(jsonl(1))}, 400, client.CodeMissingRequiredParameter, "purpose"},
		{"no file", []part{purpose("batch")}, 400, client.CodeMissingRequiredParameter, "file"},
		{"two files", []part{purpose("batch"), file(jsonl(1)), file(jsonl(1))}, 400, client.CodeInvalidValue, "file"},
		{"over the byte limit", []part{purpose("batch"), file(strings.Repeat("x", 2001))}, 413, client.CodeFileTooLarge, "file"},
		{"over the byte limit, spooled", []part{file(strings.Repeat("x", 5000)), purpose("batch")}, 413, client.CodeFileTooLarge, "file"},
		{"over the line limit", []part{purpose("batch"), file(strings.Repeat("{}\n", 6))}, 400, client.CodeTooManyLines, "file"},
		{"over the line limit without a last newline", []part{purpose("batch"), file(strings.Repeat("{}\n", 5) + "{}")}, 400, client.CodeTooManyLines, "file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, uploadParts(t, a, key, c.parts...), c.status, c.code, c.param)
		})
	}
	checkError(t, a.Do("POST", "/v1/files", key, map[string]any{"purpose": "batch"}), 400, client.CodeInvalidContentType, "")
	checkError(t, apptest.Do(t, a.URL, "POST", "/v1/files", key, "--x\r\nbroken", http.Header{"Content-Type": {"multipart/form-data; boundary=x"}}),
		400, client.CodeInvalidMultipart, "")
	fs, _, err := a.Store.FileList(context.Background(), &store.FileListParams{TenantID: tenant})
	if err != nil || len(fs) != 0 {
		t.Fatalf("refused uploads stored %d files (%v)", len(fs), err)
	}

	// At the limits exactly, the file is taken, in either order of fields.
	for _, parts := range [][]part{{purpose("batch"), file(strings.Repeat("{}\n", 5))}, {file(strings.Repeat("{}\n", 4) + "{}"), purpose("batch")}} {
		r := uploadParts(t, a, key, parts...)
		var f client.File
		r.JSON(t, &f)
		if r.Status != 200 || f.Object != "file" || f.Purpose != "batch" || f.Status != "processed" || f.Filename != "in.jsonl" {
			t.Fatalf("upload at the limits: %d %s", r.Status, r.Body)
		}
	}
}

// TestFilesRoundTripAndIsolation reads back what was uploaded, byte for
// byte, and hides every tenant's files from the others.
func TestFilesRoundTripAndIsolation(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, keyA := a.Tenant("standard")
	_, keyB := a.Tenant("standard")
	// 3 MiB across several stored chunks, with a name that needs cleaning.
	content := strings.Repeat(jsonl(1), 3<<20/len(jsonl(1)))
	r := uploadParts(t, a, keyA, part{"purpose", "", "batch"}, part{"file", `C:\data\my "input".jsonl`, content})
	var f client.File
	r.JSON(t, &f)
	if r.Status != 200 || f.Bytes != int64(len(content)) || f.Filename != `my "input".jsonl` || !strings.HasPrefix(f.ID, "file-") {
		t.Fatalf("upload: %d %s", r.Status, r.Body)
	}
	got := a.Do("GET", "/v1/files/"+f.ID+"/content", keyA, nil)
	if got.Status != 200 || !bytes.Equal(got.Body, []byte(content)) {
		t.Fatalf("content: %d, %d bytes back of %d", got.Status, len(got.Body), len(content))
	}
	var again client.File
	a.Do("GET", "/v1/files/"+f.ID, keyA, nil).JSON(t, &again)
	if again != f {
		t.Fatalf("GET = %+v, upload answered %+v", again, f)
	}
	var l client.List[client.File]
	a.Do("GET", "/v1/files?purpose=batch", keyA, nil).JSON(t, &l)
	if len(l.Data) != 1 || l.Data[0].ID != f.ID {
		t.Fatalf("list = %+v", l)
	}
	checkError(t, a.Do("GET", "/v1/files?purpose=fine-tune", keyA, nil), 400, client.CodeInvalidValue, "purpose")

	checkError(t, a.Do("GET", "/v1/files/"+f.ID, keyB, nil), 404, client.CodeNotFound, "")
	checkError(t, a.Do("GET", "/v1/files/"+f.ID+"/content", keyB, nil), 404, client.CodeNotFound, "")
	checkError(t, a.Do("GET", "/v1/files/file-nosuchfile000000000000000", keyA, nil), 404, client.CodeNotFound, "")
	a.Do("GET", "/v1/files", keyB, nil).JSON(t, &l)
	if len(l.Data) != 0 {
		t.Fatalf("tenant B lists A's files: %+v", l)
	}

	// Delete: not another tenant's file, not the input of a batch that has
	// not ended; then gone.
	checkError(t, a.Do("DELETE", "/v1/files/"+f.ID, keyB, nil), 404, client.CodeNotFound, "")
	small := uploadParts(t, a, keyA, part{"purpose", "", "batch"}, part{"file", "in.jsonl", jsonl(2)}).Map(t)["id"].(string)
	r = a.Do("POST", "/v1/batches", keyA, map[string]any{"input_file_id": small, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
	if r.Status != 200 {
		t.Fatalf("create batch: %d %s", r.Status, r.Body)
	}
	batchID := r.Map(t)["id"].(string)
	checkError(t, a.Do("DELETE", "/v1/files/"+small, keyA, nil), 409, client.CodeFileInUse, "")
	// Once the batch has ended, its input file goes; the batch still names it.
	// The batch may have moved on, or even ended, while the test ran.
	ended, _, err := a.Store.BatchSetStatus(context.Background(), &store.BatchSetStatusParams{ID: batchID,
		From: []store.BatchStatus{store.BatchValidating, store.BatchInProgress, store.BatchFinalizing, store.BatchCancelling},
		To:   store.BatchCancelled})
	if err != nil || !ended.Status.Terminal() {
		t.Fatalf("end the batch: %+v, %v", ended, err)
	}
	if r := a.Do("DELETE", "/v1/files/"+small, keyA, nil); r.Status != 200 {
		t.Fatalf("delete an ended batch's input file: %d %s", r.Status, r.Body)
	}
	if b := a.Do("GET", "/v1/batches/"+batchID, keyA, nil).Map(t); b["input_file_id"] != small || b["status"] != string(ended.Status) {
		t.Fatalf("the batch after its input file went: %v", b)
	}
	var del client.FileDeleted
	if r := a.Do("DELETE", "/v1/files/"+f.ID, keyA, nil); r.Status != 200 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	} else if r.JSON(t, &del); del != (client.FileDeleted{ID: f.ID, Object: "file", Deleted: true}) {
		t.Fatalf("delete answered %+v", del)
	}
	checkError(t, a.Do("GET", "/v1/files/"+f.ID+"/content", keyA, nil), 404, client.CodeNotFound, "")
}

// TestBatchRefusalsChangeNothing refuses every bad batch at once and creates
// nothing; another tenant's file or batch is not found.
func TestBatchRefusalsChangeNothing(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenantA, keyA := a.Tenant("standard")
	tenantB, keyB := a.Tenant("standard")
	upload := func(key, content string) string {
		r := uploadParts(t, a, key, part{"purpose", "", "batch"}, part{"file", "in.jsonl", content})
		if r.Status != 200 {
			t.Fatalf("upload: %d %s", r.Status, r.Body)
		}
		return r.Map(t)["id"].(string)
	}
	fileA, fileB := upload(keyA, jsonl(3)), upload(keyB, jsonl(3))
	empty := upload(keyA, "")
	out, err := a.Store.FileInsert(context.Background(), &store.FileInsertParams{TenantID: tenantA, Purpose: store.FilePurposeBatchOutput,
		Filename: "out.jsonl", Generated: true})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(extra map[string]any) map[string]any {
		m := map[string]any{"input_file_id": fileA, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name   string
		body   any
		status int
		code   client.Code
		param  string
	}{
		{"unknown field", ok(map[string]any{"priority": "high"}), 400, client.CodeUnknownField, "priority"},
		{"no input file", ok(map[string]any{"input_file_id": ""}), 400, client.CodeMissingRequiredParameter, "input_file_id"},
		{"no endpoint", ok(map[string]any{"endpoint": ""}), 400, client.CodeMissingRequiredParameter, "endpoint"},
		{"unknown endpoint", ok(map[string]any{"endpoint": "/v1/completions"}), 400, client.CodeInvalidValue, "endpoint"},
		{"48h window", ok(map[string]any{"completion_window": "48h"}), 400, client.CodeInvalidValue, "completion_window"},
		{"no window", ok(map[string]any{"completion_window": ""}), 400, client.CodeInvalidValue, "completion_window"},
		{"unknown file", ok(map[string]any{"input_file_id": "file-nosuchfile000000000000000"}), 404, client.CodeNotFound, "input_file_id"},
		{"another tenant's file", ok(map[string]any{"input_file_id": fileB}), 404, client.CodeNotFound, "input_file_id"},
		{"output file as input", ok(map[string]any{"input_file_id": out.ID}), 400, client.CodeInvalidFilePurpose, "input_file_id"},
		{"empty file", ok(map[string]any{"input_file_id": empty}), 400, client.CodeEmptyFile, "input_file_id"},
		{"too much metadata", ok(map[string]any{"metadata": manyKeys(17)}), 400, client.CodeInvalidMetadata, "metadata"},
		{"bad webhook", ok(map[string]any{"webhook_url": "ftp://x"}), 400, client.CodeInvalidURL, "webhook_url"},
		{"internal webhook", ok(map[string]any{"webhook_url": "http://169.254.169.254/latest/meta-data/"}), 400, client.CodeWebhookURLInternal, "webhook_url"},
		{"not JSON", `{"input_file_id":`, 400, client.CodeInvalidJSON, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, a.Do("POST", "/v1/batches", keyA, c.body), c.status, c.code, c.param)
		})
	}
	checkError(t, a.Do("GET", "/v1/batches?limit=0", keyA, nil), 400, client.CodeInvalidValue, "limit")
	checkError(t, a.Do("GET", "/v1/batches?limit=101", keyA, nil), 400, client.CodeInvalidValue, "limit")
	if bs, _, err := a.Store.BatchList(context.Background(), &store.BatchListParams{TenantID: tenantA}); err != nil || len(bs) != 0 {
		t.Fatalf("refused batches created %d (%v)", len(bs), err)
	}
	nothingQueued(t, a, tenantA)

	// B's batch is not A's to see or cancel.
	r := a.Do("POST", "/v1/batches", keyB, map[string]any{"input_file_id": fileB, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
	if r.Status != 200 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	id := r.Map(t)["id"].(string)
	checkError(t, a.Do("GET", "/v1/batches/"+id, keyA, nil), 404, client.CodeNotFound, "")
	checkError(t, a.Do("POST", "/v1/batches/"+id+"/cancel", keyA, nil), 404, client.CodeNotFound, "")
	var l client.List[client.Batch]
	a.Do("GET", "/v1/batches", keyA, nil).JSON(t, &l)
	if len(l.Data) != 0 || l.Object != "list" {
		t.Fatalf("A lists %+v", l)
	}
	a.Do("GET", "/v1/batches", keyB, nil).JSON(t, &l)
	if len(l.Data) != 1 || l.Data[0].ID != id || l.Data[0].Status == "cancelling" || *l.FirstID != id {
		t.Fatalf("B lists %+v", l)
	}
	b, err := a.Store.BatchGetByID(context.Background(), id)
	if err != nil || b.TenantID != tenantB || b.CancellingAt != nil {
		t.Fatalf("B's batch after A's cancel = %+v, %v", b, err)
	}
}
