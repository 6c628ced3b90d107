package llm_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

const streamChat = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}],"max_tokens":40}`

// A streamed call relays every chunk as it comes and returns the usage of
// the chunk include_usage adds, which llmq asks for whatever the client did.
func TestStreamRelaysChunksAndUsage(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{APIKey: testKey, Limits: sim.Limits{RPM: 100, TPM: 100000}})
	p := newProvider(t, ts.BaseURL, 5*time.Second)
	var chunks []string
	resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Upstream: "up-model", Body: []byte(streamChat),
		Stream: func(d []byte) error { chunks = append(chunks, string(d)); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Chunks != len(chunks) || len(chunks) < 4 || resp.Usage.TotalTokens == 0 || resp.Usage.CompletionTokens == 0 {
		t.Fatalf("%d chunks, response %+v", len(chunks), resp)
	}
	if !llm.StripUsageChunk([]byte(chunks[len(chunks)-1])) || llm.StripUsageChunk([]byte(chunks[0])) {
		t.Fatalf("usage chunk not last: %q", chunks)
	}
	var c struct{ Model string }
	if err := json.Unmarshal([]byte(chunks[0]), &c); err != nil || c.Model != "up-model" {
		t.Fatalf("first chunk %q: the upstream model was not sent", chunks[0])
	}
	if string(resp.Body) != chunks[len(chunks)-1] || resp.RateLimit.RemainingTokens < 0 {
		t.Fatalf("body %s", resp.Body)
	}
	if st := ts.Stats(); st.CompletionTokens != resp.Usage.CompletionTokens {
		t.Fatalf("simulator counted %d completion tokens, usage says %d", st.CompletionTokens, resp.Usage.CompletionTokens)
	}
}

// Refusals before the first chunk are errors of their class with the
// provider's fields; a stream cut after chunks says how many it relayed.
func TestStreamErrors(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{APIKey: testKey, Limits: sim.Limits{RPM: 1, TPM: 100000}})
	p := newProvider(t, ts.BaseURL, 5*time.Second)
	call := func(p llm.Provider, body string) error {
		_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Body: []byte(body), Stream: func([]byte) error { return nil }})
		return err
	}
	if err := call(p, streamChat); err != nil {
		t.Fatal(err)
	}
	e := asError(t, call(p, streamChat))
	if e.Class != llm.ClassRateLimited || e.StatusCode != 429 || e.Relayed != 0 || e.Code != client.CodeRateLimitExceeded {
		t.Fatalf("429: %+v", e)
	}
	if d, ok := e.RateLimit.Delay(); !ok || d <= 0 {
		t.Fatalf("429 without its delay: %+v", e.RateLimit)
	}
	_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointEmbeddings, Body: []byte(`{"model":"e","input":"x"}`),
		Stream: func([]byte) error { return nil }})
	if e := asError(t, err); e.Class != llm.ClassPermanent || e.Param != "stream" {
		t.Fatalf("embeddings stream: %+v", e)
	}

	// A server that sends two chunks and drops the connection.
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(cut.Close)
	e = asError(t, call(newProvider(t, cut.URL+"/v1", 5*time.Second), streamChat))
	if e.Class != llm.ClassRetryable || e.Relayed != 2 || e.Code != client.CodeProviderStreamFailed ||
		!strings.Contains(e.Message, "ended before [DONE]") && !strings.Contains(e.Message, "could not be reached") {
		t.Fatalf("cut stream: %+v", e)
	}

	// A provider's server error midway: an error chunk (its code null)
	// after the role and one content chunk, then the end.
	failing := startSim(t, sim.Config{APIKey: testKey, Faults: sim.Faults{StreamError: 1}})
	e = asError(t, call(newProvider(t, failing.BaseURL, 5*time.Second), streamChat))
	if e.Class != llm.ClassRetryable || e.Relayed != 2 || e.StatusCode != 200 || e.Code != client.CodeProviderStreamFailed || e.Type != "server_error" ||
		!strings.Contains(e.Message, "The server had an error") {
		t.Fatalf("stream failing midway: %+v", e)
	}
}
