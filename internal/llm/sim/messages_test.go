package sim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
)

// send posts body to Anthropic's Messages API with the headers Anthropic
// requires.
func send(s *sim.Server, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
	req.Header.Set("x-api-key", "sk-ant-test")
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, req)
	return w
}

// ask is a Messages API body: a user turn of prompt tokens.
func ask(model string, prompt, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, model, maxTokens, words(prompt))
}

// cached is a Messages API body whose system prompt of prefix tokens is a
// cache breakpoint (ttl "" for the default), then a user turn of rest
// tokens.
func cached(prefix int, ttl string, rest int, maxTokens int) string {
	cc := `{"type":"ephemeral"}`
	if ttl != "" {
		cc = `{"type":"ephemeral","ttl":"` + ttl + `"}`
	}
	return fmt.Sprintf(`{"model":"claude","max_tokens":%d,"system":[{"type":"text","text":%q,"cache_control":%s}],"messages":[{"role":"user","content":%q}]}`,
		maxTokens, words(prefix), cc, words(rest))
}

type anthropicUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreation            struct {
		Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
	OutputTokens int64 `json:"output_tokens"`
}

type messageBody struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason   string         `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

func decode[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	return v
}

// claude is a model with Anthropic's limits: 50 RPM, 40,000 ITPM, 8,000
// OTPM.
var claude = map[string]sim.Model{"claude": {Limits: sim.Limits{RPM: 50, ITPM: 40_000, OTPM: 8_000}}}

// A Message has Anthropic's shape, and every answer carries Anthropic's
// rate-limit headers: limits, remaining (tokens rounded to the nearest
// thousand), the RFC 3339 time each bucket is full again, and for tokens
// the most restrictive of the token limits.
func TestMessagesShapeAndHeaders(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Models: claude, Now: c.Now, CompletionMin: 0.5, CompletionMax: 0.5})
	w := send(s, `{"model":"claude","max_tokens":100,"system":"`+words(600)+`","stop_sequences":["END"],`+
		`"messages":[{"role":"user","content":[{"type":"text","text":"`+words(1000)+`"}]}]}`)
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	m := decode[messageBody](t, w)
	if m.Type != "message" || m.Role != "assistant" || m.Model != "claude" || !strings.HasPrefix(m.ID, "msg_") ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text == "" {
		t.Errorf("message %+v", m)
	}
	if m.StopReason != "stop_sequence" || m.StopSequence == nil || *m.StopSequence != "END" {
		t.Errorf("stop %q %v, want stop_sequence END", m.StopReason, m.StopSequence)
	}
	if m.Usage != (anthropicUsage{InputTokens: 1600, OutputTokens: 50}) {
		t.Errorf("usage %+v, want 1600 in, 50 out", m.Usage)
	}
	h := w.Header()
	now := c.Now().UTC()
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339) }
	want := map[string]string{
		"request-id":                                  "req_0_1",
		"anthropic-ratelimit-requests-limit":          "50",
		"anthropic-ratelimit-requests-remaining":      "49",
		"anthropic-ratelimit-requests-reset":          at(2 * time.Second), // 1.2 s to refill one, up to the second
		"anthropic-ratelimit-input-tokens-limit":      "40000",
		"anthropic-ratelimit-input-tokens-remaining":  "38000",             // 38,400
		"anthropic-ratelimit-input-tokens-reset":      at(3 * time.Second), // 1,600 at 40,000/min: 2.4 s
		"anthropic-ratelimit-output-tokens-limit":     "8000",
		"anthropic-ratelimit-output-tokens-remaining": "8000",          // 7,900: max_tokens charged
		"anthropic-ratelimit-output-tokens-reset":     at(time.Second), // 100 at 8,000/min: 0.75 s
		// the tightest: 38,400/40,000 of input left, 7,900/8,000 of output
		"anthropic-ratelimit-tokens-limit":     "40000",
		"anthropic-ratelimit-tokens-remaining": "38000",
		"anthropic-ratelimit-tokens-reset":     at(3 * time.Second),
		"content-type":                         "application/json",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if h.Get("retry-after") != "" || h.Get("x-ratelimit-limit-requests") != "" {
		t.Errorf("headers %v: no retry-after on a 200, no OpenAI headers", h)
	}
}

// The remaining tokens are rounded to the nearest thousand, a tie down.
func TestMessagesRemainingRounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		prompt int
		want   string
	}{{499, "40000"}, {500, "39000"}, {501, "39000"}, {1499, "39000"}, {1500, "38000"}} {
		c := newClock()
		s := sim.New(sim.Config{Models: claude, Now: c.Now})
		w := send(s, ask("claude", tc.prompt, 1))
		if got := w.Header().Get("anthropic-ratelimit-input-tokens-remaining"); got != tc.want {
			t.Errorf("prompt %d: remaining %q, want %q", tc.prompt, got, tc.want)
		}
	}
}

// OTPM is charged max_tokens at admission and corrected to the real output
// when the call ends; a 429 names the limit, says when to retry in whole
// seconds, and charges nothing.
func TestMessagesOutputCorrected(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Models: claude, Now: c.Now, CompletionMin: 0.5, CompletionMax: 0.5})
	// 8,000 charged, 4,000 produced: 4,000 back
	if w := send(s, ask("claude", 10, 8000)); w.Code != 200 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	// fits only because the first call was corrected; 2,000 back
	if w := send(s, ask("claude", 10, 4000)); w.Code != 200 {
		t.Fatalf("second: %d %s", w.Code, w.Body)
	}
	// 2,000 left: 2,001 waits for one token at 8,000 a minute (7.5 ms)
	w := send(s, ask("claude", 10, 2001))
	if w.Code != 429 || w.Header().Get("retry-after") != "1" {
		t.Fatalf("third: %d %v %s, want 429 with retry-after 1", w.Code, w.Header(), w.Body)
	}
	type errorBody struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
	e := decode[errorBody](t, w)
	if e.Type != "error" || e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "8000 output tokens per minute") ||
		e.RequestID != w.Header().Get("request-id") || e.RequestID == "" {
		t.Errorf("429 body %+v", e)
	}
	if w := send(s, ask("claude", 10, 2000)); w.Code != 200 {
		t.Fatalf("fourth, 2,000 of the 2,000 left: %d %s", w.Code, w.Body)
	}
	var got []string
	for _, a := range s.Admissions(0) {
		got = append(got, fmt.Sprintf("%s in=%d out=%d back=%d", a.Outcome, a.InputTokens, a.OutputTokens, a.OutputReturned))
	}
	want := []string{"admitted in=10 out=8000 back=4000", "admitted in=10 out=4000 back=2000",
		"rate_limited in=10 out=2001 back=0", "admitted in=10 out=2000 back=1000"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("admissions\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A cache breakpoint writes the prompt up to it to the cache, at 1.25 times
// the input price (2 times for the hour) and against ITPM; the next call
// reads it at a tenth of the price and free of ITPM, until it expires.
// Bills are exact to the micro-dollar.
func TestMessagesCache(t *testing.T) {
	t.Parallel()
	c := newClock()
	price := money.Price{InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000} // $3 and $15
	s := sim.New(sim.Config{Now: c.Now, CompletionMin: 0.5, CompletionMax: 0.5, CacheMinTokens: 100,
		Models: map[string]sim.Model{"claude": {Limits: sim.Limits{ITPM: 1000, OTPM: 8000}, Price: price}}})

	// The whole prompt a breakpoint: 1,000 written, ITPM emptied.
	all := `{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":[{"type":"text","text":"` + words(1000) + `","cache_control":{"type":"ephemeral"}}]}]}`
	w := send(s, all)
	if u := decode[messageBody](t, w).Usage; w.Code != 200 || u.CacheCreationInputTokens != 1000 || u.CacheCreation.Ephemeral5m != 1000 || u.InputTokens != 0 {
		t.Fatalf("write: %d %+v", w.Code, u)
	}
	if got := w.Header().Get("anthropic-ratelimit-input-tokens-remaining"); got != "0" {
		t.Errorf("ITPM remaining %q after a 1,000-token write, want 0", got)
	}
	// At the same instant, all of it a read: ITPM, empty, is not asked.
	w = send(s, all)
	if u := decode[messageBody](t, w).Usage; w.Code != 200 || u.CacheReadInputTokens != 1000 || u.CacheCreationInputTokens != 0 || u.InputTokens != 0 {
		t.Fatalf("read: %d %+v", w.Code, u)
	}
	// Anything uncached now waits for ITPM.
	if w := send(s, ask("claude", 1, 1)); w.Code != 429 {
		t.Fatalf("one uncached token with ITPM empty: %d, want 429", w.Code)
	}

	// A prefix of 600 for the hour and 200 after it: once written, read.
	c.Add(time.Minute) // ITPM full again
	w = send(s, cached(600, "1h", 200, 100))
	if u := decode[messageBody](t, w).Usage; u.CacheCreation.Ephemeral1h != 600 || u.InputTokens != 200 || u.OutputTokens != 50 {
		t.Fatalf("hour write: %d %+v %s", w.Code, u, w.Body)
	}
	c.Add(30 * time.Minute) // the hour's entry lives, the five minutes' not
	w = send(s, cached(600, "1h", 200, 100))
	if u := decode[messageBody](t, w).Usage; u.CacheReadInputTokens != 600 || u.InputTokens != 200 {
		t.Fatalf("hour read: %d %+v", w.Code, u)
	}
	c.Add(time.Minute)
	w = send(s, all)
	if u := decode[messageBody](t, w).Usage; u.CacheCreationInputTokens != 1000 {
		t.Fatalf("the 5-minute entry after 32 minutes: %+v, want written again", u)
	}
	// A prefix below CacheMinTokens is not cached.
	c.Add(time.Minute)
	w = send(s, cached(99, "", 1, 100))
	if u := decode[messageBody](t, w).Usage; u.CacheCreationInputTokens != 0 || u.InputTokens != 100 {
		t.Fatalf("short prefix: %+v", u)
	}

	var got []string
	for _, b := range s.Bills() {
		got = append(got, fmt.Sprintf("in=%d read=%d w5=%d w1h=%d out=%d cost=%s", b.InputTokens, b.CachedTokens,
			b.CacheWrite5mTokens, b.CacheWrite1hTokens, b.OutputTokens, b.Cost))
	}
	want := []string{
		"in=0 read=0 w5=1000 w1h=0 out=50 cost=0.004500",  // 1000×3.75 + 50×15
		"in=0 read=1000 w5=0 w1h=0 out=50 cost=0.001050",  // 1000×0.3 + 750
		"in=200 read=0 w5=0 w1h=600 out=50 cost=0.004950", // 200×3 + 600×6 + 750
		"in=200 read=600 w5=0 w1h=0 out=50 cost=0.001530", // 600 + 600×0.3 + 750
		"in=0 read=0 w5=1000 w1h=0 out=50 cost=0.004500",
		"in=100 read=0 w5=0 w1h=0 out=50 cost=0.001050", // 300 + 750
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("bills\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A read for 1,000 tokens and 1 output token: 300 + 15.
	c.Add(time.Minute)
	send(s, `{"model":"claude","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"`+words(1000)+`","cache_control":{"type":"ephemeral"}}]}]}`)
	if b := s.Bills(); b[len(b)-1].CachedTokens != 1000 || b[len(b)-1].Cost != 300+15 {
		t.Errorf("last bill %+v, want 1,000 read (300) and 1 out (15)", b[len(b)-1])
	}
}

// A 529 overloaded_error is the platform's, not the account's: a share of
// calls drawn from the seed, answered in Anthropic's shape, consuming none
// of the limits.
func TestMessagesOverloaded(t *testing.T) {
	t.Parallel()
	run := func() (codes string, s *sim.Server) {
		c := newClock()
		s = sim.New(sim.Config{Models: map[string]sim.Model{"claude": {Limits: sim.Limits{RPM: 1000, ITPM: 1_000_000, OTPM: 100_000}}},
			Now: c.Now, Seed: 7, Faults: sim.Faults{Rate529: 0.3}})
		var b strings.Builder
		for range 40 {
			w := send(s, ask("claude", 10, 100))
			fmt.Fprintf(&b, "%d ", w.Code)
			if w.Code == 529 {
				want := `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"` + w.Header().Get("request-id") + "\"}\n"
				if w.Body.String() != want {
					t.Errorf("529 body %s, want %s", w.Body, want)
				}
			}
		}
		return b.String(), s
	}
	codes, s := run()
	again, _ := run()
	if codes != again {
		t.Errorf("one seed, two runs:\n%s\n%s", codes, again)
	}
	st := s.Stats()
	if st.Overloaded == 0 || st.Overloaded+st.Admitted != 40 || strings.Count(codes, "529") != int(st.Overloaded) {
		t.Fatalf("stats %+v for %s", st, codes)
	}
	// Only the admitted calls are in the buckets.
	if err := s.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	h := send(s, ask("claude", 10, 100)).Header()
	if got, want := h.Get("anthropic-ratelimit-requests-remaining"), fmt.Sprint(1000-st.Admitted-1); got != want {
		t.Errorf("requests remaining %s, want %s", got, want)
	}
	c := newClock()
	s = sim.New(sim.Config{Models: claude, Now: c.Now, Faults: sim.Faults{Rate529: 1}})
	w := send(s, ask("claude", 1000, 1000))
	if w.Code != 529 || w.Header().Get("anthropic-ratelimit-requests-remaining") != "50" ||
		w.Header().Get("anthropic-ratelimit-input-tokens-remaining") != "40000" || w.Header().Get("anthropic-ratelimit-output-tokens-remaining") != "8000" {
		t.Errorf("529: %d %v, want every bucket full", w.Code, w.Header())
	}
	if a := s.Admissions(0); len(a) != 1 || a[0].Outcome != sim.Overloaded {
		t.Errorf("admissions %+v", a)
	}
}

// Anthropic's acceleration limit: a sharp ramp meets 429s although far
// under the per-minute limits.
func TestMessagesAcceleration(t *testing.T) {
	t.Parallel()
	c := newClock()
	// ITPM + OTPM = 120,000 a minute: 20,000 in 10 s, a floor of 5,000
	s := sim.New(sim.Config{Now: c.Now, CompletionMin: 1, CompletionMax: 1, Ramp: sim.Ramp{Growth: 2, Floor: 0.25},
		Models: map[string]sim.Model{"claude": {Limits: sim.Limits{ITPM: 60_000, OTPM: 60_000}}}})
	if w := send(s, ask("claude", 3000, 1000)); w.Code != 200 {
		t.Fatalf("first 4,000: %d %s", w.Code, w.Body)
	}
	w := send(s, ask("claude", 1000, 1000))
	if w.Code != 429 || w.Header().Get("retry-after") != "10" || !strings.Contains(w.Body.String(), "ramp up your traffic gradually") {
		t.Fatalf("2,000 more in the window: %d %v %s, want the acceleration limit's 429", w.Code, w.Header(), w.Body)
	}
	if got := w.Header().Get("anthropic-ratelimit-input-tokens-remaining"); got != "57000" {
		t.Errorf("ITPM remaining %s: the minute's buckets had room", got)
	}
	c.Add(10 * time.Second) // the window after one of 4,000 takes 8,000
	if w := send(s, ask("claude", 4000, 4000)); w.Code != 200 {
		t.Fatalf("8,000 in the next window: %d %s", w.Code, w.Body)
	}
	if st := s.Stats(); st.RateLimitedShort != 1 {
		t.Errorf("stats %+v", st)
	}
}

// The event sequence of a stream, byte for byte, as Anthropic documents it;
// a stream that fails midway ends with an error event.
func TestMessagesStream(t *testing.T) {
	t.Parallel()
	cfg := sim.Config{Models: claude, CompletionMin: 1, CompletionMax: 1, Seed: 3}
	c := newClock()
	cfg.Now = c.Now
	whole := decode[messageBody](t, send(sim.New(cfg), ask("claude", 10, 3)))
	parts := strings.SplitAfter(whole.Content[0].Text, " ")
	if len(parts) != 3 {
		t.Fatalf("text %q, want 3 words", whole.Content[0].Text)
	}
	s := sim.New(cfg)
	w := send(s, `{"model":"claude","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"`+words(10)+`"}]}`)
	usageJSON := func(out int) string {
		return fmt.Sprintf(`{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":%d,"service_tier":"standard"}`, out)
	}
	var want strings.Builder
	event := func(name, data string) { want.WriteString("event: " + name + "\ndata: " + data + "\n\n") }
	event("message_start", `{"type":"message_start","message":{"id":"`+whole.ID+`","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":`+usageJSON(1)+`}}`)
	event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	event("ping", `{"type":"ping"}`)
	for _, p := range parts {
		event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+p+`"}}`)
	}
	event("content_block_stop", `{"type":"content_block_stop","index":0}`)
	event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":`+usageJSON(3)+`}`)
	event("message_stop", `{"type":"message_stop"}`)
	if w.Code != 200 || w.Header().Get("content-type") != "text/event-stream" || w.Body.String() != want.String() {
		t.Errorf("stream %d %v\n%s\nwant\n%s", w.Code, w.Header(), w.Body, want.String())
	}
	if b := s.Bills(); len(b) != 1 || !b[0].Stream || b[0].OutputTokens != 3 {
		t.Errorf("bills %+v", b)
	}

	cfg.Faults.StreamError = 1
	w = send(sim.New(cfg), `{"model":"claude","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"`+words(10)+`"}]}`)
	got := w.Body.String()
	if !strings.HasSuffix(got, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""+parts[0]+"\"}}\n\n"+
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n") ||
		strings.Contains(got, "message_stop") {
		t.Errorf("failed stream:\n%s", got)
	}
}

// Anthropic's required headers and fields, refused in its shape.
func TestMessagesRefusals(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Models: claude, OnlyKnownModels: true})
	for _, tc := range []struct {
		name, key, version, body string
		status                   int
		typ, message             string
	}{
		{"no key", "", "2023-06-01", ask("claude", 1, 1), 401, "authentication_error", "x-api-key header is required"},
		{"no version", "k", "", ask("claude", 1, 1), 400, "invalid_request_error", "anthropic-version: header is required"},
		{"no max_tokens", "k", "2023-06-01", `{"model":"claude","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens: Field required"},
		{"no model", "k", "2023-06-01", `{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "model: Field required"},
		{"bad role", "k", "2023-06-01", `{"model":"claude","max_tokens":1,"messages":[{"role":"system","content":"hi"}]}`, 400, "invalid_request_error", "messages.0.role: Input should be 'user' or 'assistant'"},
		{"unknown model", "k", "2023-06-01", ask("gpt-4o", 1, 1), 404, "not_found_error", "model: gpt-4o"},
		{"stream not a boolean", "k", "2023-06-01", `{"model":"claude","max_tokens":1,"stream":"yes","messages":[]}`, 400, "invalid_request_error", "stream: Input should be a valid boolean"},
	} {
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(tc.body))
		if tc.key != "" {
			req.Header.Set("x-api-key", tc.key)
		}
		if tc.version != "" {
			req.Header.Set("anthropic-version", tc.version)
		}
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != tc.status || e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message != tc.message {
			t.Errorf("%s: %d %s, want %d %s %q", tc.name, w.Code, w.Body, tc.status, tc.typ, tc.message)
		}
	}

	// With a key configured, it must be x-api-key's.
	keyed := sim.New(sim.Config{APIKey: "sk-ant-test"})
	for _, tc := range []struct {
		header, value string
		status        int
	}{{"x-api-key", "sk-ant-test", 200}, {"x-api-key", "wrong", 401}, {"Authorization", "Bearer sk-ant-test", 401}} {
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(ask("claude", 1, 1)))
		req.Header.Set(tc.header, tc.value)
		req.Header.Set("anthropic-version", "2023-06-01")
		w := httptest.NewRecorder()
		keyed.Handler().ServeHTTP(w, req)
		if w.Code != tc.status || tc.status == 401 && !strings.Contains(w.Body.String(), `"authentication_error"`) {
			t.Errorf("%s %q: %d %s, want %d", tc.header, tc.value, w.Code, w.Body, tc.status)
		}
	}
}
