package llm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
)

const anthropicKey = "sk-ant-test-0123456789abcdef"

func newAnthropic(t *testing.T, baseURL string) llm.Provider {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return llm.NewAnthropic(llm.AnthropicConfig{Name: "anthropic", BaseURL: baseURL, APIKey: anthropicKey, Timeout: 5 * time.Second,
		HTTPClient: &http.Client{Transport: tr}})
}

// sonnet is priced as Claude Sonnet: $3 in, $15 out per 1M tokens.
var sonnet = money.Price{InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000}

func claudeSim(t *testing.T, faults sim.Faults) *sim.TestServer {
	return startSim(t, sim.Config{APIKey: anthropicKey, Seed: 3, CacheMinTokens: 100, Faults: faults,
		Models: map[string]sim.Model{"claude-sonnet-4-5": {Limits: sim.Limits{RPM: 50, ITPM: 400_000, OTPM: 80_000}, Price: sonnet}}})
}

func words(n int) string { return strings.TrimSpace(strings.Repeat("water ", n)) }

// cachedBody is a Messages API body whose system prompt of prefix tokens
// is cached for ttl, then a user turn of rest tokens.
func cachedBody(prefix int, ttl string, rest int) string {
	return fmt.Sprintf(`{"model":"claude","max_tokens":200,"system":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral","ttl":%q}}],`+
		`"messages":[{"role":"user","content":%q}]}`, words(prefix), ttl, words(rest))
}

// A whole call reaches the simulator with the key in x-api-key and an
// anthropic-version (it refuses a call without either), names the
// upstream, and its usage is read as llmq counts it: the whole prompt, of
// it the cache's reads and writes by lifetime; priced at the model's
// price it is what the provider billed, to the micro-dollar. Anthropic's
// request-id and rate-limit headers are read.
func TestAnthropicCallAgainstSimulator(t *testing.T) {
	t.Parallel()
	ts := claudeSim(t, sim.Faults{})
	p := newAnthropic(t, ts.URL)
	price := sonnet.Anthropic()
	for i, c := range []struct {
		body               string
		cached, w5, w1, in int64
	}{
		{cachedBody(1000, "1h", 300), 0, 0, 1000, 300},
		{cachedBody(1000, "1h", 300), 1000, 0, 0, 300},
		{cachedBody(2000, "5m", 10), 0, 2000, 0, 10},
	} {
		resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointMessages, Upstream: "claude-sonnet-4-5", Body: json.RawMessage(c.body)})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		bills := ts.Bills()
		b := bills[len(bills)-1]
		u := resp.Usage
		if b.Model != "claude-sonnet-4-5" || u.CachedTokens != c.cached || u.CacheWrite5mTokens != c.w5 || u.CacheWrite1hTokens != c.w1 ||
			u.PromptTokens != c.in+c.cached+c.w5+c.w1 || u.CompletionTokens != b.OutputTokens || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("call %d: usage %+v, bill %+v", i, u, b)
		}
		cost := price.Cost(money.Tokens{Prompt: u.PromptTokens, Cached: u.CachedTokens, CacheWrite5m: u.CacheWrite5mTokens,
			CacheWrite1h: u.CacheWrite1hTokens, Completion: u.CompletionTokens})
		if cost != b.Cost || cost == 0 {
			t.Errorf("call %d: charged %s, the provider billed %s", i, cost, b.Cost)
		}
		if resp.RequestID != b.RequestID || resp.RequestID == "" {
			t.Errorf("call %d: request id %q, want %q", i, resp.RequestID, b.RequestID)
		}
		rl := resp.RateLimit
		if !rl.Known(llm.HasLimitRequests) || rl.LimitRequests != 50 || rl.RemainingRequests != int64(49-i) || !rl.Known(llm.HasLimitTokens) {
			t.Errorf("call %d: rate limit %+v, want 50 requests, %d remaining, a token limit", i, rl, 49-i)
		}
	}
}

// A stream relays each event's data as Anthropic sent it, in order, from
// message_start to message_stop, and its usage (message_start's, with
// message_delta's output) is the bill's.
func TestAnthropicStream(t *testing.T) {
	t.Parallel()
	ts := claudeSim(t, sim.Faults{})
	p := newAnthropic(t, ts.URL)
	var types []string
	var relayed [][]byte
	resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointMessages, Upstream: "claude-sonnet-4-5",
		Body: json.RawMessage(cachedBody(500, "5m", 40)), Stream: func(data []byte) error {
			var ev struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal(data, &ev); err != nil {
				return err
			}
			types, relayed = append(types, ev.Type), append(relayed, append([]byte(nil), data...))
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(types) < 6 || types[0] != "message_start" || types[len(types)-1] != "message_stop" || types[len(types)-2] != "message_delta" ||
		resp.Chunks != len(types) {
		t.Fatalf("events %v, chunks %d", types, resp.Chunks)
	}
	b := ts.Bills()[0]
	if !b.Stream || resp.Usage.CacheWrite5mTokens != 500 || resp.Usage.PromptTokens != 540 || resp.Usage.CompletionTokens != b.OutputTokens {
		t.Errorf("usage %+v, bill %+v", resp.Usage, b)
	}
	if string(resp.Body) != string(relayed[len(relayed)-2]) {
		t.Errorf("body %s, want the message_delta event", resp.Body)
	}
}

// A 429 is rate limited with its retry-after; a 529 overloaded_error is
// retryable and Overloaded, never rate limited; a 500 is retryable and not
// overloaded.
func TestAnthropicErrors(t *testing.T) {
	t.Parallel()
	call := func(p llm.Provider) *llm.Error {
		_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointMessages, Upstream: "claude-sonnet-4-5",
			Body: json.RawMessage(`{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)})
		return asError(t, err)
	}
	e := call(newAnthropic(t, claudeSim(t, sim.Faults{Rate429: 1}).URL))
	if e.Class != llm.ClassRateLimited || e.StatusCode != 429 || e.Type != "rate_limit_error" || !e.RateLimit.Known(llm.HasRetryAfter) || e.Overloaded() {
		t.Errorf("429: %+v", e)
	}
	e = call(newAnthropic(t, claudeSim(t, sim.Faults{Rate529: 1}).URL))
	if e.Class != llm.ClassRetryable || e.StatusCode != 529 || e.Type != "overloaded_error" || !e.Overloaded() || e.Message != "Overloaded" {
		t.Errorf("529: %+v", e)
	}
	e = call(newAnthropic(t, claudeSim(t, sim.Faults{Rate500: 1}).URL))
	if e.Class != llm.ClassRetryable || e.StatusCode != 500 || e.Overloaded() {
		t.Errorf("500: %+v", e)
	}
	// The wrong key: the simulator's 401, permanent.
	bad := llm.NewAnthropic(llm.AnthropicConfig{BaseURL: claudeSim(t, sim.Faults{}).URL, APIKey: "sk-ant-wrong-key-000000"})
	if e := call(bad); e.Class != llm.ClassPermanent || e.StatusCode != 401 {
		t.Errorf("401: %+v", e)
	}
}

// What a provider answers is checked and bounded: an error's message is
// cut to 1000 bytes and scrubbed of the key, a prompt too long is a
// context-length error, a 2xx that is not a message is refused, and what
// is sent carries exactly Anthropic's headers. An OpenAI endpoint is
// refused before anything is sent.
func TestAnthropicAnswersChecked(t *testing.T) {
	t.Parallel()
	var answer func(w http.ResponseWriter)
	var got http.Header
	var sent []byte
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		sent = make([]byte, r.ContentLength)
		_, _ = r.Body.Read(sent)
		answer(w)
	}))
	t.Cleanup(hs.Close)
	p := newAnthropic(t, hs.URL)
	req := llm.Request{Endpoint: llm.EndpointMessages, Upstream: "claude-up", Body: json.RawMessage(`{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)}

	answer = func(w http.ResponseWriter) {
		w.WriteHeader(400)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad key %s %s"}}`, anthropicKey, strings.Repeat("x", 5000))
	}
	_, err := p.Call(context.Background(), req)
	e := asError(t, err)
	if e.Class != llm.ClassPermanent || e.Type != "invalid_request_error" || len(e.Message) > 1010 || strings.Contains(e.Message, anthropicKey) {
		t.Errorf("400: %+v", e)
	}
	if got.Get("x-api-key") != anthropicKey || got.Get("anthropic-version") != "2023-06-01" || got.Get("Authorization") != "" {
		t.Errorf("headers %v", got)
	}
	if !strings.Contains(string(sent), `"model":"claude-up"`) {
		t.Errorf("sent %s, want the upstream's id", sent)
	}

	answer = func(w http.ResponseWriter) {
		w.WriteHeader(400)
		fmt.Fprint(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 250000 tokens > 200000 maximum"}}`)
	}
	_, err = p.Call(context.Background(), req)
	if e := asError(t, err); e.Code != client.CodeContextLengthExceeded {
		t.Errorf("too long: %+v", e)
	}

	answer = func(w http.ResponseWriter) { fmt.Fprint(w, `{"type":"completion","usage":{"input_tokens":3}}`) }
	_, err = p.Call(context.Background(), req)
	if e := asError(t, err); e.Class != llm.ClassPermanent || e.Code != client.CodeProviderResponseInvalid {
		t.Errorf("not a message: %+v", e)
	}

	answer = func(w http.ResponseWriter) {
		fmt.Fprint(w, `{"type":"message","usage":{"input_tokens":3,"cache_creation_input_tokens":10,"cache_read_input_tokens":4,"output_tokens":2}}`)
	}
	resp, err := p.Call(context.Background(), req)
	if err != nil || !reflect.DeepEqual(resp.Usage, llm.Usage{PromptTokens: 17, CachedTokens: 4, CacheWrite5mTokens: 10, CompletionTokens: 2, TotalTokens: 19}) {
		t.Errorf("usage without cache_creation: %+v %v, want its writes at five minutes", resp, err)
	}

	answer = func(w http.ResponseWriter) { t.Error("an OpenAI request was sent") }
	_, err = p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"claude","messages":[]}`)})
	if e := asError(t, err); e.Class != llm.ClassPermanent || e.StatusCode != 0 {
		t.Errorf("chat: %+v", e)
	}
}
