package llm_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/wire"
)

func TestParseRequestRejects(t *testing.T) {
	t.Parallel()
	const chat, emb = llm.EndpointChat, llm.EndpointEmbeddings
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, endpoint, body, param string
	}{
		{"unknown endpoint", "/v1/completions", `{"model":"m"}`, "endpoint"},
		{"not json", chat, `{"model":`, "body"},
		{"not an object", chat, `["model"]`, "body"},
		{"empty", chat, ``, "body"},
		{"model missing", chat, `{` + msgs + `}`, "model"},
		{"model null", chat, `{"model":null,` + msgs + `}`, "model"},
		{"model number", chat, `{"model":4,` + msgs + `}`, "model"},
		{"model empty", chat, `{"model":"",` + msgs + `}`, "model"},
		{"messages missing", chat, `{"model":"gpt-4o"}`, "messages"},
		{"messages empty", chat, `{"model":"gpt-4o","messages":[]}`, "messages"},
		{"messages object", chat, `{"model":"gpt-4o","messages":{"role":"user"}}`, "messages"},
		{"message not object", chat, `{"model":"gpt-4o","messages":["hi"]}`, "messages[0]"},
		{"role missing", chat, `{"model":"gpt-4o","messages":[{"content":"hi"}]}`, "messages[0].role"},
		{"role unknown", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":"a"},{"role":"robot","content":"hi"}]}`, "messages[1].role"},
		{"content missing", chat, `{"model":"gpt-4o","messages":[{"role":"user"}]}`, "messages[0].content"},
		{"content number", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{"content empty parts", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[]}]}`, "messages[0].content"},
		{"part without type", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type"},
		{"text part without text", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, "messages[0].content[0].text"},
		{"image part without url", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}}]}]}`, "messages[0].content[1].image_url"},
		{"name not string", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":"a","name":3}]}`, "messages[0].name"},
		{"max_tokens zero", chat, `{"model":"gpt-4o",` + msgs + `,"max_tokens":0}`, "max_tokens"},
		{"max_tokens negative", chat, `{"model":"gpt-4o",` + msgs + `,"max_tokens":-5}`, "max_tokens"},
		{"max_tokens fraction", chat, `{"model":"gpt-4o",` + msgs + `,"max_tokens":1.5}`, "max_tokens"},
		{"max_tokens string", chat, `{"model":"gpt-4o",` + msgs + `,"max_tokens":"100"}`, "max_tokens"},
		{"max_tokens huge", chat, `{"model":"gpt-4o",` + msgs + `,"max_tokens":1e12}`, "max_tokens"},
		{"max_completion_tokens zero", chat, `{"model":"gpt-4o",` + msgs + `,"max_completion_tokens":0}`, "max_completion_tokens"},
		{"n zero", chat, `{"model":"gpt-4o",` + msgs + `,"n":0}`, "n"},
		{"n too many", chat, `{"model":"gpt-4o",` + msgs + `,"n":129}`, "n"},
		{"stream", chat, `{"model":"gpt-4o",` + msgs + `,"stream":true}`, "stream"},
		{"stream not bool", chat, `{"model":"gpt-4o",` + msgs + `,"stream":"yes"}`, "stream"},
		{"embeddings stream", emb, `{"model":"text-embedding-3-small","input":"a","stream":true}`, "stream"},
		{"input missing", emb, `{"model":"text-embedding-3-small"}`, "input"},
		{"input empty string", emb, `{"model":"text-embedding-3-small","input":""}`, "input"},
		{"input empty array", emb, `{"model":"text-embedding-3-small","input":[]}`, "input"},
		{"input object", emb, `{"model":"text-embedding-3-small","input":{"a":1}}`, "input"},
		{"input mixed", emb, `{"model":"text-embedding-3-small","input":["a",1]}`, "input"},
		{"input empty item", emb, `{"model":"text-embedding-3-small","input":["a",""]}`, "input[1]"},
		{"input negative token", emb, `{"model":"text-embedding-3-small","input":[1,-2]}`, "input[1]"},
		{"input empty token list", emb, `{"model":"text-embedding-3-small","input":[[1],[]]}`, "input[1]"},
		{"input too many", emb, `{"model":"text-embedding-3-small","input":[` + strings.Repeat(`"a",`, 2048) + `"a"]}`, "input"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := llm.NewEstimator().Parse(c.endpoint, "", "", []byte(c.body))
			var ir *wire.Error
			if !errors.As(err, &ir) {
				t.Fatalf("err = %v, want *wire.Error", err)
			}
			if ir.Param != c.param {
				t.Errorf("Param = %q, want %q (message %q)", ir.Param, c.param, ir.Message)
			}
			if !strings.Contains(ir.Message, "'"+c.param+"'") {
				t.Errorf("Message %q does not name '%s'", ir.Message, c.param)
			}
		})
	}
}

func TestParseRequestAccepts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, endpoint, body string
		want                 llm.ParsedRequest // Model, MaxTokens, N, Inputs checked
	}{
		{"minimal chat", llm.EndpointChat, `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`,
			llm.ParsedRequest{Model: "gpt-4o-mini", N: 1}},
		{"max tokens and n", llm.EndpointChat, `{"model":"gpt-4o","messages":[{"role":"developer","content":"x"},{"role":"user","content":"hi"}],"max_tokens":100,"n":3,"stream":false}`,
			llm.ParsedRequest{Model: "gpt-4o", MaxTokens: 100, N: 3}},
		{"larger of both max tokens", llm.EndpointChat, `{"model":"o3","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"max_completion_tokens":250}`,
			llm.ParsedRequest{Model: "o3", MaxTokens: 250, N: 1}},
		{"integral float", llm.EndpointChat, `{"model":"o3","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1e3}`,
			llm.ParsedRequest{Model: "o3", MaxTokens: 1000, N: 1}},
		{"nulls are absent", llm.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":null,"n":null,"stream":null}`,
			llm.ParsedRequest{Model: "m", N: 1}},
		{"parts, tools and tool turns", llm.EndpointChat, `{"model":"gpt-4o","messages":[
			{"role":"system","content":[{"type":"text","text":"be brief"}]},
			{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]},
			{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
			{"role":"tool","tool_call_id":"c1","content":"42"},
			{"role":"function","name":"f","content":"42"}],
			"unknown_field":{"x":1}}`,
			llm.ParsedRequest{Model: "gpt-4o", N: 1}},
		{"embedding string", llm.EndpointEmbeddings, `{"model":"text-embedding-3-small","input":"hello"}`,
			llm.ParsedRequest{Model: "text-embedding-3-small", N: 1, Inputs: 1}},
		{"embedding strings", llm.EndpointEmbeddings, `{"model":"text-embedding-3-small","input":["a","b","c"]}`,
			llm.ParsedRequest{Model: "text-embedding-3-small", N: 1, Inputs: 3}},
		{"embedding tokens", llm.EndpointEmbeddings, `{"model":"text-embedding-3-small","input":[1,2,3]}`,
			llm.ParsedRequest{Model: "text-embedding-3-small", N: 1, Inputs: 1}},
		{"embedding token lists", llm.EndpointEmbeddings, `{"model":"text-embedding-3-small","input":[[1,2],[3]]}`,
			llm.ParsedRequest{Model: "text-embedding-3-small", N: 1, Inputs: 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, err := llm.NewEstimator().Parse(c.endpoint, "", "", []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if p.Model != c.want.Model || p.MaxTokens != c.want.MaxTokens || p.N != c.want.N || p.Inputs != c.want.Inputs {
				t.Errorf("got %+v, want %+v", *p, c.want)
			}
			if p.PromptTokens < p.ContentTokens || p.PromptTokens <= 0 {
				t.Errorf("PromptTokens %d, ContentTokens %d", p.PromptTokens, p.ContentTokens)
			}
		})
	}
}
