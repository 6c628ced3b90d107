package llm_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/llmq/llmq/internal/llm"
)

// The cookbook's example conversation ("How to count tokens with tiktoken"),
// whose prompt_tokens the OpenAI API reported as 129 for gpt-3.5-turbo and
// gpt-4 and 124 for gpt-4o and gpt-4o-mini.
const cookbookMessages = `[
 {"role":"system","content":"You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
 {"role":"system","name":"example_user","content":"New synergies will help drive top-line growth."},
 {"role":"system","name":"example_assistant","content":"Things working well together will increase revenue."},
 {"role":"system","name":"example_user","content":"Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
 {"role":"system","name":"example_assistant","content":"Let's talk later when we're less busy about how to do better."},
 {"role":"user","content":"This late pivot means we don't have time to boil the ocean for the client deliverable."}]`

// The cookbook's tool example, reported as 105 (gpt-3.5-turbo, gpt-4) and 101
// (gpt-4o, gpt-4o-mini) prompt tokens.
const cookbookTools = `[{"type":"function","function":{"name":"get_current_weather","description":"Get the current weather in a given location","parameters":{"type":"object","properties":{
 "location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
 "unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]}},"required":["location"]}}}]`

const cookbookToolMessages = `[{"role":"system","content":"You are a helpful assistant that can answer to questions about the weather."},
 {"role":"user","content":"What's the weather like in San Francisco?"}]`

func TestEstimatorMatchesCookbook(t *testing.T) {
	t.Parallel()
	e := llm.NewEstimator()
	cases := []struct {
		model string
		body  string
		want  int64
	}{
		{"gpt-3.5-turbo", `{"model":"gpt-3.5-turbo","messages":` + cookbookMessages + `}`, 129},
		{"gpt-4-0613", `{"model":"gpt-4-0613","messages":` + cookbookMessages + `}`, 129},
		{"gpt-4o", `{"model":"gpt-4o","messages":` + cookbookMessages + `}`, 124},
		{"gpt-4o-mini", `{"model":"gpt-4o-mini","messages":` + cookbookMessages + `}`, 124},
		{"gpt-4 tools", `{"model":"gpt-4","messages":` + cookbookToolMessages + `,"tools":` + cookbookTools + `}`, 105},
		{"gpt-4o tools", `{"model":"gpt-4o","messages":` + cookbookToolMessages + `,"tools":` + cookbookTools + `}`, 101},
		{"gpt-4o legacy functions", `{"model":"gpt-4o","messages":` + cookbookToolMessages + `,"functions":[` +
			`{"name":"get_current_weather","description":"Get the current weather in a given location","parameters":{"type":"object","properties":{` +
			`"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},` +
			`"unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]}}}}]}`, 101},
	}
	for _, c := range cases {
		got, err := e.PromptTokens(llm.EndpointChat, "", "", []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s: %d tokens, want %d", c.model, got, c.want)
		}
	}
}

func TestEstimatorRules(t *testing.T) {
	t.Parallel()
	e := llm.NewEstimator()
	count := func(endpoint, model, encoding, body string) *llm.ParsedRequest {
		t.Helper()
		p, err := e.Parse(endpoint, model, encoding, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// "hello world" is 2 tokens in both encodings; a message adds 3 + role
	// (1), the reply 3.
	p := count(llm.EndpointChat, "", "", `{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}`)
	if p.ContentTokens != 2 || p.PromptTokens != 2+3+1+3 || p.Encoding != "o200k_base" || !p.KnownModel {
		t.Errorf("simple chat: %+v", *p)
	}
	// Text parts are counted like string content; images by allowance.
	p = count(llm.EndpointChat, "", "", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"hello world"},
		{"type":"image_url","image_url":{"url":"u","detail":"low"}},{"type":"image_url","image_url":{"url":"u"}}]}]}`)
	if want := int64(2 + llm.ImageTokensLow + llm.ImageTokens); p.ContentTokens != want {
		t.Errorf("parts: content %d, want %d", p.ContentTokens, want)
	}
	// gpt-4o-mini bills images much higher.
	p2 := count(llm.EndpointChat, "gpt-4o-mini", "", `{"model":"x","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`)
	if p2.ContentTokens <= llm.ImageTokens {
		t.Errorf("gpt-4o-mini image allowance %d, want above %d", p2.ContentTokens, llm.ImageTokens)
	}
	// Embeddings: the tokens of the inputs, token ids counted one each.
	p = count(llm.EndpointEmbeddings, "", "", `{"model":"text-embedding-3-small","input":["hello world","hello world"]}`)
	if p.PromptTokens != 4 || p.ContentTokens != 4 || p.Encoding != "cl100k_base" {
		t.Errorf("embeddings: %+v", *p)
	}
	p = count(llm.EndpointEmbeddings, "", "", `{"model":"text-embedding-3-small","input":[[1,2,3],[4]]}`)
	if p.PromptTokens != 4 {
		t.Errorf("token ids: %+v", *p)
	}
	// Unknown models: fallback encoding plus the margin.
	known := count(llm.EndpointChat, "", "", `{"model":"gpt-4o","messages":[{"role":"user","content":"hello world, how are you today?"}]}`)
	unknown := count(llm.EndpointChat, "", "", `{"model":"llama-3-70b","messages":[{"role":"user","content":"hello world, how are you today?"}]}`)
	if unknown.KnownModel || unknown.Encoding != llm.FallbackEncoding {
		t.Errorf("unknown model: %+v", *unknown)
	}
	if want := known.PromptTokens + (known.PromptTokens*llm.UnknownModelMarginPercent+99)/100; unknown.PromptTokens != want {
		t.Errorf("unknown model estimate %d, want %d", unknown.PromptTokens, want)
	}
	if unknown.ContentTokens != known.ContentTokens {
		t.Errorf("content of unknown model %d, want %d (no margin)", unknown.ContentTokens, known.ContentTokens)
	}
	// The model argument overrides body.model; an encoding overrides both.
	if p := count(llm.EndpointChat, "gpt-4", "", `{"model":"custom","messages":[{"role":"user","content":"x"}]}`); p.Encoding != "cl100k_base" || !p.KnownModel {
		t.Errorf("model override: %+v", *p)
	}
	if p := count(llm.EndpointChat, "", "cl100k_base", `{"model":"custom","messages":[{"role":"user","content":"x"}]}`); p.Encoding != "cl100k_base" || !p.KnownModel {
		t.Errorf("encoding override: %+v", *p)
	}
	if _, err := e.Parse(llm.EndpointChat, "", "nope_base", []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)); err == nil {
		t.Error("unknown encoding accepted")
	}
}

func TestEncodingForModel(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"gpt-4o": "o200k_base", "gpt-4o-mini-2024-07-18": "o200k_base", "chatgpt-4o-latest": "o200k_base",
		"gpt-4.1-nano": "o200k_base", "o1": "o200k_base", "o3-mini": "o200k_base", "o4-mini": "o200k_base",
		"gpt-5": "o200k_base", "ft:gpt-4o-mini:org::id": "o200k_base", "openai/gpt-4o": "o200k_base", "GPT-4O": "o200k_base",
		"gpt-4": "cl100k_base", "gpt-4-turbo": "cl100k_base", "gpt-3.5-turbo": "cl100k_base", "gpt-35-turbo": "cl100k_base",
		"text-embedding-3-large": "cl100k_base", "text-embedding-ada-002": "cl100k_base",
	}
	for model, want := range cases {
		if got, known := llm.EncodingForModel(model); got != want || !known {
			t.Errorf("EncodingForModel(%q) = %q, %v; want %q, true", model, got, known, want)
		}
	}
	if got, known := llm.EncodingForModel("mistral-large"); got != llm.FallbackEncoding || known {
		t.Errorf("unknown model: %q, %v", got, known)
	}
}

func TestEstimatorConcurrent(t *testing.T) {
	t.Parallel()
	e := llm.NewEstimator()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				model := []string{"gpt-4o", "gpt-4", "unknown-model", "text-embedding-3-small"}[(g+i)%4]
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"request %d of worker %d"}]}`, model, i, g)
				p, err := e.Parse(llm.EndpointChat, "", "", []byte(body))
				if err != nil || p.ContentTokens < 5 {
					t.Errorf("%s: %v %+v", body, err, p)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkPromptTokens(b *testing.B) {
	e := llm.NewEstimator()
	long := strings.Repeat("The quick brown fox jumps over the lazy dog, and then considers the meaning of rate limits. ", 100)
	bodies := map[string]string{
		"chat-short":     `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Summarize the plot of Hamlet in one sentence."}],"max_tokens":100}`,
		"chat-cookbook":  `{"model":"gpt-4o","messages":` + cookbookMessages + `}`,
		"chat-2k-tokens": `{"model":"gpt-4o","messages":[{"role":"user","content":"` + long + `"}]}`,
		"embeddings-16":  `{"model":"text-embedding-3-small","input":[` + strings.TrimSuffix(strings.Repeat(`"a sentence to embed for search",`, 16), ",") + `]}`,
	}
	for _, name := range []string{"chat-short", "chat-cookbook", "chat-2k-tokens", "embeddings-16"} {
		body := []byte(bodies[name])
		endpoint := llm.EndpointChat
		if strings.HasPrefix(name, "embeddings") {
			endpoint = llm.EndpointEmbeddings
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := e.PromptTokens(endpoint, "", "", body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
