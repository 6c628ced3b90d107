package batch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// redisDB is this package's Redis database (docs/ARCHITECTURE.md).
const redisDB = 15

// fastPolicy is apptest's policy with limits far above what a test sends,
// so batches run as fast as the workers go.
const fastPolicy = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 10s
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 10000000, tpm: 1000000000}
    max_output_tokens: 1024
  - name: text-embedding-3-small
    provider: sim
    price: {input_per_mtok: 0.02}
    limits: {rpm: 10000000, tpm: 1000000000}
tiers:
  - name: standard
    daily_budget_usd: 1000
    priority: default
    on_exhausted: defer
    api_rps: 1000
  - name: tiny
    daily_budget_usd: 0.0001
    priority: low
    on_exhausted: defer
    api_rps: 1000
`

// start runs a test llmq with fast limits and workers in-process workers.
func start(t *testing.T, workers int, env func(*config.Env)) *apptest.App {
	t.Helper()
	return apptest.Start(t, apptest.Options{
		RedisDB: redisDB,
		Policy:  fastPolicy,
		Sim:     &sim.Config{DefaultMaxTokens: 1024, Echo: true, CompletionMin: 0.01, CompletionMax: 0.05},
		Workers: workers,
		Env: func(e *config.Env) {
			if env != nil {
				env(e)
			}
		},
	})
}

// multipartFile is the body of an upload of content, purpose batch.
func multipartFile(content []byte) ([]byte, http.Header) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "input.jsonl")
	_, _ = fw.Write(content)
	_ = mw.Close()
	return body.Bytes(), http.Header{"Content-Type": {mw.FormDataContentType()}}
}

// upload stores content as a batch input file and returns its id.
func upload(t *testing.T, a *apptest.App, key string, content []byte) string {
	t.Helper()
	body, h := multipartFile(content)
	r := apptest.Do(t, a.URL, "POST", "/v1/files", key, body, h)
	if r.Status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.Status, r.Body)
	}
	var f client.File
	r.JSON(t, &f)
	return f.ID
}

// createBatch starts a batch of the file on the chat endpoint.
func createBatch(t *testing.T, a *apptest.App, key, fileID string, extra map[string]any) client.Batch {
	t.Helper()
	req := map[string]any{"input_file_id": fileID, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
	for k, v := range extra {
		req[k] = v
	}
	r := a.Do("POST", "/v1/batches", key, req)
	if r.Status != http.StatusOK {
		t.Fatalf("create batch: %d %s", r.Status, r.Body)
	}
	var b client.Batch
	r.JSON(t, &b)
	return b
}

func getBatch(t *testing.T, a *apptest.App, key, id string) client.Batch {
	t.Helper()
	r := a.Do("GET", "/v1/batches/"+id, key, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("get batch: %d %s", r.Status, r.Body)
	}
	var b client.Batch
	r.JSON(t, &b)
	return b
}

// waitStatus sweeps and reads the batch until it has status: the workers
// run its jobs in other goroutines, so there is no signal to wait on.
func waitStatus(t *testing.T, a *apptest.App, key, id, status string, timeout time.Duration) client.Batch {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if err := a.Batches.Sweep(context.Background()); err != nil {
			t.Fatalf("sweep: %v", err)
		}
		b := getBatch(t, a, key, id)
		if b.Status == status {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s is %s after %v, want %s (counts %+v)", id, b.Status, timeout, status, b.RequestCounts)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// results reads an output or error file.
func results(t *testing.T, a *apptest.App, key, fileID string) []client.BatchResult {
	t.Helper()
	r := a.Do("GET", "/v1/files/"+fileID+"/content", key, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("file content: %d %s", r.Status, r.Body)
	}
	var out []client.BatchResult
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var res client.BatchResult
		if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
			t.Fatalf("line %d of %s is not a result: %v: %s", len(out)+1, fileID, err, sc.Bytes())
		}
		out = append(out, res)
	}
	// The file object announces the size of what was served.
	var f client.File
	a.Do("GET", "/v1/files/"+fileID, key, nil).JSON(t, &f)
	if f.Bytes != int64(len(r.Body)) || f.Purpose != "batch_output" || f.Status != "processed" {
		t.Fatalf("file %s announces %d bytes (purpose %s), served %d", fileID, f.Bytes, f.Purpose, len(r.Body))
	}
	return out
}

// partlyValidated is a batch of the input file fileID left validating by a
// pass that stored its first n lines (never enqueued) and stopped.
func partlyValidated(t *testing.T, a *apptest.App, tenant, fileID string, n int) *store.Batch {
	t.Helper()
	ctx := context.Background()
	bt, err := a.Store.BatchInsert(ctx, &store.BatchInsertParams{TenantID: tenant, InputFileID: fileID,
		Endpoint: "/v1/chat/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	stored := make([]*store.JobInsertParams, n)
	for i := range stored {
		stored[i] = &store.JobInsertParams{TenantID: tenant, BatchID: bt.ID, LineNo: i + 1,
			CustomID: fmt.Sprintf("req-%d", i), Endpoint: "/v1/chat/completions", Model: "gpt-4o-mini",
			Request: []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hi"}],"max_tokens":20}`), Queue: queue.Batch}
	}
	if _, err := a.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: stored}); err != nil {
		t.Fatal(err)
	}
	return bt
}
