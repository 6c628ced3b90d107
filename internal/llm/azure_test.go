package llm_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// azureCall is what an Azure provider sent.
type azureCall struct {
	url, apiKey, auth string
	model             string
}

// newAzure returns an Azure provider of the resource at baseURL.
func newAzure(t *testing.T, baseURL, apiVersion string) llm.Provider {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return llm.NewOpenAI(llm.OpenAIConfig{Name: "azure-east", BaseURL: baseURL, APIKey: testKey, Azure: true, APIVersion: apiVersion,
		Timeout: 5 * time.Second, HTTPClient: &http.Client{Transport: tr}})
}

// An Azure provider sends the key in the api-key header, never as a bearer
// token, and calls the deployment's path with the api-version, or with
// none the v1 API's paths, the deployment as the body's model; streams
// included.
func TestAzureURLsAndKey(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var calls []azureCall
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		mu.Lock()
		calls = append(calls, azureCall{url: r.URL.RequestURI(), apiKey: r.Header.Get("api-key"), auth: r.Header.Get("Authorization"), model: body.Model})
		mu.Unlock()
		switch {
		case r.Header.Get("Accept") == "text/event-stream":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: "+okChunk+"\n\ndata: [DONE]\n\n")
		case strings.HasSuffix(r.URL.Path, "/embeddings"):
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"m","usage":{"prompt_tokens":2,"total_tokens":2}}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, okChat)
		}
	}))
	t.Cleanup(hs.Close)
	chat := json.RawMessage(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	embed := json.RawMessage(`{"model":"emb","input":"hi"}`)
	for _, tc := range []struct {
		version                  string
		chatURL, embedURL, model string
	}{
		{"2024-10-21", "/openai/deployments/my-gpt4o/chat/completions?api-version=2024-10-21",
			"/openai/deployments/my-gpt4o/embeddings?api-version=2024-10-21", "my-gpt4o"},
		{"", "/openai/v1/chat/completions", "/openai/v1/embeddings", "my-gpt4o"},
	} {
		calls = nil
		p := newAzure(t, hs.URL+"/", tc.version)
		ctx := context.Background()
		if _, err := p.Call(ctx, llm.Request{Endpoint: llm.EndpointChat, Upstream: "my-gpt4o", Body: chat}); err != nil {
			t.Fatalf("api-version %q: chat: %v", tc.version, err)
		}
		if _, err := p.Call(ctx, llm.Request{Endpoint: llm.EndpointEmbeddings, Upstream: "my-gpt4o", Body: embed}); err != nil {
			t.Fatalf("api-version %q: embeddings: %v", tc.version, err)
		}
		if _, err := p.Call(ctx, llm.Request{Endpoint: llm.EndpointChat, Upstream: "my-gpt4o", Body: chat,
			Stream: func([]byte) error { return nil }}); err != nil {
			t.Fatalf("api-version %q: stream: %v", tc.version, err)
		}
		want := []string{tc.chatURL, tc.embedURL, tc.chatURL}
		if len(calls) != len(want) {
			t.Fatalf("api-version %q: %d calls, want %d", tc.version, len(calls), len(want))
		}
		for i, c := range calls {
			if c.url != want[i] || c.apiKey != testKey || c.auth != "" || c.model != tc.model {
				t.Errorf("api-version %q: call %d = %+v; want %s with the key in api-key only, model %s", tc.version, i, c, want[i], tc.model)
			}
		}
	}
}

// okChunk is one streamed chat completion chunk, with usage.
const okChunk = `{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`

// The simulator answers an Azure provider on both kinds of path, with
// Azure's rate-limit headers, and refuses a wrong key.
func TestAzureAgainstSimulator(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{APIKey: testKey, Limits: sim.Limits{RPM: 100, TPM: 100000}, RateHeaders: sim.HeadersAzure})
	body := json.RawMessage(`{"model":"ignored","messages":[{"role":"user","content":"Say hello."}],"max_tokens":20}`)
	base := ts.BaseURL[:len(ts.BaseURL)-len("/v1")]
	for _, version := range []string{"2024-10-21", ""} {
		p := newAzure(t, base, version)
		resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Upstream: "my-gpt4o", Body: body})
		if err != nil {
			t.Fatalf("api-version %q: %v", version, err)
		}
		if resp.Usage.PromptTokens == 0 || resp.RateLimit.RemainingTokens <= 0 || resp.RateLimit.LimitTokens != 0 {
			t.Errorf("api-version %q: usage %+v, rate limit %+v (Azure sends remaining counts only)", version, resp.Usage, resp.RateLimit)
		}
	}
	adm := ts.Admissions(0)
	if len(adm) != 2 || adm[0].Model != "my-gpt4o" || adm[1].Model != "my-gpt4o" {
		t.Errorf("admissions %+v, want two of deployment my-gpt4o", adm)
	}
	// A deployment's path without an api-version is not found, as on Azure.
	req, _ := http.NewRequest(http.MethodPost, base+"/openai/deployments/my-gpt4o/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("api-key", testKey)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("no api-version: %v, %v; want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	wrong := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: base, APIKey: "sk-wrong", Azure: true, APIVersion: "2024-10-21",
		HTTPClient: &http.Client{Transport: tr}})
	_, err := wrong.Call(context.Background(), llm.Request{Endpoint: llm.EndpointChat, Upstream: "my-gpt4o", Body: body})
	if e := asError(t, err); e.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong key: status %d, want 401", e.StatusCode)
	}
}
