package llm_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

const testKey = "sk-test-0123456789abcdefghij"

func startSim(t *testing.T, cfg sim.Config) *sim.TestServer {
	t.Helper()
	ts := sim.Start(cfg)
	t.Cleanup(ts.Close)
	return ts
}

// newProvider returns a provider whose idle connections are closed when the
// test ends, so goleak sees no transport goroutines.
func newProvider(t *testing.T, baseURL string, timeout time.Duration) llm.Provider {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return llm.NewOpenAI(llm.OpenAIConfig{Name: "test", BaseURL: baseURL, APIKey: testKey, Timeout: timeout, HTTPClient: &http.Client{Transport: tr}})
}

func asError(t *testing.T, err error) *llm.Error {
	t.Helper()
	var e *llm.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want *llm.Error", err, err)
	}
	if strings.Contains(e.Error(), testKey) {
		t.Fatalf("Error() holds the API key: %q", e.Error())
	}
	return e
}

func TestOpenAIChatAgainstSimulator(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{APIKey: testKey, Limits: sim.Limits{RPM: 100, TPM: 100000}, Seed: 7})
	p := newProvider(t, ts.BaseURL, 5*time.Second)
	if p.Name() != "test" {
		t.Errorf("Name() = %q", p.Name())
	}
	body := `{"model":"fast","messages":[{"role":"user","content":"Say hello to the queue."}],"max_tokens":50,"temperature":0}`
	resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Upstream: "gpt-4o-mini", Body: json.RawMessage(body)})
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message      struct{ Role, Content string } `json:"message"`
			FinishReason string                         `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(resp.Body, &out); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || out.Object != "chat.completion" || out.Model != "gpt-4o-mini" || len(out.Choices) != 1 || out.Choices[0].Message.Content == "" {
		t.Errorf("response %d %s", resp.StatusCode, resp.Body)
	}
	parsed, _ := llm.NewEstimator().Parse(llm.EndpointChat, "", "", []byte(body))
	if resp.Usage.PromptTokens != parsed.ContentTokens || resp.Usage.CompletionTokens < 1 || resp.Usage.CompletionTokens > 50 ||
		resp.Usage.TotalTokens != resp.Usage.PromptTokens+resp.Usage.CompletionTokens {
		t.Errorf("usage %+v", resp.Usage)
	}
	if resp.RequestID == "" {
		t.Error("no request id")
	}
	rl := resp.RateLimit
	if rl.LimitRequests != 100 || rl.RemainingRequests != 99 || rl.LimitTokens != 100000 || !rl.Known(llm.HasResetTokens) {
		t.Errorf("rate limit %+v", rl)
	}
	adm := ts.Admissions(0)
	if len(adm) != 1 || adm[0].Model != "gpt-4o-mini" || adm[0].Outcome != sim.Admitted {
		t.Errorf("admissions %+v", adm)
	}
}

func TestOpenAIEmbeddingsAgainstSimulator(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{EmbeddingDim: 8})
	p := newProvider(t, ts.BaseURL, 5*time.Second)
	for _, format := range []string{"float", "base64"} {
		body := `{"model":"text-embedding-3-small","input":["one","two words"],"encoding_format":"` + format + `"}`
		resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointEmbeddings, Body: json.RawMessage(body)})
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Data []struct {
				Index     int             `json:"index"`
				Embedding json.RawMessage `json:"embedding"`
			} `json:"data"`
		}
		if err := json.Unmarshal(resp.Body, &out); err != nil || len(out.Data) != 2 {
			t.Fatalf("%s: %v %s", format, err, resp.Body)
		}
		// The client gets the encoding it asked for, not go-openai's floats.
		if format == "base64" {
			var s string
			if err := json.Unmarshal(out.Data[1].Embedding, &s); err != nil {
				t.Fatalf("base64 embedding came back as %s", out.Data[1].Embedding)
			}
			if raw, err := base64.StdEncoding.DecodeString(s); err != nil || len(raw) != 8*4 {
				t.Errorf("base64 embedding: %v, %d bytes", err, len(raw))
			}
		} else {
			var v []float32
			if err := json.Unmarshal(out.Data[1].Embedding, &v); err != nil || len(v) != 8 {
				t.Errorf("float embedding: %v %v", err, v)
			}
		}
		if resp.Usage.PromptTokens != 3 || resp.Usage.TotalTokens != 3 {
			t.Errorf("%s usage %+v", format, resp.Usage)
		}
	}
}

// recorder is a provider stand-in that answers with a fixed status, headers
// and body, and keeps what it was sent.
type recorder struct {
	mu      sync.Mutex
	bodies  []string
	auth    []string
	status  int
	headers map[string]string
	body    string
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.bodies = append(rec.bodies, string(b))
	rec.auth = append(rec.auth, r.Header.Get("Authorization"))
	rec.mu.Unlock()
	for k, v := range rec.headers {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rec.status)
	_, _ = io.WriteString(w, rec.body)
}

func startRecorder(t *testing.T, rec *recorder) string {
	t.Helper()
	hs := httptest.NewServer(rec)
	t.Cleanup(hs.Close)
	return hs.URL + "/v1"
}

const okChat = `{"id":"x","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"hi","annotations":[]},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4}},"extra_field":{"kept":true}}`

func TestOpenAIWireBodyIsTheClients(t *testing.T) {
	t.Parallel()
	rec := &recorder{status: 200, body: okChat, headers: map[string]string{"x-request-id": "req_1"}}
	p := newProvider(t, startRecorder(t, rec), 5*time.Second)
	body := `{"model":"mine","messages":[{"role":"user","content":[{"type":"text","text":"listen"},{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}],` +
		`"temperature":0,"top_p":0,"stop":"END","prompt_cache_key":"k1","modalities":["text"],"max_tokens":5}`
	resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Upstream: "up-model", Body: json.RawMessage(body)})
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Body) != okChat {
		t.Errorf("body not verbatim: %s", resp.Body)
	}
	if !reflect.DeepEqual(resp.Usage, (llm.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12, CachedTokens: 4})) || resp.RequestID != "req_1" {
		t.Errorf("usage %+v, request id %q", resp.Usage, resp.RequestID)
	}
	var sent map[string]any
	if err := json.Unmarshal([]byte(rec.bodies[0]), &sent); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"model": "up-model", "temperature": 0.0, "top_p": 0.0, "stop": "END", "prompt_cache_key": "k1"} {
		if sent[k] != want {
			t.Errorf("sent %s = %v, want %v", k, sent[k], want)
		}
	}
	if !strings.Contains(rec.bodies[0], `"data":"UklGRg=="`) || !strings.Contains(rec.bodies[0], `"modalities":["text"]`) {
		t.Errorf("sent body lost fields: %s", rec.bodies[0])
	}
	if rec.auth[0] != "Bearer "+testKey {
		t.Errorf("Authorization %q", rec.auth[0])
	}
}

func TestOpenAIErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		status  int
		headers map[string]string
		body    string
		class   llm.Class
		check   func(t *testing.T, e *llm.Error)
	}{
		{"429 tokens", 429, map[string]string{
			"retry-after-ms": "1250", "retry-after": "2", "x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "2.5s", "x-request-id": "req_429",
		}, `{"error":{"message":"Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Used 30000, Requested 500.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			llm.ClassRateLimited, func(t *testing.T, e *llm.Error) {
				if d, ok := e.RateLimit.Delay(); !ok || d != 1250*time.Millisecond {
					t.Errorf("delay %v %v", d, ok)
				}
				if e.RateLimit.RemainingTokens != 0 || !e.RateLimit.Known(llm.HasRemainingTokens) || e.RequestID != "req_429" {
					t.Errorf("rate limit %+v, request id %q", e.RateLimit, e.RequestID)
				}
				if e.Code != client.CodeRateLimitExceeded || e.Type != "tokens" || !strings.Contains(e.Message, "Limit 30000") {
					t.Errorf("error %+v", e)
				}
			}},
		{"429 quota is permanent", 429, nil,
			`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			llm.ClassPermanent, nil},
		{"500", 500, nil, `{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`,
			llm.ClassRetryable, func(t *testing.T, e *llm.Error) {
				if !strings.Contains(e.Message, "server had an error") {
					t.Errorf("message %q", e.Message)
				}
			}},
		{"502 html", 502, nil, "<html><body>\n<h1>502 Bad Gateway</h1>\n</body></html>", llm.ClassRetryable, func(t *testing.T, e *llm.Error) {
			if e.Message != "The provider answered 502 Bad Gateway without an error it explains (not OpenAI's error shape)." {
				t.Errorf("message %q", e.Message)
			}
		}},
		// The outside probe's: a server's traceback with a DSN in it never
		// reaches the tenant, as HTML or inside an error object.
		{"500 traceback", 500, nil, "<html><pre>Traceback (most recent call last):\n  File \"app.py\", line 3\npsycopg2.OperationalError: postgres://app:s3cret@db:5432/prod</pre></html>",
			llm.ClassRetryable, func(t *testing.T, e *llm.Error) {
				if strings.Contains(e.Message, "s3cret") || strings.Contains(e.Message, "Traceback") || !strings.Contains(e.Message, "500 Internal Server Error") {
					t.Errorf("message %q", e.Message)
				}
			}},
		{"500 traceback in an error object", 500, nil,
			`{"error":{"message":"Traceback (most recent call last):\n  File \"x\"\n    db.connect()\nOperationalError: postgres://app:s3cret@db/prod","type":"server_error","param":null,"code":null}}`,
			llm.ClassRetryable, func(t *testing.T, e *llm.Error) {
				if e.Message != "The provider answered 500 Internal Server Error." {
					t.Errorf("message %q", e.Message)
				}
			}},
		{"503 with a DSN in one line", 503, nil, `{"error":{"message":"cannot reach postgres://app:s3cret@db/prod","type":"server_error","param":null,"code":null}}`,
			llm.ClassRetryable, func(t *testing.T, e *llm.Error) {
				if e.Message != "cannot reach postgres://[redacted]@db/prod" {
					t.Errorf("message %q", e.Message)
				}
			}},
		{"500 with a huge message", 500, nil, `{"error":{"message":"` + strings.Repeat("é", 3000) + `","type":"server_error","param":null,"code":null}}`,
			llm.ClassRetryable, func(t *testing.T, e *llm.Error) {
				if len(e.Message) > 1010 || !strings.HasSuffix(e.Message, "é…") {
					t.Errorf("message of %d bytes ending %q", len(e.Message), e.Message[len(e.Message)-10:])
				}
			}},
		// A 200 the provider cut short is worth another call; one that is
		// JSON but not an answer's shape (a usage of 1.5 tokens) is not.
		{"200 truncated", 200, nil, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"mess`,
			llm.ClassRetryable, func(t *testing.T, e *llm.Error) {
				if e.Code != client.CodeProviderResponseUnreadable {
					t.Errorf("error %+v", e)
				}
			}},
		{"200 with a usage of 1.5 tokens", 200, nil, `{"id":"chatcmpl-1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1.5,"completion_tokens":2,"total_tokens":3.5}}`,
			llm.ClassPermanent, func(t *testing.T, e *llm.Error) {
				if e.Code != client.CodeProviderResponseInvalid {
					t.Errorf("error %+v", e)
				}
			}},
		{"400", 400, nil, `{"error":{"message":"Invalid value for 'temperature': must be at most 2.","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}`,
			llm.ClassPermanent, func(t *testing.T, e *llm.Error) {
				if e.Param != "temperature" || e.Code != client.CodeInvalidValue || e.StatusCode != 400 {
					t.Errorf("error %+v", e)
				}
			}},
		{"unexpected status", 304, nil, "", llm.ClassPermanent, nil},
		{"401 echoing the key", 401, nil, `{"error":{"message":"Incorrect API key provided: ` + testKey + `.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			llm.ClassPermanent, func(t *testing.T, e *llm.Error) {
				if strings.Contains(e.Message, testKey) {
					t.Errorf("message holds the key: %q", e.Message)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{status: c.status, headers: c.headers, body: c.body}
			p := newProvider(t, startRecorder(t, rec), 5*time.Second)
			_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)})
			e := asError(t, err)
			if e.Class != c.class || e.StatusCode != c.status || e.Provider != "test" {
				t.Errorf("class %v status %d provider %q; want %v %d", e.Class, e.StatusCode, e.Provider, c.class, c.status)
			}
			if c.check != nil {
				c.check(t, e)
			}
		})
	}
}

func TestOpenAIRefusesBeforeSending(t *testing.T) {
	t.Parallel()
	rec := &recorder{status: 200, body: okChat}
	p := newProvider(t, startRecorder(t, rec), 5*time.Second)
	cases := []struct {
		name, endpoint, body string
	}{
		{"stream", llm.EndpointChat, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"stream":true}`},
		{"not an object", llm.EndpointChat, `[]`},
		{"unknown endpoint", "/v1/images/generations", `{"model":"dall-e"}`},
		{"embeddings go-openai cannot decode", llm.EndpointEmbeddings, `{"model":"e","input":"x","dimensions":"many"}`},
	}
	for _, c := range cases {
		_, err := p.Call(context.Background(), llm.Request{Endpoint: c.endpoint, Body: json.RawMessage(c.body)})
		e := asError(t, err)
		if e.Class != llm.ClassPermanent || e.StatusCode != 0 || e.Message == "" {
			t.Errorf("%s: %+v", c.name, e)
		}
	}
	if len(rec.bodies) != 0 {
		t.Errorf("%d requests were sent", len(rec.bodies))
	}
}

// TestOpenAILeavesJudgementToProvider: bodies go-openai's types or checks
// would refuse are sent as they are.
func TestOpenAILeavesJudgementToProvider(t *testing.T) {
	t.Parallel()
	rec := &recorder{status: 200, body: okChat}
	p := newProvider(t, startRecorder(t, rec), 5*time.Second)
	bodies := []string{
		`{"model":"o1","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"n":2,"temperature":0.5}`,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"metadata":{"a":1},"logit_bias":{"50256":-1.5}}`,
	}
	for _, b := range bodies {
		if _, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(b)}); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
	if len(rec.bodies) != 2 || !strings.Contains(rec.bodies[0], `"max_tokens":10`) || !strings.Contains(rec.bodies[1], `"metadata":{"a":1}`) {
		t.Errorf("sent %q", rec.bodies)
	}
}

func TestOpenAITimeout(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{Faults: sim.Faults{RateHang: 1}})
	p := newProvider(t, ts.BaseURL, 50*time.Millisecond)
	// The caller's context has no deadline: the provider's own applies.
	_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
	e := asError(t, err)
	if e.Class != llm.ClassRetryable || e.StatusCode != 0 || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(e.Message, "50ms") {
		t.Errorf("%+v (%v)", e, err)
	}
	// The handler notices the client left and finishes.
	deadline := time.Now().Add(10 * time.Second)
	for ts.Stats().InFlight != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := ts.Stats(); st.Hung != 1 || st.Admitted != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestOpenAICancel(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{Faults: sim.Faults{RateHang: 1}})
	p := newProvider(t, ts.BaseURL, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := p.Call(ctx, llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
		done <- err
	}()
	// Cancel once the request is hanging at the provider.
	deadline := time.Now().Add(10 * time.Second)
	for ts.Stats().Hung == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	err := <-done
	e := asError(t, err)
	if e.Class != llm.ClassRetryable || e.StatusCode != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("%+v (%v)", e, err)
	}
}

// A simulated provider that goes down refuses the calls (a retryable
// failure, no answer), and serves them again on the same URL when it comes
// back.
func TestOpenAIProviderDownAndBack(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{})
	p := newProvider(t, ts.BaseURL, 5*time.Second)
	call := func() error {
		_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Upstream: "m",
			Body: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)})
		return err
	}
	if err := call(); err != nil {
		t.Fatalf("up: %v", err)
	}
	ts.Down()
	e := asError(t, call())
	if e.Class != llm.ClassRetryable || e.StatusCode != 0 {
		t.Errorf("down: %+v, want a retryable failure with no answer", e)
	}
	if err := ts.Up(); err != nil {
		t.Fatal(err)
	}
	if err := call(); err != nil {
		t.Fatalf("back up: %v", err)
	}
	if n := ts.Stats().Admitted; n != 2 {
		t.Errorf("the provider admitted %d calls, want 2 (none while down)", n)
	}
}

func TestOpenAIConnectionRefused(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.NotFoundHandler())
	url := hs.URL + "/v1"
	hs.Close()
	p := newProvider(t, url, 5*time.Second)
	_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
	e := asError(t, err)
	if e.Class != llm.ClassRetryable || e.StatusCode != 0 || e.Err == nil {
		t.Errorf("%+v", e)
	}
}

func TestOpenAISimulatorRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	ts := startSim(t, sim.Config{Limits: sim.Limits{RPM: 2}, Now: func() time.Time { return now }})
	p := newProvider(t, ts.BaseURL, 5*time.Second)
	req := llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)}
	for range 2 {
		if _, err := p.Call(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.Call(context.Background(), req)
	e := asError(t, err)
	// RPM 2 refills one request every 30s.
	if d, ok := e.RateLimit.Delay(); e.Class != llm.ClassRateLimited || !ok || d != 30*time.Second {
		t.Errorf("%+v delay %v", e, d)
	}
	if e.Type != "requests" || e.Code != client.CodeRateLimitExceeded || !strings.Contains(e.Message, "Limit 2") {
		t.Errorf("%+v", e)
	}
}

// TestOpenAIConcurrent runs many calls on one provider at once; each must get
// its own answer and headers (run with -race).
func TestOpenAIConcurrent(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{Faults: sim.Faults{Rate429: 0.3}, Seed: 3})
	p := newProvider(t, ts.BaseURL, 5*time.Second)
	var wg sync.WaitGroup
	var ok, limited atomic.Int64
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model := fmt.Sprintf("model-%d", i)
			resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)})
			if err != nil {
				if e := asError(t, err); e.Class != llm.ClassRateLimited || e.RateLimit.RetryAfter != time.Second {
					t.Errorf("%s: %+v", model, e)
				}
				limited.Add(1)
				return
			}
			var out struct{ Model string }
			if json.Unmarshal(resp.Body, &out) != nil || out.Model != model {
				t.Errorf("%s got the answer for %s", model, out.Model)
			}
			ok.Add(1)
		}()
	}
	wg.Wait()
	if ok.Load()+limited.Load() != 200 || limited.Load() == 0 || ok.Load() == 0 {
		t.Errorf("ok %d, limited %d", ok.Load(), limited.Load())
	}
}

// An answer past the provider's max_response_bytes fails the call with a
// code that says so, unstreamed and streamed; nothing of it is kept.
func TestOpenAIResponseBound(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{Seed: 1, CompletionMin: 1, CompletionMax: 1})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	p := llm.NewOpenAI(llm.OpenAIConfig{Name: "test", BaseURL: ts.BaseURL, HTTPClient: &http.Client{Transport: tr}, MaxResponseBytes: 2048})
	body := json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2000}`)
	_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: body})
	if e := asError(t, err); e.Code != client.CodeProviderResponseTooLarge || e.Class != llm.ClassPermanent || e.StatusCode != 200 {
		t.Fatalf("unstreamed: %+v", e)
	}
	chunks := 0
	_, err = p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: body,
		Stream: func([]byte) error { chunks++; return nil }})
	if e := asError(t, err); e.Code != client.CodeProviderResponseTooLarge || e.Relayed != chunks {
		t.Fatalf("streamed: %+v after %d chunks", e, chunks)
	}
	// Within the bound all is well.
	small := json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	if _, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: small}); err != nil {
		t.Fatal(err)
	}
}
