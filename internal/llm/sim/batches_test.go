package sim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

type fileObj struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int    `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
}

type batchObj struct {
	ID       string `json:"id"`
	Object   string `json:"object"`
	Endpoint string `json:"endpoint"`
	Errors   *struct {
		Object string `json:"object"`
		Data   []struct {
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Param   *string `json:"param"`
			Line    *int    `json:"line"`
		} `json:"data"`
	} `json:"errors"`
	InputFileID      string  `json:"input_file_id"`
	CompletionWindow string  `json:"completion_window"`
	Status           string  `json:"status"`
	OutputFileID     *string `json:"output_file_id"`
	ErrorFileID      *string `json:"error_file_id"`
	CreatedAt        int64   `json:"created_at"`
	InProgressAt     *int64  `json:"in_progress_at"`
	ExpiresAt        *int64  `json:"expires_at"`
	FinalizingAt     *int64  `json:"finalizing_at"`
	CompletedAt      *int64  `json:"completed_at"`
	FailedAt         *int64  `json:"failed_at"`
	ExpiredAt        *int64  `json:"expired_at"`
	CancellingAt     *int64  `json:"cancelling_at"`
	CancelledAt      *int64  `json:"cancelled_at"`
	RequestCounts    struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
	Metadata map[string]string `json:"metadata"`
}

type outLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func do(t testing.TB, h http.Handler, method, path string, body io.Reader, contentType string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, body)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// uploadReq posts data as a file of purpose to path.
func uploadReq(t testing.TB, h http.Handler, path, purpose string, data []byte) *httptest.ResponseRecorder {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if purpose != "" {
		_ = mw.WriteField("purpose", purpose)
	}
	if data != nil {
		fw, _ := mw.CreateFormFile("file", "input.jsonl")
		_, _ = fw.Write(data)
	}
	_ = mw.Close()
	return do(t, h, http.MethodPost, path, &buf, mw.FormDataContentType())
}

func upload(t testing.TB, h http.Handler, data []byte) fileObj {
	t.Helper()
	rec := uploadReq(t, h, "/v1/files", "batch", data)
	if rec.Code != http.StatusOK {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	var f fileObj
	if err := json.Unmarshal(rec.Body.Bytes(), &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func decodeBatch(t testing.TB, rec *httptest.ResponseRecorder) batchObj {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("batch: %d %s", rec.Code, rec.Body)
	}
	var b batchObj
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	return b
}

func createBatch(t testing.TB, h http.Handler, fileID, endpoint string) batchObj {
	t.Helper()
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":%q,"completion_window":"24h","metadata":{"k":"v"}}`, fileID, endpoint)
	return decodeBatch(t, do(t, h, http.MethodPost, "/v1/batches", strings.NewReader(body), "application/json"))
}

func getBatch(t testing.TB, h http.Handler, id string) batchObj {
	t.Helper()
	return decodeBatch(t, do(t, h, http.MethodGet, "/v1/batches/"+id, nil, ""))
}

func fileContent(t testing.TB, h http.Handler, id *string) []outLine {
	t.Helper()
	if id == nil {
		return nil
	}
	rec := do(t, h, http.MethodGet, "/v1/files/"+*id+"/content", nil, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("content of %s: %d %s", *id, rec.Code, rec.Body)
	}
	var lines []outLine
	for _, l := range strings.Split(strings.TrimSuffix(rec.Body.String(), "\n"), "\n") {
		var o outLine
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		lines = append(lines, o)
	}
	return lines
}

func chatLine(id, model, content string) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":20}}`, id, model, content)
}

// chatFile is n chat lines for model, custom_ids req-0 … req-(n-1).
func chatFile(n int, model string) []byte {
	var b strings.Builder
	for i := range n {
		b.WriteString(chatLine(fmt.Sprintf("req-%d", i), model, "hello world"))
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// ids returns the custom_ids of lines, in their order.
func ids(lines []outLine) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.CustomID
	}
	return out
}

func TestBatchLifecycle(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Seed: 7, Batch: sim.BatchConfig{LinesPerSecond: 1000}})
	h := s.Handler()
	f := upload(t, h, chatFile(1000, "m"))
	b := createBatch(t, h, f.ID, llm.EndpointChat)
	created := c.Now().Unix()
	if !strings.HasPrefix(b.ID, "batch_") || b.Object != "batch" || b.Status != "validating" || b.InputFileID != f.ID ||
		b.CompletionWindow != "24h" || b.Endpoint != llm.EndpointChat || b.CreatedAt != created || b.ExpiresAt == nil || *b.ExpiresAt != created+86400 ||
		b.InProgressAt != nil || b.OutputFileID != nil || b.ErrorFileID != nil || b.Errors != nil || b.Metadata["k"] != "v" {
		t.Fatalf("created: %+v", b)
	}

	c.Add(50 * time.Millisecond) // validated
	b = getBatch(t, h, b.ID)
	if b.Status != "in_progress" || b.InProgressAt == nil || b.RequestCounts.Total != 1000 || b.RequestCounts.Completed != 0 {
		t.Fatalf("after validation: %+v", b)
	}
	c.Add(500 * time.Millisecond)
	b = getBatch(t, h, b.ID)
	if b.Status != "in_progress" || b.RequestCounts.Completed != 500 || b.RequestCounts.Failed != 0 {
		t.Fatalf("half-way: %s %+v", b.Status, b.RequestCounts)
	}
	c.Add(500 * time.Millisecond)
	b = getBatch(t, h, b.ID)
	if b.Status != "finalizing" || b.FinalizingAt == nil || b.CompletedAt != nil || b.RequestCounts.Completed != 1000 || b.OutputFileID != nil {
		t.Fatalf("lines done: %+v", b)
	}
	c.Add(50 * time.Millisecond)
	b = getBatch(t, h, b.ID)
	if b.Status != "completed" || b.CompletedAt == nil || b.OutputFileID == nil || b.ErrorFileID != nil ||
		b.RequestCounts != (struct {
			Total     int `json:"total"`
			Completed int `json:"completed"`
			Failed    int `json:"failed"`
		}{1000, 1000, 0}) {
		t.Fatalf("completed: %+v", b)
	}

	var out fileObj
	if err := json.Unmarshal(do(t, h, http.MethodGet, "/v1/files/"+*b.OutputFileID, nil, "").Body.Bytes(), &out); err != nil ||
		out.Purpose != "batch_output" || out.Filename != "batch_"+b.ID+"_output.jsonl" {
		t.Errorf("output file object %+v %v", out, err)
	}
	lines := fileContent(t, h, b.OutputFileID)
	if len(lines) != 1000 {
		t.Fatalf("%d output lines", len(lines))
	}
	seen := map[string]bool{}
	reqIDs := map[string]bool{}
	for _, l := range lines {
		if seen[l.CustomID] {
			t.Errorf("%s twice in the output", l.CustomID)
		}
		seen[l.CustomID] = true
		if !strings.HasPrefix(l.ID, "batch_req_") || l.Error != nil || l.Response == nil || l.Response.StatusCode != 200 ||
			!strings.HasPrefix(l.Response.RequestID, "req_") || reqIDs[l.Response.RequestID] {
			t.Fatalf("line %+v", l)
		}
		reqIDs[l.Response.RequestID] = true
		var body struct {
			Object  string `json:"object"`
			Model   string `json:"model"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal(l.Response.Body, &body); err != nil || body.Object != "chat.completion" || body.Model != "m" ||
			len(body.Choices) != 1 || body.Usage == nil || body.Usage.PromptTokens == 0 || body.Usage.CompletionTokens == 0 ||
			body.Usage.TotalTokens != body.Usage.PromptTokens+body.Usage.CompletionTokens {
			t.Fatalf("line %s body %s: %v", l.CustomID, l.Response.Body, err)
		}
	}
	for i := range 1000 {
		if !seen[fmt.Sprintf("req-%d", i)] {
			t.Errorf("req-%d missing", i)
		}
	}
	in := ids(lines)
	if slices.IsSortedFunc(in, func(a, b string) int {
		var x, y int
		fmt.Sscanf(a, "req-%d", &x)
		fmt.Sscanf(b, "req-%d", &y)
		return x - y
	}) {
		t.Error("the output follows the input's order")
	}

	bs := s.BatchStats()
	if bs.FilesUploaded != 1 || bs.BatchesCreated != 1 || bs.BatchesCompleted != 1 || bs.LinesProcessed != 1000 || bs.LinesRepeated != 0 || len(bs.EnqueuedTokens) != 0 {
		t.Errorf("batch stats %+v", bs)
	}
	runs := s.CustomIDRuns()
	if len(runs) != 1000 || runs["req-0"] != 1 || runs["req-999"] != 1 {
		t.Errorf("runs: %d ids, req-0 %d", len(runs), runs["req-0"])
	}
	// Batch lines are not requests to the rate limiter.
	if st := s.Stats(); st.Requests != 0 || st.Admitted != 0 || st.TokensAdmitted != 0 || len(s.Admissions(0)) != 0 {
		t.Errorf("stats %+v: batch lines reached the limiter", st)
	}

	// The same seed and clock give the same files, byte for byte.
	c2 := newClock()
	s2 := sim.New(sim.Config{Now: c2.Now, Seed: 7, Batch: sim.BatchConfig{LinesPerSecond: 1000}})
	h2 := s2.Handler()
	b2 := createBatch(t, h2, upload(t, h2, chatFile(1000, "m")).ID, llm.EndpointChat)
	c2.Add(2 * time.Second)
	b2 = getBatch(t, h2, b2.ID)
	if b2.ID != b.ID || b2.OutputFileID == nil || *b2.OutputFileID != *b.OutputFileID {
		t.Fatalf("ids differ for one seed: %s %v, %s %v", b2.ID, b2.OutputFileID, b.ID, b.OutputFileID)
	}
	one := do(t, h, http.MethodGet, "/v1/files/"+*b.OutputFileID+"/content", nil, "").Body.String()
	two := do(t, h2, http.MethodGet, "/v1/files/"+*b2.OutputFileID+"/content", nil, "").Body.String()
	if one != two {
		t.Error("one seed, two output files")
	}
}

// An embeddings batch answers as POST /v1/embeddings does.
func TestBatchEmbeddings(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, EmbeddingDim: 8})
	h := s.Handler()
	var in strings.Builder
	for i := range 20 {
		fmt.Fprintf(&in, `{"custom_id":"e-%d","method":"POST","url":"/v1/embeddings","body":{"model":"emb","input":["hello","world"]}}`+"\n", i)
	}
	b := createBatch(t, h, upload(t, h, []byte(in.String())).ID, llm.EndpointEmbeddings)
	c.Add(time.Second)
	b = getBatch(t, h, b.ID)
	lines := fileContent(t, h, b.OutputFileID)
	if b.Status != "completed" || len(lines) != 20 {
		t.Fatalf("%s, %d lines", b.Status, len(lines))
	}
	var body struct {
		Object string `json:"object"`
		Data   []struct {
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(lines[0].Response.Body, &body); err != nil || body.Object != "list" || len(body.Data) != 2 || len(body.Data[0].Embedding) != 8 || body.Usage.PromptTokens != 2 {
		t.Errorf("embedding line %s: %v", lines[0].Response.Body, err)
	}
}

func TestBatchValidationFailures(t *testing.T) {
	t.Parallel()
	ok := func(i int) string { return chatLine(fmt.Sprintf("r%d", i), "m", "hi") }
	cases := []struct {
		name   string
		lines  []string
		code   string
		line   int // 0: none
		config sim.BatchConfig
	}{
		{"malformed", []string{ok(1), `{"custom_id":"r2","method":`, ok(3)}, "invalid_json_line", 2, sim.BatchConfig{}},
		{"not an object", []string{`[1,2]`}, "invalid_json_line", 1, sim.BatchConfig{}},
		{"duplicate", []string{ok(1), ok(2), ok(1)}, "duplicate_custom_id", 3, sim.BatchConfig{}},
		{"url", []string{ok(1), strings.Replace(ok(2), llm.EndpointChat, llm.EndpointEmbeddings, 1)}, "invalid_url", 2, sim.BatchConfig{}},
		{"method", []string{strings.Replace(ok(1), `"POST"`, `"GET"`, 1)}, "invalid_method", 1, sim.BatchConfig{}},
		{"custom_id", []string{ok(1), strings.Replace(ok(2), `"custom_id":"r2",`, "", 1)}, "missing_required_parameter", 2, sim.BatchConfig{}},
		{"body", []string{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":"hi"}`}, "missing_required_parameter", 1, sim.BatchConfig{}},
		{"models", []string{ok(1), ok(2), chatLine("r3", "other", "hi")}, "mismatched_model", 3, sim.BatchConfig{}},
		{"too many", []string{ok(1), ok(2), ok(3), ok(4)}, "batch_size_exceeded", 0, sim.BatchConfig{MaxLines: 3}},
		{"empty", []string{"", "  "}, "empty_file", 0, sim.BatchConfig{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			s := sim.New(sim.Config{Now: c.Now, Batch: tc.config})
			h := s.Handler()
			b := createBatch(t, h, upload(t, h, []byte(strings.Join(tc.lines, "\n"))).ID, llm.EndpointChat)
			if b.Status != "validating" {
				t.Fatalf("created %s", b.Status)
			}
			c.Add(time.Second)
			b = getBatch(t, h, b.ID)
			if b.Status != "failed" || b.FailedAt == nil || b.InProgressAt != nil || b.OutputFileID != nil || b.ErrorFileID != nil ||
				b.RequestCounts.Total != 0 || b.Errors == nil || b.Errors.Object != "list" || len(b.Errors.Data) != 1 {
				t.Fatalf("%+v", b)
			}
			e := b.Errors.Data[0]
			if e.Code != tc.code || e.Message == "" || (tc.line == 0) != (e.Line == nil) || e.Line != nil && *e.Line != tc.line {
				t.Errorf("error %+v (line %v), want %s at line %d", e, e.Line, tc.code, tc.line)
			}
			if bs := s.BatchStats(); bs.LinesProcessed != 0 || bs.BatchesFailed != 1 {
				t.Errorf("stats %+v", bs)
			}
		})
	}
}

// Bad requests to POST /v1/batches are 400s in OpenAI's error shape.
func TestBatchCreateRefused(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now})
	h := s.Handler()
	f := upload(t, h, chatFile(2, "m"))
	// An output file is not an input file.
	done := createBatch(t, h, f.ID, llm.EndpointChat)
	c.Add(time.Second)
	out := *getBatch(t, h, done.ID).OutputFileID
	for _, tc := range []struct {
		body, param string
	}{
		{`{"endpoint":"/v1/chat/completions","completion_window":"24h"}`, "input_file_id"},
		{`{"input_file_id":"` + f.ID + `","endpoint":"/v1/completions","completion_window":"24h"}`, "endpoint"},
		{`{"input_file_id":"` + f.ID + `","endpoint":"/chat/completions","completion_window":"24h"}`, "endpoint"},
		{`{"input_file_id":"` + f.ID + `","endpoint":"/v1/chat/completions","completion_window":"1h"}`, "completion_window"},
		{`{"input_file_id":"file-nope","endpoint":"/v1/chat/completions","completion_window":"24h"}`, "input_file_id"},
		{`{"input_file_id":"` + out + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`, "input_file_id"},
		{`{"input_file_id":"` + f.ID + `","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"k":1}}`, ""},
		{`{"input_file_id":`, ""},
	} {
		rec := do(t, h, http.MethodPost, "/v1/batches", strings.NewReader(tc.body), "application/json")
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", tc.body, rec.Code, rec.Body)
			continue
		}
		e := decodeErr(t, rec)
		if e.Error.Type != "invalid_request_error" || e.Error.Message == "" || (tc.param == "") != (e.Error.Param == nil) || e.Error.Param != nil && *e.Error.Param != tc.param {
			t.Errorf("%s: %s", tc.body, rec.Body)
		}
	}
	if bs := s.BatchStats(); bs.BatchesCreated != 1 {
		t.Errorf("%d batches created", bs.BatchesCreated)
	}
	for _, path := range []string{"/v1/batches/batch_nope", "/v1/files/file-nope"} {
		if rec := do(t, h, http.MethodGet, path, nil, ""); rec.Code != http.StatusNotFound || decodeErr(t, rec).Error.Type != "invalid_request_error" {
			t.Errorf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if rec := do(t, h, http.MethodPost, "/v1/batches/batch_nope/cancel", nil, ""); rec.Code != http.StatusNotFound {
		t.Errorf("cancel unknown: %d", rec.Code)
	}
}

func TestBatchQueueLimit(t *testing.T) {
	t.Parallel()
	c := newClock()
	// 100 lines of "hello world": 2 prompt tokens each.
	s := sim.New(sim.Config{Now: c.Now, Batch: sim.BatchConfig{LinesPerSecond: 100, QueueLimit: 300, QueueLimits: map[string]int64{"free": 0}}})
	h := s.Handler()
	f := upload(t, h, chatFile(100, "m"))
	first := createBatch(t, h, f.ID, llm.EndpointChat)
	c.Add(100 * time.Millisecond)
	if b := getBatch(t, h, first.ID); b.Status != "in_progress" {
		t.Fatalf("first: %s %+v", b.Status, b.Errors)
	}
	if q := s.BatchStats().EnqueuedTokens; q["m"] != 200 {
		t.Fatalf("enqueued %v, want m: 200", q)
	}
	// Another model's batch has its own queue; "free" has none.
	other := createBatch(t, h, upload(t, h, chatFile(100, "free")).ID, llm.EndpointChat)
	second := createBatch(t, h, f.ID, llm.EndpointChat)
	c.Add(100 * time.Millisecond)
	if b := getBatch(t, h, other.ID); b.Status != "in_progress" {
		t.Errorf("other model: %s %+v", b.Status, b.Errors)
	}
	b := getBatch(t, h, second.ID)
	if b.Status != "failed" || b.FailedAt == nil || b.Errors == nil || len(b.Errors.Data) != 1 {
		t.Fatalf("second while the first runs: %+v", b)
	}
	e := b.Errors.Data[0]
	want := "Enqueued token limit reached for m in organization org-sim. Limit: 300 enqueued tokens. Please try again once some in_progress batches have been completed."
	if e.Code != "token_limit_exceeded" || e.Message != want || e.Param != nil || e.Line != nil {
		t.Errorf("error %+v", e)
	}
	if q := s.BatchStats().EnqueuedTokens; q["m"] != 200 || q["free"] != 200 {
		t.Errorf("enqueued %v: the refused batch holds tokens", q)
	}

	c.Add(time.Second) // the first completes
	if b := getBatch(t, h, first.ID); b.Status != "completed" {
		t.Fatalf("first: %s", b.Status)
	}
	if q := s.BatchStats().EnqueuedTokens; len(q) != 0 {
		t.Errorf("enqueued %v after the batches ended", q)
	}
	third := createBatch(t, h, f.ID, llm.EndpointChat)
	c.Add(100 * time.Millisecond)
	if b := getBatch(t, h, third.ID); b.Status != "in_progress" {
		t.Errorf("third after the first completed: %s %+v", b.Status, b.Errors)
	}
	// The enqueued tokens are the prompt tokens of the answers' usage.
	c.Add(2 * time.Second)
	var prompt int64
	for _, l := range fileContent(t, h, getBatch(t, h, third.ID).OutputFileID) {
		var body struct{ Usage usage }
		_ = json.Unmarshal(l.Response.Body, &body)
		prompt += body.Usage.PromptTokens
	}
	if prompt != 200 {
		t.Errorf("usage prompt tokens %d, enqueued 200", prompt)
	}

	// A batch larger than the limit on its own can never run.
	big := createBatch(t, h, upload(t, h, chatFile(200, "m")).ID, llm.EndpointChat)
	c.Add(100 * time.Millisecond)
	if b := getBatch(t, h, big.ID); b.Status != "failed" || b.Errors.Data[0].Code != "token_limit_exceeded" {
		t.Errorf("batch over the limit: %s", b.Status)
	}
	// A cancelled batch frees its tokens too.
	if err := s.SetBatchConfig(sim.BatchConfig{LinesPerSecond: 100, QueueLimit: 200}); err != nil {
		t.Fatal(err)
	}
	run := createBatch(t, h, f.ID, llm.EndpointChat)
	c.Add(100 * time.Millisecond)
	decodeBatch(t, do(t, h, http.MethodPost, "/v1/batches/"+run.ID+"/cancel", nil, ""))
	c.Add(time.Second)
	if q := s.BatchStats().EnqueuedTokens; len(q) != 0 {
		t.Errorf("enqueued %v after a cancel", q)
	}
}

func TestBatchExpire(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Batch: sim.BatchConfig{ExpireFraction: 0.3}})
	h := s.Handler()
	b := createBatch(t, h, upload(t, h, chatFile(1000, "m")).ID, llm.EndpointChat)
	c.Add(2 * time.Second)
	b = getBatch(t, h, b.ID)
	if b.Status != "expired" || b.ExpiredAt == nil || b.CompletedAt != nil || b.FinalizingAt != nil || b.OutputFileID == nil || b.ErrorFileID == nil ||
		b.RequestCounts.Total != 1000 || b.RequestCounts.Completed != 700 || b.RequestCounts.Failed != 0 {
		t.Fatalf("%+v", b)
	}
	out, errs := fileContent(t, h, b.OutputFileID), fileContent(t, h, b.ErrorFileID)
	if len(out) != 700 || len(errs) != 300 {
		t.Fatalf("%d output lines, %d error lines", len(out), len(errs))
	}
	seen := map[string]bool{}
	for _, l := range out {
		seen[l.CustomID] = true
	}
	for _, l := range errs {
		if seen[l.CustomID] {
			t.Errorf("%s in both files", l.CustomID)
		}
		seen[l.CustomID] = true
		if l.Response != nil || l.Error == nil || l.Error.Code != "batch_expired" ||
			l.Error.Message != "This request could not be executed before the completion window expired." {
			t.Errorf("error line %+v", l)
		}
	}
	if len(seen) != 1000 {
		t.Errorf("%d custom_ids in the files", len(seen))
	}
	if bs := s.BatchStats(); bs.LinesProcessed != 700 || bs.BatchesExpired != 1 {
		t.Errorf("stats %+v", bs)
	}
}

// Lines that would run past the 24 h completion window never run.
func TestBatchCompletionWindow(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Batch: sim.BatchConfig{LinesPerSecond: 0.001, ValidatingFor: -1}}) // a line every 1000 s
	h := s.Handler()
	b := createBatch(t, h, upload(t, h, chatFile(100, "m")).ID, llm.EndpointChat)
	c.Add(23 * time.Hour)
	if b := getBatch(t, h, b.ID); b.Status != "in_progress" || b.RequestCounts.Completed != 82 {
		t.Fatalf("after 23 h: %s %+v", b.Status, b.RequestCounts)
	}
	c.Add(2 * time.Hour)
	b = getBatch(t, h, b.ID)
	if b.Status != "expired" || b.ExpiredAt == nil || *b.ExpiredAt != *b.ExpiresAt || b.RequestCounts.Completed != 86 {
		t.Fatalf("after 25 h: %+v", b)
	}
	if errs := fileContent(t, h, b.ErrorFileID); len(errs) != 14 || errs[0].Error.Code != "batch_expired" {
		t.Errorf("%d error lines", len(errs))
	}
}

func TestBatchCancel(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Batch: sim.BatchConfig{LinesPerSecond: 1000}})
	h := s.Handler()
	b := createBatch(t, h, upload(t, h, chatFile(1000, "m")).ID, llm.EndpointChat)
	c.Add(350 * time.Millisecond) // 50 ms validating, 300 lines
	b = decodeBatch(t, do(t, h, http.MethodPost, "/v1/batches/"+b.ID+"/cancel", nil, ""))
	if b.Status != "cancelling" || b.CancellingAt == nil || b.CancelledAt != nil || b.RequestCounts.Completed != 300 {
		t.Fatalf("cancel: %+v", b)
	}
	c.Add(50 * time.Millisecond)
	if b = getBatch(t, h, b.ID); b.Status != "cancelling" || b.RequestCounts.Completed != 300 {
		t.Fatalf("cancelling: %s %+v", b.Status, b.RequestCounts)
	}
	// Cancelling again changes nothing.
	if again := decodeBatch(t, do(t, h, http.MethodPost, "/v1/batches/"+b.ID+"/cancel", nil, "")); again.Status != "cancelling" || *again.CancellingAt != *b.CancellingAt {
		t.Errorf("second cancel: %+v", again)
	}
	c.Add(50 * time.Millisecond)
	b = getBatch(t, h, b.ID)
	if b.Status != "cancelled" || b.CancelledAt == nil || b.RequestCounts.Total != 1000 || b.RequestCounts.Completed != 300 {
		t.Fatalf("cancelled: %+v", b)
	}
	out, errs := fileContent(t, h, b.OutputFileID), fileContent(t, h, b.ErrorFileID)
	if len(out) != 300 || len(errs) != 700 {
		t.Fatalf("%d output lines, %d error lines", len(out), len(errs))
	}
	done := map[string]bool{}
	for _, l := range out {
		done[l.CustomID] = true
	}
	for _, l := range errs {
		if done[l.CustomID] || l.Error == nil || l.Error.Code != "batch_cancelled" || l.Response != nil {
			t.Fatalf("error line %+v", l)
		}
	}
	if bs := s.BatchStats(); bs.LinesProcessed != 300 || bs.BatchesCancelled != 1 {
		t.Errorf("stats %+v: lines ran after the cancel", bs)
	}
	rec := do(t, h, http.MethodPost, "/v1/batches/"+b.ID+"/cancel", nil, "")
	if rec.Code != http.StatusBadRequest || decodeErr(t, rec).Error.Message != "Cannot cancel a batch with status 'cancelled'." {
		t.Errorf("cancel a cancelled batch: %d %s", rec.Code, rec.Body)
	}

	// A completed batch cannot be cancelled; one cancelled while validating
	// answered nothing and has no files.
	done2 := createBatch(t, h, upload(t, h, chatFile(10, "m")).ID, llm.EndpointChat)
	c.Add(time.Second)
	rec = do(t, h, http.MethodPost, "/v1/batches/"+done2.ID+"/cancel", nil, "")
	if rec.Code != http.StatusBadRequest || decodeErr(t, rec).Error.Message != "Cannot cancel a batch with status 'completed'." {
		t.Errorf("cancel a completed batch: %d %s", rec.Code, rec.Body)
	}
	early := createBatch(t, h, upload(t, h, chatFile(10, "m")).ID, llm.EndpointChat)
	decodeBatch(t, do(t, h, http.MethodPost, "/v1/batches/"+early.ID+"/cancel", nil, ""))
	c.Add(time.Second)
	if b := getBatch(t, h, early.ID); b.Status != "cancelled" || b.InProgressAt != nil || b.OutputFileID != nil || b.ErrorFileID != nil || b.RequestCounts.Total != 0 {
		t.Errorf("cancelled while validating: %+v", b)
	}
}

func TestBatchFailRate(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Batch: sim.BatchConfig{FailRate: 1, LinesPerSecond: 100, QueueLimit: 1000}})
	h := s.Handler()
	b := createBatch(t, h, upload(t, h, chatFile(100, "m")).ID, llm.EndpointChat)
	c.Add(100 * time.Millisecond)
	if b = getBatch(t, h, b.ID); b.Status != "in_progress" || b.RequestCounts.Completed != 0 {
		t.Fatalf("accepted: %+v", b)
	}
	c.Add(time.Second)
	b = getBatch(t, h, b.ID)
	if b.Status != "failed" || b.FailedAt == nil || b.InProgressAt == nil || b.OutputFileID != nil || b.ErrorFileID != nil ||
		b.Errors == nil || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != "server_error" || b.RequestCounts.Completed != 0 {
		t.Fatalf("%+v", b)
	}
	if bs := s.BatchStats(); bs.LinesProcessed != 0 || bs.BatchesFailed != 1 || len(bs.EnqueuedTokens) != 0 {
		t.Errorf("stats %+v", bs)
	}
}

// Lines the simulator would refuse synchronously fail alone: 400s in the
// error file with the error body the synchronous call gets.
func TestBatchLineErrors(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Models: map[string]sim.Model{"m": {ContextWindow: 50}}})
	h := s.Handler()
	bad := map[string]string{
		"no-messages": `{"custom_id":"no-messages","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`,
		"stream":      `{"custom_id":"stream","method":"POST","url":"/v1/chat/completions","body":{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}}`,
		"too-long":    `{"custom_id":"too-long","method":"POST","url":"/v1/chat/completions","body":{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}}`,
	}
	var in strings.Builder
	for i := range 10 {
		in.WriteString(chatLine(fmt.Sprintf("ok-%d", i), "m", "hello world") + "\n")
	}
	for _, l := range bad {
		in.WriteString(l + "\n")
	}
	b := createBatch(t, h, upload(t, h, []byte(in.String())).ID, llm.EndpointChat)
	c.Add(time.Second)
	b = getBatch(t, h, b.ID)
	if b.Status != "completed" || b.Errors != nil || b.RequestCounts.Total != 13 || b.RequestCounts.Completed != 10 || b.RequestCounts.Failed != 3 {
		t.Fatalf("%+v", b)
	}
	if out := fileContent(t, h, b.OutputFileID); len(out) != 10 {
		t.Errorf("%d output lines", len(out))
	}
	errs := fileContent(t, h, b.ErrorFileID)
	if len(errs) != 3 {
		t.Fatalf("%d error lines", len(errs))
	}
	for _, l := range errs {
		if _, ok := bad[l.CustomID]; !ok || l.Error != nil || l.Response == nil || l.Response.StatusCode != 400 {
			t.Fatalf("error line %+v", l)
		}
		var e apiErr
		if err := json.Unmarshal(l.Response.Body, &e); err != nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
			t.Errorf("%s: body %s", l.CustomID, l.Response.Body)
		}
		if l.CustomID == "too-long" && (e.Error.Code == nil || *e.Error.Code != "context_length_exceeded") {
			t.Errorf("too-long: %s", l.Response.Body)
		}
	}
	if st := s.Stats(); st.BadRequests != 0 {
		t.Errorf("batch lines counted as bad requests: %+v", st)
	}
}

// Batch lines leave the per-minute buckets to synchronous traffic.
func TestBatchSparesRateLimits(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Limits: sim.Limits{RPM: 5, TPM: 1000}})
	h := s.Handler()
	b := createBatch(t, h, upload(t, h, chatFile(500, "m")).ID, llm.EndpointChat)
	c.Add(60 * time.Millisecond) // in progress
	for i := range 5 {
		c.Add(10 * time.Millisecond)
		rec := post(t, h, llm.EndpointChat, chat("m", 20))
		if rec.Code != http.StatusOK || header(rec, "x-ratelimit-remaining-requests") != fmt.Sprint(4-i) {
			t.Fatalf("synchronous call %d while the batch runs: %d, remaining %s", i, rec.Code, header(rec, "x-ratelimit-remaining-requests"))
		}
	}
	if rec := post(t, h, llm.EndpointChat, chat("m", 20)); rec.Code != http.StatusTooManyRequests {
		t.Errorf("sixth call: %d", rec.Code)
	}
	c.Add(time.Second)
	if b = getBatch(t, h, b.ID); b.Status != "completed" || b.RequestCounts.Completed != 500 {
		t.Fatalf("batch: %+v", b)
	}
	if st := s.Stats(); st.Requests != 6 || st.Admitted != 5 || st.RateLimited != 1 || len(s.Admissions(0)) != 6 {
		t.Errorf("stats %+v", st)
	}
}

func TestFilesEndpoints(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, APIKey: "sk-test", Batch: sim.BatchConfig{MaxFileBytes: 1000}})
	inner := s.Handler()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer sk-test")
		inner.ServeHTTP(w, r)
	})
	data := chatFile(3, "m")
	f := upload(t, h, data)
	if !strings.HasPrefix(f.ID, "file-") || f.Object != "file" || f.Bytes != len(data) || f.Filename != "input.jsonl" ||
		f.Purpose != "batch" || f.CreatedAt != c.Now().Unix() {
		t.Errorf("uploaded %+v", f)
	}
	var got fileObj
	if rec := do(t, h, http.MethodGet, "/v1/files/"+f.ID, nil, ""); rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got != f {
		t.Errorf("get: %d %s", rec.Code, rec.Body)
	}
	if rec := do(t, h, http.MethodGet, "/v1/files/"+f.ID+"/content", nil, ""); rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), data) {
		t.Errorf("content: %d %q", rec.Code, rec.Body)
	}
	rec := do(t, h, http.MethodDelete, "/v1/files/"+f.ID, nil, "")
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"id":"`+f.ID+`","object":"file","deleted":true}` {
		t.Errorf("delete: %d %s", rec.Code, rec.Body)
	}
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/v1/files/" + f.ID}, {http.MethodGet, "/v1/files/" + f.ID + "/content"}, {http.MethodDelete, "/v1/files/" + f.ID},
	} {
		rec := do(t, h, r.method, r.path, nil, "")
		if e := decodeErr(t, rec); rec.Code != http.StatusNotFound || e.Error.Type != "invalid_request_error" || e.Error.Message != "No such File object: "+f.ID {
			t.Errorf("%s %s after delete: %d %s", r.method, r.path, rec.Code, rec.Body)
		}
	}

	for _, tc := range []struct {
		name    string
		rec     *httptest.ResponseRecorder
		param   string
		context string
	}{
		{"purpose", uploadReq(t, h, "/v1/files", "fine-tune", data), "purpose", ""},
		{"no purpose", uploadReq(t, h, "/v1/files", "", data), "purpose", ""},
		{"no file", uploadReq(t, h, "/v1/files", "batch", nil), "file", ""},
		{"too large", uploadReq(t, h, "/v1/files", "batch", bytes.Repeat([]byte("x"), 1001)), "file", ""},
		{"not multipart", do(t, h, http.MethodPost, "/v1/files", strings.NewReader(`{}`), "application/json"), "", ""},
	} {
		if tc.rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", tc.name, tc.rec.Code, tc.rec.Body)
			continue
		}
		if e := decodeErr(t, tc.rec); e.Error.Type != "invalid_request_error" || (tc.param == "") != (e.Error.Param == nil) || e.Error.Param != nil && *e.Error.Param != tc.param {
			t.Errorf("%s: %s", tc.name, tc.rec.Body)
		}
	}
	// The limit is inclusive.
	if rec := uploadReq(t, h, "/v1/files", "batch", bytes.Repeat([]byte("x"), 1000)); rec.Code != http.StatusOK {
		t.Errorf("a file of the limit's size: %d %s", rec.Code, rec.Body)
	}
	// Without the key: 401, for files and batches alike.
	for _, path := range []string{"/v1/files/" + f.ID, "/v1/batches"} {
		if rec := do(t, inner, http.MethodGet, path, nil, ""); rec.Code != http.StatusUnauthorized {
			t.Errorf("GET %s without the key: %d", path, rec.Code)
		}
	}
	if bs := s.BatchStats(); bs.FilesUploaded != 2 {
		t.Errorf("%d files uploaded", bs.FilesUploaded)
	}
}

func TestBatchList(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now})
	h := s.Handler()
	f := upload(t, h, chatFile(2, "m"))
	var made []string
	for range 3 {
		made = append(made, createBatch(t, h, f.ID, llm.EndpointChat).ID)
		c.Add(time.Second)
	}
	type list struct {
		Object  string     `json:"object"`
		Data    []batchObj `json:"data"`
		FirstID *string    `json:"first_id"`
		LastID  *string    `json:"last_id"`
		HasMore bool       `json:"has_more"`
	}
	get := func(query string) list {
		t.Helper()
		rec := do(t, h, http.MethodGet, "/v1/batches"+query, nil, "")
		var l list
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
			t.Fatalf("list%s: %d %s", query, rec.Code, rec.Body)
		}
		return l
	}
	page := get("?limit=2")
	if page.Object != "list" || len(page.Data) != 2 || page.Data[0].ID != made[2] || page.Data[1].ID != made[1] || !page.HasMore ||
		*page.FirstID != made[2] || *page.LastID != made[1] || page.Data[0].Status != "completed" {
		t.Fatalf("first page %+v", page)
	}
	page = get("?limit=2&after=" + *page.LastID)
	if len(page.Data) != 1 || page.Data[0].ID != made[0] || page.HasMore {
		t.Fatalf("second page %+v", page)
	}
	if page = get(""); len(page.Data) != 3 || page.HasMore {
		t.Errorf("default page %+v", page)
	}
	if page = get("?after=" + made[0]); len(page.Data) != 0 || page.FirstID != nil || page.LastID != nil {
		t.Errorf("past the end %+v", page)
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x", "?after=batch_nope"} {
		if rec := do(t, h, http.MethodGet, "/v1/batches"+q, nil, ""); rec.Code != http.StatusBadRequest {
			t.Errorf("list%s: %d", q, rec.Code)
		}
	}
}

// Azure OpenAI's paths: api-version required under /openai, endpoints and
// urls without /v1.
func TestBatchAzurePaths(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now})
	h := s.Handler()
	var in strings.Builder
	for i := range 5 {
		in.WriteString(strings.Replace(chatLine(fmt.Sprintf("a-%d", i), "my-deployment", "hi"), llm.EndpointChat, "/chat/completions", 1) + "\n")
	}
	if rec := uploadReq(t, h, "/openai/files", "batch", []byte(in.String())); rec.Code != http.StatusNotFound {
		t.Errorf("without api-version: %d", rec.Code)
	}
	rec := uploadReq(t, h, "/openai/files?api-version=2024-10-21", "batch", []byte(in.String()))
	var f fileObj
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &f) != nil {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	b := decodeBatch(t, do(t, h, http.MethodPost, "/openai/batches?api-version=2024-10-21",
		strings.NewReader(`{"input_file_id":"`+f.ID+`","endpoint":"/chat/completions","completion_window":"24h"}`), "application/json"))
	c.Add(time.Second)
	b = decodeBatch(t, do(t, h, http.MethodGet, "/openai/v1/batches/"+b.ID, nil, ""))
	if b.Status != "completed" || b.Endpoint != "/chat/completions" || b.RequestCounts.Completed != 5 {
		t.Fatalf("%+v", b)
	}
	rec = do(t, h, http.MethodGet, "/openai/files/"+*b.OutputFileID+"/content?api-version=2024-10-21", nil, "")
	if rec.Code != 200 || strings.Count(rec.Body.String(), "\n") != 5 {
		t.Errorf("output: %d %s", rec.Code, rec.Body)
	}
}

// GET /sim/stats reports the batch counters, and with custom_ids the runs.
func TestBatchStatsEndpoint(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now})
	h := s.Handler()
	createBatch(t, h, upload(t, h, chatFile(4, "m")).ID, llm.EndpointChat)
	c.Add(time.Second)
	var rep sim.StatsReport
	if err := json.Unmarshal(do(t, h, http.MethodGet, "/sim/stats?custom_ids=1", nil, "").Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Batch.FilesUploaded != 1 || rep.Batch.BatchesCreated != 1 || rep.Batch.BatchesCompleted != 1 || rep.Batch.LinesProcessed != 4 ||
		len(rep.CustomIDRuns) != 4 || rep.CustomIDRuns["req-3"] != 1 {
		t.Errorf("report %+v", rep)
	}
	rec := do(t, h, http.MethodGet, "/sim/stats", nil, "")
	if strings.Contains(rec.Body.String(), "custom_id_runs") || !strings.Contains(rec.Body.String(), `"lines_processed":4`) {
		t.Errorf("without custom_ids: %s", rec.Body)
	}
	// A line run again in another batch is counted.
	createBatch(t, h, upload(t, h, chatFile(2, "m")).ID, llm.EndpointChat)
	c.Add(time.Second)
	if bs := s.BatchStats(); bs.LinesRepeated != 2 || s.CustomIDRuns()["req-1"] != 2 {
		t.Errorf("repeated: %+v", bs)
	}
	s.Reset()
	if bs := s.BatchStats(); bs.LinesProcessed != 0 || bs.FilesUploaded != 0 || len(s.CustomIDRuns()) != 0 {
		t.Errorf("after Reset: %+v", bs)
	}
}

// With the default settings a batch of a few thousand lines completes
// within a second of the simulator's clock.
func TestBatchDefaultsCompleteWithinASecond(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now})
	h := s.Handler()
	b := createBatch(t, h, upload(t, h, chatFile(3000, "m")).ID, llm.EndpointChat)
	c.Add(700 * time.Millisecond)
	if b := getBatch(t, h, b.ID); b.Status != "completed" || b.RequestCounts.Completed != 3000 {
		t.Errorf("after 0.7 s: %s %+v", b.Status, b.RequestCounts)
	}
}

func TestBatchConfigValidate(t *testing.T) {
	t.Parallel()
	for _, b := range []sim.BatchConfig{
		{ExpireFraction: 1.5}, {ExpireFraction: -0.1}, {FailRate: 2}, {MaxLines: -1}, {MaxFileBytes: -1},
		{QueueLimit: -1}, {QueueLimits: map[string]int64{"m": -5}},
	} {
		if err := (sim.Config{Batch: b}).Validate(); err == nil || !strings.Contains(err.Error(), "Config.Batch.") {
			t.Errorf("%+v: %v", b, err)
		}
	}
	s := sim.New(sim.Config{})
	if err := s.SetBatchConfig(sim.BatchConfig{FailRate: -1}); err == nil {
		t.Error("SetBatchConfig took a negative FailRate")
	}
}

// The official SDK reads the simulator's files and batches, on the real
// clock with the default settings.
func TestBatchOpenAISDK(t *testing.T) {
	t.Parallel()
	ts := sim.Start(sim.Config{APIKey: "sk-sdk"})
	defer ts.Close()
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	client := openai.NewClient(option.WithBaseURL(ts.BaseURL), option.WithAPIKey("sk-sdk"), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	f, err := client.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(chatFile(500, "m")), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil || f.Purpose != "batch" || f.Bytes != int64(len(chatFile(500, "m"))) {
		t.Fatalf("upload: %v %+v", err, f)
	}
	b, err := client.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	if err != nil || b.Status != openai.BatchStatusValidating {
		t.Fatalf("create: %v %+v", err, b)
	}
	start := time.Now()
	for b.Status != openai.BatchStatusCompleted {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("not completed after 10 s: %s %+v", b.Status, b.RequestCounts)
		}
		time.Sleep(50 * time.Millisecond)
		if b, err = client.Batches.Get(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	if b.RequestCounts.Total != 500 || b.RequestCounts.Completed != 500 || b.OutputFileID == "" || b.CompletedAt == 0 {
		t.Errorf("completed %+v", b)
	}
	resp, err := client.Files.Content(ctx, b.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(data), "\n"); n != 500 {
		t.Errorf("%d output lines", n)
	}
	page, err := client.Batches.List(ctx, openai.BatchListParams{Limit: openai.Int(10)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Errorf("list: %v %+v", err, page)
	}
	_, err = client.Batches.Cancel(ctx, b.ID)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Message != "Cannot cancel a batch with status 'completed'." || apiErr.Type != "invalid_request_error" {
		t.Errorf("cancel a completed batch: %v", err)
	}
	if del, err := client.Files.Delete(ctx, f.ID); err != nil || !del.Deleted {
		t.Errorf("delete: %v %+v", err, del)
	}
	if _, err := client.Files.Get(ctx, f.ID); err == nil {
		t.Error("a deleted file was found")
	}
}

// Synchronous calls, uploads and polls run concurrently with batches.
func TestBatchConcurrent(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Limits: sim.Limits{RPM: 100_000, TPM: 10_000_000}})
	h := s.Handler()
	var ids []string
	for i := range 3 {
		var in strings.Builder
		for j := range 300 {
			in.WriteString(chatLine(fmt.Sprintf("c%d-%d", i, j), "m", "hello world") + "\n")
		}
		ids = append(ids, createBatch(t, h, upload(t, h, []byte(in.String())).ID, llm.EndpointChat).ID)
	}
	errc := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 50 {
				var rec *httptest.ResponseRecorder
				switch g % 3 {
				case 0:
					rec = post(t, h, llm.EndpointChat, chat("m", 10))
				case 1:
					rec = do(t, h, http.MethodGet, "/v1/batches/"+ids[i%3], nil, "")
				default:
					rec = do(t, h, http.MethodGet, "/sim/stats", nil, "")
				}
				if rec.Code != http.StatusOK {
					errc <- fmt.Errorf("goroutine %d: %d %s", g, rec.Code, rec.Body)
					return
				}
				time.Sleep(time.Millisecond)
			}
			errc <- nil
		}()
	}
	for range 8 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range ids {
		for getBatch(t, h, id).Status != "completed" {
			if time.Now().After(deadline) {
				t.Fatalf("%s not completed", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if bs := s.BatchStats(); bs.LinesProcessed != 900 || bs.LinesRepeated != 0 {
		t.Errorf("stats %+v", bs)
	}
}
