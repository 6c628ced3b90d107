package llm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// batchClock is the simulator's clock in these tests: batches move only
// when it is moved.
type batchClock struct {
	mu sync.Mutex
	t  time.Time
}

func newBatchClock() *batchClock { return &batchClock{t: time.Unix(1_700_000_000, 0)} }

func (c *batchClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *batchClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// batchAPIOf is p's Batch API, which an OpenAI provider has.
func batchAPIOf(t *testing.T, p llm.Provider) llm.BatchAPI {
	t.Helper()
	api, ok := p.(llm.BatchAPI)
	if !ok {
		t.Fatalf("%T does not implement llm.BatchAPI", p)
	}
	return api
}

// batchChatBody is the n-th client body of these tests, for model "m".
func batchChatBody(n int) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"Question %d: what is %d plus %d?"}],"max_tokens":16,"temperature":0,"user":"u%d"}`,
		n, n, n+1, n)
}

// batchInput is the JSONL input file of n chat requests custom_id
// prefix_0 … prefix_{n-1}, their model rewritten to upstream.
func batchInput(t *testing.T, prefix string, n int, upstream string) [][]byte {
	t.Helper()
	lines := make([][]byte, n)
	for i := range lines {
		l, err := llm.BatchInputLine(fmt.Sprintf("%s_%d", prefix, i), llm.Request{Endpoint: llm.EndpointChat, Upstream: upstream, Body: json.RawMessage(batchChatBody(i))})
		if err != nil {
			t.Fatalf("BatchInputLine %d: %v", i, err)
		}
		lines[i] = l
	}
	return lines
}

// uploadPiped uploads lines as a file named name, streamed through an
// io.Pipe (no length known up front), and returns its id.
func uploadPiped(t *testing.T, api llm.BatchAPI, name string, lines [][]byte) string {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, l := range lines {
			if _, err := pw.Write(append(slices.Clip(l), '\n')); err != nil {
				return
			}
		}
		pw.Close()
	}()
	id, err := api.UploadBatchFile(context.Background(), name, pr)
	pr.Close() // ends the writer if the upload stopped reading
	<-done
	if err != nil {
		t.Fatalf("UploadBatchFile %s: %v", name, err)
	}
	if id == "" {
		t.Fatalf("UploadBatchFile %s: no id", name)
	}
	return id
}

func getBatch(t *testing.T, api llm.BatchAPI, id string) *llm.ProviderBatch {
	t.Helper()
	b, err := api.GetBatch(context.Background(), id)
	if err != nil {
		t.Fatalf("GetBatch %s: %v", id, err)
	}
	if b.ID != id {
		t.Fatalf("GetBatch %s answered batch %s", id, b.ID)
	}
	return b
}

// batchFileLines reads file id ("" for none: no lines) as BatchLines.
func batchFileLines(t *testing.T, api llm.BatchAPI, id string) []llm.BatchLine {
	t.Helper()
	if id == "" {
		return nil
	}
	rc, err := api.BatchFileContent(context.Background(), id)
	if err != nil {
		t.Fatalf("BatchFileContent %s: %v", id, err)
	}
	defer rc.Close()
	var out []llm.BatchLine
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var l llm.BatchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("file %s: line %q: %v", id, sc.Bytes(), err)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("file %s: %v", id, err)
	}
	return out
}

// eachOnce checks that lines hold prefix_0 … prefix_{n-1}, each exactly
// once.
func eachOnce(t *testing.T, prefix string, n int, lines []llm.BatchLine) {
	t.Helper()
	seen := make(map[string]int, n)
	for _, l := range lines {
		seen[l.CustomID]++
	}
	for i := range n {
		id := fmt.Sprintf("%s_%d", prefix, i)
		if seen[id] != 1 {
			t.Errorf("custom_id %s in %d lines, want 1", id, seen[id])
		}
		delete(seen, id)
	}
	for id, k := range seen {
		t.Errorf("unexpected custom_id %q in %d lines", id, k)
	}
}

func checkBatchError(t *testing.T, what string, err error, status int) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %d", what, status)
		return
	}
	e := asError(t, err)
	if e.Class != llm.ClassPermanent || e.StatusCode != status {
		t.Errorf("%s: class %v, status %d, want permanent %d (%v)", what, e.Class, e.StatusCode, status, e)
	}
}

// The whole flow of an offloaded batch: its lines built from requests, the
// file streamed up and found again, the batch created, found by its
// metadata, followed as the clock moves, and its output read.
func TestBatchAPIFlow(t *testing.T) {
	t.Parallel()
	clock := newBatchClock()
	ts := startSim(t, sim.Config{APIKey: testKey, Now: clock.Now, Seed: 3,
		Batch: sim.BatchConfig{LinesPerSecond: 100, ValidatingFor: time.Second, FinalizingFor: time.Second}})
	api := batchAPIOf(t, newProvider(t, ts.BaseURL, 5*time.Second))
	ctx := context.Background()
	const n = 200

	lines := batchInput(t, "job", n, "m-up")
	for i, l := range lines {
		var got struct {
			CustomID string         `json:"custom_id"`
			Method   string         `json:"method"`
			URL      string         `json:"url"`
			Body     map[string]any `json:"body"`
		}
		if err := json.Unmarshal(l, &got); err != nil {
			t.Fatalf("line %d %s: %v", i, l, err)
		}
		var want map[string]any
		if err := json.Unmarshal([]byte(batchChatBody(i)), &want); err != nil {
			t.Fatal(err)
		}
		if got.CustomID != fmt.Sprintf("job_%d", i) || got.Method != http.MethodPost || got.URL != llm.EndpointChat || strings.Contains(string(l), "\n") {
			t.Errorf("line %d: %s", i, l)
		}
		if got.Body["model"] != "m-up" {
			t.Errorf("line %d: body model %v, want m-up", i, got.Body["model"])
		}
		delete(got.Body, "model")
		delete(want, "model")
		if !reflect.DeepEqual(got.Body, want) {
			t.Errorf("line %d: body %v, want %v but for the model", i, got.Body, want)
		}
	}
	if _, err := llm.BatchInputLine("bad", llm.Request{Endpoint: llm.EndpointChat, Upstream: "m-up", Body: json.RawMessage(`[1]`)}); err == nil {
		t.Error("BatchInputLine of a body that is not an object: no error")
	}

	fileID := uploadPiped(t, api, "p1-0.jsonl", lines)
	if got, found, err := api.FindBatchFile(ctx, "p1-0.jsonl"); err != nil || !found || got != fileID {
		t.Errorf("FindBatchFile p1-0.jsonl = %q, %v, %v; want %q", got, found, err, fileID)
	}
	if got, found, err := api.FindBatchFile(ctx, "p1-1.jsonl"); err != nil || found || got != "" {
		t.Errorf("FindBatchFile p1-1.jsonl = %q, %v, %v; want not found", got, found, err)
	}
	if st := ts.BatchStats(); st.FilesUploaded != 1 {
		t.Errorf("files uploaded %d", st.FilesUploaded)
	}

	since := clock.Now()
	b, err := api.CreateBatch(ctx, fileID, llm.EndpointChat, map[string]string{"llmq_submission": "p1/0"})
	if err != nil {
		t.Fatal(err)
	}
	if b.ID == "" || b.Status != llm.BatchValidating || b.InputFileID != fileID || b.Metadata["llmq_submission"] != "p1/0" || b.Ended() {
		t.Fatalf("created %+v", b)
	}
	if got, found, err := api.FindBatch(ctx, "llmq_submission", "p1/0", since); err != nil || !found || got.ID != b.ID {
		t.Errorf("FindBatch p1/0 = %+v, %v, %v; want %s", got, found, err, b.ID)
	}
	if got, found, err := api.FindBatch(ctx, "llmq_submission", "p1/1", since); err != nil || found || got != nil {
		t.Errorf("FindBatch p1/1 = %+v, %v, %v; want not found", got, found, err)
	}

	// Validated after 1s; 100 lines a second.
	clock.Add(time.Second)
	if got := getBatch(t, api, b.ID); got.Status != llm.BatchInProgress || got.RequestCounts.Total != n || got.Ended() {
		t.Fatalf("after 1s: %s %+v", got.Status, got.RequestCounts)
	}
	clock.Add(time.Second)
	if got := getBatch(t, api, b.ID); got.Status != llm.BatchInProgress || got.RequestCounts.Completed <= 0 || got.RequestCounts.Completed >= n {
		t.Fatalf("after 2s: %s %+v, want in_progress part-way", got.Status, got.RequestCounts)
	}
	clock.Add(time.Second)
	if got := getBatch(t, api, b.ID); got.Status != llm.BatchFinalizing || got.Ended() || got.OutputFileID != "" {
		t.Fatalf("after 3s: %s, output %q, want finalizing", got.Status, got.OutputFileID)
	}
	clock.Add(time.Second)
	done := getBatch(t, api, b.ID)
	if done.Status != llm.BatchCompleted || !done.Ended() || done.OutputFileID == "" || done.ErrorFileID != "" ||
		done.RequestCounts.Total != n || done.RequestCounts.Completed != n || done.RequestCounts.Failed != 0 || len(done.ErrorCodes()) != 0 {
		t.Fatalf("after 4s: %+v, want completed", done)
	}

	out := batchFileLines(t, api, done.OutputFileID)
	if len(out) != n {
		t.Fatalf("output file: %d lines, want %d", len(out), n)
	}
	eachOnce(t, "job", n, out)
	for _, l := range out {
		if l.Response == nil || l.Response.StatusCode != http.StatusOK || l.Error != nil {
			t.Errorf("line %s: %+v", l.CustomID, l)
			continue
		}
		u, err := llm.UsageOf(l.Response.Body)
		if err != nil || u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("line %s: usage %+v, %v", l.CustomID, u, err)
		}
		var body struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(l.Response.Body, &body); err != nil || body.Model != "m-up" {
			t.Errorf("line %s: answered for model %q (%v), want m-up", l.CustomID, body.Model, err)
		}
	}
	if st := ts.BatchStats(); st.BatchesCreated != 1 || st.BatchesCompleted != 1 || st.LinesProcessed != n || st.LinesRepeated != 0 {
		t.Errorf("batch stats %+v", st)
	}
}

// The newest file of a name is the one found.
func TestBatchAPIFindBatchFileNewest(t *testing.T) {
	t.Parallel()
	clock := newBatchClock()
	ts := startSim(t, sim.Config{Now: clock.Now})
	api := batchAPIOf(t, newProvider(t, ts.BaseURL, 5*time.Second))
	lines := batchInput(t, "f", 2, "m-up")
	first := uploadPiped(t, api, "same.jsonl", lines)
	clock.Add(time.Second)
	second := uploadPiped(t, api, "same.jsonl", lines)
	clock.Add(time.Second)
	other := uploadPiped(t, api, "other.jsonl", lines)
	if first == second || second == other {
		t.Fatalf("ids %s %s %s", first, second, other)
	}
	if got, found, err := api.FindBatchFile(context.Background(), "same.jsonl"); err != nil || !found || got != second {
		t.Errorf("FindBatchFile = %q, %v, %v; want the newer %q (older %q)", got, found, err, second, first)
	}
}

// The Batch API's failures are *llm.Errors, classified, without the key.
func TestBatchAPIErrors(t *testing.T) {
	t.Parallel()
	clock := newBatchClock()
	ts := startSim(t, sim.Config{APIKey: testKey, Now: clock.Now})
	api := batchAPIOf(t, newProvider(t, ts.BaseURL, 5*time.Second))
	ctx := context.Background()

	_, err := api.GetBatch(ctx, "batch_unknown")
	checkBatchError(t, "GetBatch of an unknown id", err, http.StatusNotFound)
	_, err = api.CancelBatch(ctx, "batch_unknown")
	checkBatchError(t, "CancelBatch of an unknown id", err, http.StatusNotFound)
	_, err = api.CreateBatch(ctx, "file-unknown", llm.EndpointChat, map[string]string{"llmq_submission": "p/0"})
	checkBatchError(t, "CreateBatch of an unknown file", err, http.StatusBadRequest)
	_, err = api.BatchFileContent(ctx, "file-unknown")
	checkBatchError(t, "BatchFileContent of an unknown file", err, http.StatusNotFound)

	// An ended batch cannot be cancelled.
	fileID := uploadPiped(t, api, "e.jsonl", batchInput(t, "e", 3, "m-up"))
	b, err := api.CreateBatch(ctx, fileID, llm.EndpointChat, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Second)
	if got := getBatch(t, api, b.ID); got.Status != llm.BatchCompleted {
		t.Fatalf("status %s", got.Status)
	}
	_, err = api.CancelBatch(ctx, b.ID)
	checkBatchError(t, "CancelBatch of a completed batch", err, http.StatusBadRequest)

	const wrongKey = "sk-wrong-9876543210zyxwvutsrqp"
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	wrong := batchAPIOf(t, llm.NewOpenAI(llm.OpenAIConfig{Name: "test", BaseURL: ts.BaseURL, APIKey: wrongKey, Timeout: 5 * time.Second,
		HTTPClient: &http.Client{Transport: tr}}))
	calls := map[string]func() error{
		"UploadBatchFile": func() error {
			_, err := wrong.UploadBatchFile(ctx, "w.jsonl", strings.NewReader(`{"custom_id":"a"}`+"\n"))
			return err
		},
		"FindBatchFile": func() error { _, _, err := wrong.FindBatchFile(ctx, "e.jsonl"); return err },
		"CreateBatch":   func() error { _, err := wrong.CreateBatch(ctx, fileID, llm.EndpointChat, nil); return err },
		"FindBatch":     func() error { _, _, err := wrong.FindBatch(ctx, "k", "v", time.Time{}); return err },
		"GetBatch":      func() error { _, err := wrong.GetBatch(ctx, b.ID); return err },
		"CancelBatch":   func() error { _, err := wrong.CancelBatch(ctx, b.ID); return err },
		"BatchFileContent": func() error {
			rc, err := wrong.BatchFileContent(ctx, fileID)
			if err == nil {
				rc.Close()
			}
			return err
		},
	}
	for name, call := range calls {
		err := call()
		checkBatchError(t, name+" with a wrong key", err, http.StatusUnauthorized)
		if err != nil && strings.Contains(err.Error(), wrongKey) {
			t.Errorf("%s: the error holds the key: %q", name, err.Error())
		}
	}
}

// A cancelled batch is cancelling, then cancelled; what ran is in its
// output file, the rest in its error file as batch_cancelled.
func TestBatchAPICancel(t *testing.T) {
	t.Parallel()
	clock := newBatchClock()
	ts := startSim(t, sim.Config{Now: clock.Now,
		Batch: sim.BatchConfig{LinesPerSecond: 10, ValidatingFor: time.Second, CancellingFor: 2 * time.Second}})
	api := batchAPIOf(t, newProvider(t, ts.BaseURL, 5*time.Second))
	ctx := context.Background()
	const n = 200
	b, err := api.CreateBatch(ctx, uploadPiped(t, api, "c.jsonl", batchInput(t, "c", n, "m-up")), llm.EndpointChat, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(6 * time.Second) // 5s in progress: some lines answered
	if got := getBatch(t, api, b.ID); got.Status != llm.BatchInProgress {
		t.Fatalf("status %s", got.Status)
	}
	c, err := api.CancelBatch(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.ID != b.ID || c.Status != llm.BatchCancelling || c.Ended() {
		t.Fatalf("CancelBatch answered %s %s", c.ID, c.Status)
	}
	clock.Add(time.Second)
	if c, err := api.CancelBatch(ctx, b.ID); err != nil || c.Status != llm.BatchCancelling {
		t.Fatalf("CancelBatch again: %v, %v", c, err)
	}
	if got := getBatch(t, api, b.ID); got.Status != llm.BatchCancelling || got.Ended() {
		t.Fatalf("1s into cancelling: %s", got.Status)
	}
	clock.Add(time.Second)
	got := getBatch(t, api, b.ID)
	if got.Status != llm.BatchCancelled || !got.Ended() {
		t.Fatalf("past CancellingFor: %s", got.Status)
	}
	out, errs := batchFileLines(t, api, got.OutputFileID), batchFileLines(t, api, got.ErrorFileID)
	if len(out) == 0 || len(out) >= n || int64(len(out)) != got.RequestCounts.Completed {
		t.Errorf("%d lines answered, %d undone, counts %+v", len(out), len(errs), got.RequestCounts)
	}
	eachOnce(t, "c", n, append(slices.Clip(out), errs...))
	for _, l := range out {
		if l.Response == nil || l.Response.StatusCode != http.StatusOK {
			t.Errorf("output line %s", l.CustomID)
		}
	}
	for _, l := range errs {
		if l.Error == nil || l.Error.Code != "batch_cancelled" || l.Response != nil {
			t.Errorf("error line %s: %+v", l.CustomID, l.Error)
		}
	}
}

// An expired batch's undone lines are in its error file as batch_expired.
func TestBatchAPIExpire(t *testing.T) {
	t.Parallel()
	clock := newBatchClock()
	ts := startSim(t, sim.Config{Now: clock.Now, Batch: sim.BatchConfig{ExpireFraction: 0.3}})
	api := batchAPIOf(t, newProvider(t, ts.BaseURL, 5*time.Second))
	const n = 200
	b, err := api.CreateBatch(context.Background(), uploadPiped(t, api, "x.jsonl", batchInput(t, "x", n, "m-up")), llm.EndpointChat, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(2 * time.Second)
	got := getBatch(t, api, b.ID)
	if got.Status != llm.BatchExpired || !got.Ended() {
		t.Fatalf("status %s", got.Status)
	}
	out, errs := batchFileLines(t, api, got.OutputFileID), batchFileLines(t, api, got.ErrorFileID)
	if len(errs) != 60 || len(out) != n-60 || got.RequestCounts.Completed != n-60 {
		t.Errorf("%d lines answered, %d undone, counts %+v; want 60 undone", len(out), len(errs), got.RequestCounts)
	}
	eachOnce(t, "x", n, append(slices.Clip(out), errs...))
	for _, l := range errs {
		if l.Error == nil || l.Error.Code != "batch_expired" || l.Response != nil {
			t.Errorf("error line %s: %+v", l.CustomID, l.Error)
		}
	}
}

// A batch past the queue limit fails validation with token_limit_exceeded.
func TestBatchAPIQueueLimit(t *testing.T) {
	t.Parallel()
	const n = 20
	lines := batchInput(t, "q", n, "m-up")
	var tokens int64 // the prompt tokens one batch enqueues
	for i := range n {
		var l struct {
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(lines[i], &l); err != nil {
			t.Fatal(err)
		}
		p, err := llm.NewEstimator().Parse(llm.EndpointChat, "", "", l.Body)
		if err != nil {
			t.Fatal(err)
		}
		tokens += p.ContentTokens
	}
	clock := newBatchClock()
	// Room for one batch, not two; the first runs for 2s.
	ts := startSim(t, sim.Config{Now: clock.Now, Batch: sim.BatchConfig{LinesPerSecond: 10, QueueLimit: tokens + tokens/2}})
	api := batchAPIOf(t, newProvider(t, ts.BaseURL, 5*time.Second))
	ctx := context.Background()
	fileID := uploadPiped(t, api, "q.jsonl", lines)
	first, err := api.CreateBatch(ctx, fileID, llm.EndpointChat, map[string]string{"llmq_submission": "q/0"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := api.CreateBatch(ctx, fileID, llm.EndpointChat, map[string]string{"llmq_submission": "q/1"})
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(500 * time.Millisecond)
	if got := getBatch(t, api, first.ID); got.Status != llm.BatchInProgress {
		t.Fatalf("first: %s %v", got.Status, got.ErrorCodes())
	}
	if q := ts.BatchStats().EnqueuedTokens["m-up"]; q != tokens {
		t.Fatalf("enqueued %d tokens, the test counted %d", q, tokens)
	}
	got := getBatch(t, api, second.ID)
	if got.Status != llm.BatchFailed || !got.Ended() || !slices.Contains(got.ErrorCodes(), "token_limit_exceeded") ||
		got.OutputFileID != "" || got.ErrorFileID != "" {
		t.Errorf("second: %s, errors %v, files %q %q; want failed with token_limit_exceeded", got.Status, got.ErrorCodes(), got.OutputFileID, got.ErrorFileID)
	}
}

// recordURIs serves h and keeps the URI of every request.
type recordURIs struct {
	h    http.Handler
	mu   sync.Mutex
	uris []string
}

func (r *recordURIs) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.uris = append(r.uris, req.URL.RequestURI())
	r.mu.Unlock()
	r.h.ServeHTTP(w, req)
}

func (r *recordURIs) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.uris
	r.uris = nil
	return out
}

// Azure's Batch API: under /openai with the api-version, or under
// /openai/v1 without one.
func TestBatchAPIAzure(t *testing.T) {
	t.Parallel()
	clock := newBatchClock()
	s := sim.New(sim.Config{APIKey: testKey, Now: clock.Now})
	rec := &recordURIs{h: s.Handler()}
	hs := httptest.NewServer(rec)
	t.Cleanup(func() { hs.Close(); s.Close() })
	ctx := context.Background()
	for _, version := range []string{"2024-10-21", ""} {
		api := batchAPIOf(t, newAzure(t, hs.URL, version))
		prefix := "az" + strings.ReplaceAll(version, "-", "")
		const n = 5
		fileID := uploadPiped(t, api, prefix+".jsonl", batchInput(t, prefix, n, "my-deployment"))
		if got, found, err := api.FindBatchFile(ctx, prefix+".jsonl"); err != nil || !found || got != fileID {
			t.Errorf("api-version %q: FindBatchFile = %q, %v, %v; want %q", version, got, found, err, fileID)
		}
		since := clock.Now()
		b, err := api.CreateBatch(ctx, fileID, llm.EndpointChat, map[string]string{"llmq_submission": prefix})
		if err != nil {
			t.Fatalf("api-version %q: CreateBatch: %v", version, err)
		}
		if got, found, err := api.FindBatch(ctx, "llmq_submission", prefix, since); err != nil || !found || got.ID != b.ID {
			t.Errorf("api-version %q: FindBatch = %v, %v, %v", version, got, found, err)
		}
		clock.Add(time.Second)
		got := getBatch(t, api, b.ID)
		if got.Status != llm.BatchCompleted {
			t.Fatalf("api-version %q: status %s %v", version, got.Status, got.ErrorCodes())
		}
		out := batchFileLines(t, api, got.OutputFileID)
		eachOnce(t, prefix, n, out)
		_, err = api.GetBatch(ctx, "batch_unknown")
		checkBatchError(t, "api-version "+version+": GetBatch of an unknown id", err, http.StatusNotFound)

		uris := rec.take()
		if len(uris) < 7 {
			t.Errorf("api-version %q: %d requests: %v", version, len(uris), uris)
		}
		for _, u := range uris {
			path, query, _ := strings.Cut(u, "?")
			var ok bool
			if version != "" {
				ok = (strings.HasPrefix(path, "/openai/files") || strings.HasPrefix(path, "/openai/batches")) &&
					strings.Contains("&"+query+"&", "&api-version="+version+"&")
			} else {
				ok = (strings.HasPrefix(path, "/openai/v1/files") || strings.HasPrefix(path, "/openai/v1/batches")) &&
					!strings.Contains(query, "api-version")
			}
			if !ok {
				t.Errorf("api-version %q: request to %s", version, u)
			}
		}
	}
}

// FindBatch pages through the list, 100 batches a page, newest first, and
// finds only batches created at or after since.
func TestBatchAPIFindBatchPages(t *testing.T) {
	t.Parallel()
	clock := newBatchClock()
	ts := startSim(t, sim.Config{Now: clock.Now})
	api := batchAPIOf(t, newProvider(t, ts.BaseURL, 5*time.Second))
	ctx := context.Background()
	fileID := uploadPiped(t, api, "pages.jsonl", batchInput(t, "pg", 1, "m-up"))
	start := clock.Now()
	const n = 150
	ids := make([]string, n)
	for i := range n {
		b, err := api.CreateBatch(ctx, fileID, llm.EndpointChat, map[string]string{"llmq_submission": fmt.Sprintf("p/%d", i)})
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		ids[i] = b.ID
		clock.Add(time.Second)
	}
	// The oldest is on the second page.
	if got, found, err := api.FindBatch(ctx, "llmq_submission", "p/0", start); err != nil || !found || got.ID != ids[0] {
		t.Errorf("FindBatch p/0 = %v, %v, %v; want %s", got, found, err, ids[0])
	}
	if got, found, err := api.FindBatch(ctx, "llmq_submission", "p/1", start.Add(time.Second)); err != nil || !found || got.ID != ids[1] {
		t.Errorf("FindBatch p/1 = %v, %v, %v; want %s", got, found, err, ids[1])
	}
	if got, found, err := api.FindBatch(ctx, "llmq_submission", "p/none", start); err != nil || found {
		t.Errorf("FindBatch p/none = %v, %v, %v; want not found", got, found, err)
	}
	// Batches created before since are not found, on any page.
	for _, i := range []int{0, 120} {
		if got, found, err := api.FindBatch(ctx, "llmq_submission", fmt.Sprintf("p/%d", i), start.Add(time.Duration(i+1)*time.Second)); err != nil || found {
			t.Errorf("FindBatch p/%d since after it: %v, %v, %v; want not found", i, got, found, err)
		}
	}
	// Of two batches with the value, the newer.
	again, err := api.CreateBatch(ctx, fileID, llm.EndpointChat, map[string]string{"llmq_submission": "p/0"})
	if err != nil {
		t.Fatal(err)
	}
	if got, found, err := api.FindBatch(ctx, "llmq_submission", "p/0", start); err != nil || !found || got.ID != again.ID {
		t.Errorf("FindBatch p/0 with two = %v, %v, %v; want the newer %s", got, found, err, again.ID)
	}
}
