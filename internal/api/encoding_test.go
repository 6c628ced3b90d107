package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// What the database cannot store (a NUL, bytes that are not UTF-8, a lone
// surrogate) is a 400 naming the field, in OpenAI's shape, never a 500; in
// a prompt as anywhere, as in a batch's lines. The bodies are raw strings:
// json.Marshal would repair them.

// chatWith is a job body whose chat request has the message content (raw
// JSON string content, without quotes) and the extra top-level members.
func chatWith(content, extra string) string {
	return `{` + extra + `"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":5}}`
}

func TestJobFieldsThatCannotBeStoredAreRefused(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	cases := []struct {
		name, body, param string
	}{
		{"NUL in custom_id", chatWith("hi", `"custom_id":"a\u0000b",`), "custom_id"},
		{"invalid UTF-8 in custom_id", chatWith("hi", `"custom_id":"a`+"\xff"+`b",`), "custom_id"},
		{"invalid UTF-8 in a message", chatWith("caf\xe9", ""), "body.messages[0].content"},
		{"a truncated sequence in a message", chatWith("\xe2\x82", ""), "body.messages[0].content"},
		{"an overlong sequence in a message", chatWith("\xc0\xaf", ""), "body.messages[0].content"},
		{"a lone high surrogate in a message", chatWith(`x\ud800y`, ""), "body.messages[0].content"},
		{"a lone low surrogate in a message", chatWith(`\udc00`, ""), "body.messages[0].content"},
		{"a high surrogate before a non-surrogate", chatWith(`\ud83d\u0041`, ""), "body.messages[0].content"},
		{"invalid UTF-8 in the model", `{"body":{"model":"gpt` + "\xff" + `","messages":[{"role":"user","content":"x"}]}}`, "body.model"},
		{"invalid UTF-8 in a member name", `{"body":{"mo` + "\xff" + `del":"gpt-4o-mini"}}`, "body"},
		{"invalid UTF-8 in a later message", `{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"a"},{"role":"user","content":"` + "\xff" + `"}]}}`, "body.messages[1].content"},
		{"NUL in webhook_url", chatWith("hi", `"webhook_url":"https://example.com/\u0000",`), "webhook_url"},
		{"invalid UTF-8 in webhook_url", chatWith("hi", `"webhook_url":"https://example.com/`+"\xff"+`",`), "webhook_url"},
		{"NUL in a metadata value", chatWith("hi", `"metadata":{"run":"7\u0000"},`), "metadata.run"},
		{"NUL in a metadata key", chatWith("hi", `"metadata":{"r\u0000un":"7"},`), "metadata"},
		{"invalid UTF-8 in a metadata key", chatWith("hi", `"metadata":{"r`+"\xff"+`un":"7"},`), "metadata"},
		{"invalid UTF-8 in a metadata value", chatWith("hi", `"metadata":{"run":"`+"\xff"+`"},`), "metadata.run"},
		{"NUL in a message", chatWith(`a\u0000b`, ""), "body.messages[0].content"},
		{"NUL in a content part", `{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"text","text":"\u0000"}]}]}}`, "body.messages[0].content[0].text"},
		{"NUL in the name of a member of the body", `{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}],"\u0000":1}}`, "body"},
		{"NUL in priority", chatWith("hi", `"priority":"low\u0000",`), "priority"},
		{"NUL in endpoint", chatWith("hi", `"endpoint":"/v1/chat/completions\u0000",`), "endpoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, a.Do("POST", "/v1/jobs", key, c.body), 400, client.CodeInvalidEncoding, c.param)
		})
	}
	// Not UTF-8 outside any value: no field to name, still a 400.
	e := checkError(t, a.Do("POST", "/v1/jobs", key, chatWith("hi", "")+"\xff"), 400, client.CodeInvalidEncoding, "")
	if e.Error.Param != nil {
		t.Fatalf("param = %q for a byte outside any value", *e.Error.Param)
	}
	// A number Postgres's numeric cannot hold, which Go reads as 0.
	tiny := `{"body":{"model":"gpt-4o-mini","temperature":0.` + strings.Repeat("0", 16384) + `1,"messages":[{"role":"user","content":"x"}]}}`
	checkError(t, a.Do("POST", "/v1/jobs", key, tiny), 400, client.CodeNumberOutOfRange, "body.temperature")
	// The header is stored too. (net/http itself refuses a NUL in a header.)
	h := http.Header{"Idempotency-Key": {"order-\xff"}}
	checkError(t, apptest.Do(t, a.URL, "POST", "/v1/jobs", key, chatWith("hi", ""), h), 400, client.CodeInvalidEncoding, "Idempotency-Key")
	nothingQueued(t, a, tenant)
}

// The text of an escape is not the escape: a prompt may quote "\u0000"
// (an escaped backslash, then "u0000"), and pairs of surrogates are fine.
func TestEscapesThatCanBeStoredAreKept(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("standard")
	r := a.Do("POST", "/v1/jobs", key, chatWith(`a\\u0000b \ud83d\ude00`, `"custom_id":"\\u0000",`))
	if r.Status != http.StatusAccepted {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	job, err := a.Store.JobGetByID(context.Background(), r.Map(t)["id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		Messages []struct{ Content string } `json:"messages"`
	}
	if err := json.Unmarshal(job.Request, &req); err != nil || len(req.Messages) != 1 || req.Messages[0].Content != `a\u0000b 😀` || job.CustomID != `\u0000` {
		t.Fatalf("stored request = %s, custom_id %q (%v)", job.Request, job.CustomID, err)
	}
}

// A path id that is not of its type's shape names nothing: 404, without a
// query the database would refuse.
func TestMalformedPathIDsAreNotFound(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	wrongKind := ids.New(ids.Batch)
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/jobs/job_%00"},
		{"GET", "/v1/jobs/job_%ff"},
		{"GET", "/v1/jobs/job_%c0%af"},
		{"GET", "/v1/jobs/" + wrongKind},
		{"GET", "/v1/jobs/" + strings.ToUpper(ids.New(ids.Job))},
		{"DELETE", "/v1/jobs/job_%00"},
		{"DELETE", "/v1/jobs/job_%ff"},
		{"GET", "/v1/files/file-%00"},
		{"GET", "/v1/files/file-%ff"},
		{"GET", "/v1/files/file-%00/content"},
		{"DELETE", "/v1/files/file-%00"},
		{"GET", "/v1/batches/batch_%00"},
		{"GET", "/v1/batches/batch_%ff"},
		{"POST", "/v1/batches/batch_%00/cancel"},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			e := checkError(t, a.Do(c.method, c.path, key, nil), 404, client.CodeNotFound, "")
			if e.Error.Type != wire.TypeNotFound {
				t.Fatalf("type = %q, want %s", e.Error.Type, wire.TypeNotFound)
			}
		})
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/admin/v1/tenants/ten_%00", nil},
		{"GET", "/admin/v1/tenants/ten_%ff", nil},
		{"PATCH", "/admin/v1/tenants/ten_%00", map[string]any{"name": "n"}},
		{"POST", "/admin/v1/tenants/ten_%00/keys", nil},
		{"GET", "/admin/v1/tenants/ten_%ff/keys", nil},
		{"DELETE", "/admin/v1/keys/key_%00", nil},
		{"DELETE", "/admin/v1/keys/key_%ff", nil},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			checkError(t, a.Do(c.method, c.path, apptest.AdminToken, c.body), 404, client.CodeNotFound, "")
		})
	}
	nothingQueued(t, a, tenant)
	if keys, err := a.Store.APIKeyListByTenant(context.Background(), tenant); err != nil || len(keys) != 1 {
		t.Fatalf("keys of the tenant: %d (%v), want its one", len(keys), err)
	}
}

// A list's cursor, and a filter by id, must be an id of the listed type.
func TestMalformedCursorsAreRefused(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("standard")
	for _, c := range []struct{ path, token, param string }{
		{"/v1/jobs?after=%00", key, "after"},
		{"/v1/jobs?after=job_%ff", key, "after"},
		{"/v1/jobs?after=" + ids.New(ids.Batch), key, "after"},
		{"/v1/jobs?batch_id=%00", key, "batch_id"},
		{"/v1/jobs?batch_id=batch_%ff", key, "batch_id"},
		{"/v1/files?after=%00", key, "after"},
		{"/v1/files?after=file-%ff", key, "after"},
		{"/v1/batches?after=%00", key, "after"},
		{"/v1/batches?after=batch_%ff", key, "after"},
		{"/admin/v1/tenants?after=%00", apptest.AdminToken, "after"},
		{"/admin/v1/tenants?after=ten_%ff", apptest.AdminToken, "after"},
		{"/admin/v1/usage?tenant_id=%00", apptest.AdminToken, "tenant_id"},
	} {
		t.Run(c.path, func(t *testing.T) {
			checkError(t, a.Do("GET", c.path, c.token, nil), 400, client.CodeInvalidValue, c.param)
		})
	}
	// A cursor of the right shape that names no object is a page like any.
	for _, path := range []string{"/v1/jobs?after=" + ids.New(ids.Job), "/v1/jobs?batch_id=" + ids.New(ids.Batch),
		"/v1/files?after=" + ids.New(ids.File), "/v1/batches?after=" + ids.New(ids.Batch)} {
		if r := a.Do("GET", path, key, nil); r.Status != 200 {
			t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
		}
	}
	if r := a.Do("GET", "/admin/v1/tenants?after="+ids.New(ids.Tenant), apptest.AdminToken, nil); r.Status != 200 {
		t.Fatalf("tenants after a well-formed id: %d %s", r.Status, r.Body)
	}
}

func TestBatchFieldsThatCannotBeStoredAreRefused(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	up := uploadParts(t, a, key, part{"purpose", "", "batch"}, part{"file", "in.jsonl", jsonl(1)})
	if up.Status != 200 {
		t.Fatalf("upload: %d %s", up.Status, up.Body)
	}
	file := up.Map(t)["id"].(string)
	batch := func(extra string) string {
		return `{` + extra + `"endpoint":"/v1/chat/completions","completion_window":"24h"}`
	}
	in := `"input_file_id":"` + file + `",`
	for _, c := range []struct{ name, body, param string }{
		{"NUL in input_file_id", batch(`"input_file_id":"file-x\u0000",`), "input_file_id"},
		{"invalid UTF-8 in input_file_id", batch(`"input_file_id":"file-` + "\xff" + `",`), "input_file_id"},
		{"NUL in a metadata value", batch(in + `"metadata":{"k":"\u0000"},`), "metadata.k"},
		{"NUL in a metadata key", batch(in + `"metadata":{"\u0000":"v"},`), "metadata"},
		{"NUL in webhook_url", batch(in + `"webhook_url":"https://example.com/\u0000",`), "webhook_url"},
		{"invalid UTF-8 in completion_window", `{` + in + `"endpoint":"/v1/chat/completions","completion_window":"24h` + "\xff" + `"}`, "completion_window"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, a.Do("POST", "/v1/batches", key, c.body), 400, client.CodeInvalidEncoding, c.param)
		})
	}
	// An input_file_id no file can have is the 404 of a missing file.
	checkError(t, a.Do("POST", "/v1/batches", key, batch(`"input_file_id":"file-x",`)), 404, client.CodeNotFound, "input_file_id")
	bs, _, err := a.Store.BatchList(context.Background(), &store.BatchListParams{TenantID: tenant})
	if err != nil || len(bs) != 0 {
		t.Fatalf("batches stored: %d (%v)", len(bs), err)
	}
	nothingQueued(t, a, tenant)
}

// An uploaded file's name that cannot be stored is replaced, as one that is
// not UTF-8 is: the upload itself is good.
func TestUploadNameWithNULIsReplaced(t *testing.T) {
	t.Parallel()
	a := start(t)
	_, key := a.Tenant("standard")
	body := "--b\r\n" +
		"Content-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--b\r\n" +
		"Content-Disposition: form-data; name=\"file\"; filename*=UTF-8''in%00.jsonl\r\n" +
		"Content-Type: application/octet-stream\r\n\r\n" + jsonl(1) + "\r\n" +
		"--b--\r\n"
	r := apptest.Do(t, a.URL, "POST", "/v1/files", key, body, http.Header{"Content-Type": {"multipart/form-data; boundary=b"}})
	if r.Status != 200 || r.Map(t)["filename"] != "upload.jsonl" {
		t.Fatalf("upload: %d %s", r.Status, r.Body)
	}
}

func TestAdminFieldsThatCannotBeStoredAreRefused(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, _ := a.Tenant("standard")
	for _, c := range []struct{ name, method, path, body, param string }{
		{"NUL in a new tenant's name", "POST", "/admin/v1/tenants", `{"name":"acme\u0000","tier":"free"}`, "name"},
		{"invalid UTF-8 in a new tenant's name", "POST", "/admin/v1/tenants", `{"name":"acme` + "\xff" + `","tier":"free"}`, "name"},
		{"NUL in a new tenant's tier", "POST", "/admin/v1/tenants", `{"name":"acme","tier":"free\u0000"}`, "tier"},
		{"NUL in a new name", "PATCH", "/admin/v1/tenants/" + tenant, `{"name":"a\u0000"}`, "name"},
		{"invalid UTF-8 in a new name", "PATCH", "/admin/v1/tenants/" + tenant, `{"name":"` + "\xff" + `"}`, "name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, a.Do(c.method, c.path, apptest.AdminToken, c.body), 400, client.CodeInvalidEncoding, c.param)
		})
	}
	ts, _, err := a.Store.TenantList(context.Background(), &store.TenantListParams{})
	if err != nil || len(ts) != 1 || ts[0].ID != tenant || !strings.HasPrefix(ts[0].Name, "tenant-") {
		t.Fatalf("tenants after the refusals: %+v (%v), want the one, unchanged", ts, err)
	}
}
