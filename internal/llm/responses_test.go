package llm_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/wire"
)

// A Responses body is counted as the chat conversation it stands for:
// a string input is one user message, instructions a system message, items
// their messages, an image its allowance; max_output_tokens is the output
// bound.
func TestResponsesCountedAsChat(t *testing.T) {
	t.Parallel()
	parse := func(endpoint, body string) *llm.ParsedRequest {
		t.Helper()
		p, err := llm.NewEstimator().Parse(endpoint, "", "", []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return p
	}
	cases := []struct{ responses, chat string }{
		{`{"model":"gpt-4o","input":"Say hello to the world.","max_output_tokens":50}`,
			`{"model":"gpt-4o","messages":[{"role":"user","content":"Say hello to the world."}],"max_tokens":50}`},
		{`{"model":"gpt-4o","instructions":"Be brief.","input":"Say hello."}`,
			`{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}]}`},
		{`{"model":"gpt-4o","input":[{"role":"developer","content":"Rules."},{"type":"message","role":"user","content":[{"type":"input_text","text":"Look:"},{"type":"input_image","image_url":"https://x/y.png","detail":"low"}]},{"role":"assistant","content":[{"type":"output_text","text":"A cat."}]}]}`,
			`{"model":"gpt-4o","messages":[{"role":"developer","content":"Rules."},{"role":"user","content":[{"type":"text","text":"Look:"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]},{"role":"assistant","content":"A cat."}]}`},
		{`{"model":"gpt-4o-mini","input":[{"role":"user","content":[{"type":"input_image","file_id":"file-1"}]}]}`,
			`{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]}]}`},
	}
	for _, c := range cases {
		r, ch := parse(llm.EndpointResponses, c.responses), parse(llm.EndpointChat, c.chat)
		if r.PromptTokens != ch.PromptTokens || r.ContentTokens != ch.ContentTokens || r.MaxTokens != ch.MaxTokens || r.N != 1 {
			t.Errorf("%s: counted %+v, its chat form %+v", c.responses, r, ch)
		}
	}
	// Tools are counted by the same formula as chat's function tools.
	r := parse(llm.EndpointResponses, `{"model":"gpt-4o","input":"Weather?","tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]}`)
	ch := parse(llm.EndpointChat, `{"model":"gpt-4o","messages":[{"role":"user","content":"Weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`)
	if r.PromptTokens != ch.PromptTokens {
		t.Errorf("tools: %d, chat %d", r.PromptTokens, ch.PromptTokens)
	}
	// Function calls, their outputs and a schema add to the count.
	base := parse(llm.EndpointResponses, `{"model":"gpt-4o","input":[{"role":"user","content":"hi"}]}`).PromptTokens
	more := parse(llm.EndpointResponses, `{"model":"gpt-4o","input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"c1","output":"Sunny, 24 degrees"}],"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object","properties":{"answer":{"type":"string"}}}}}}`).PromptTokens
	if more < base+15 {
		t.Errorf("function call, output and schema add %d tokens", more-base)
	}
}

// A Responses body that cannot be sent is refused naming its parameter.
func TestResponsesRefusals(t *testing.T) {
	t.Parallel()
	cases := []struct{ body, param string }{
		{`{"model":"gpt-4o"}`, "input"},
		{`{"model":"gpt-4o","input":[]}`, "input"},
		{`{"model":"gpt-4o","input":42}`, "input"},
		{`{"model":"gpt-4o","input":[{"role":"wizard","content":"x"}]}`, "input[0].role"},
		{`{"model":"gpt-4o","input":[{"role":"user"}]}`, "input[0].content"},
		{`{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_text"}]}]}`, "input[0].content[0].text"},
		{`{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_image"}]}]}`, "input[0].content[0].image_url"},
		{`{"model":"gpt-4o","input":["x"]}`, "input[0]"},
		{`{"model":"gpt-4o","input":"x","max_output_tokens":8}`, "max_output_tokens"},
		{`{"model":"gpt-4o","input":"x","max_output_tokens":"many"}`, "max_output_tokens"},
		{`{"model":"gpt-4o","input":"x","instructions":7}`, "instructions"},
		{`{"model":"gpt-4o","input":"x","stream":true}`, "stream"},
		{`{"model":"gpt-4o","input":"x","background":true}`, "background"},
		{`{"model":"gpt-4o","input":"x","store":"yes"}`, "store"},
		{`{"model":"gpt-4o","input":"x","previous_response_id":""}`, "previous_response_id"},
		{`{"model":"gpt-4o","input":"x","previous_response_id":"resp_` + strings.Repeat("9", 300) + `"}`, "previous_response_id"},
		{`{"input":"x"}`, "model"},
	}
	for _, c := range cases {
		_, err := llm.NewEstimator().Parse(llm.EndpointResponses, "", "", []byte(c.body))
		var ir *wire.Error
		if !errors.As(err, &ir) || ir.Param != c.param || !strings.Contains(ir.Message, c.param) {
			t.Errorf("%s: %v, want a refusal naming %s", c.body, err, c.param)
		}
	}
	// Context stored at the provider needs no input of its own, and is
	// reported for admission to judge.
	for body, want := range map[string]func(*llm.Body) bool{
		`{"model":"gpt-4o","previous_response_id":"resp_1","input":"and then?"}`: func(b *llm.Body) bool { return b.PreviousResponseID() == "resp_1" },
		`{"model":"gpt-4o","prompt":{"id":"pmpt_1"}}`:                            func(b *llm.Body) bool { return b.Unseen() == "prompt" },
		`{"model":"gpt-4o","conversation":"conv_1","input":"x"}`:                 func(b *llm.Body) bool { return b.Unseen() == "conversation" },
		`{"model":"gpt-4o","input":[{"type":"item_reference","id":"msg_1"},{"role":"user","content":"more"}]}`: func(b *llm.Body) bool {
			return slices.Equal(b.ItemReferences(), []string{"msg_1"})
		},
	} {
		b, err := llm.Decode(llm.EndpointResponses, []byte(body))
		if err != nil || !want(b) {
			t.Errorf("%s: %v, or its stored context not reported", body, err)
		}
	}
	if b, err := llm.Decode(llm.EndpointResponses, []byte(`{"model":"gpt-4o","input":"item_reference"}`)); err != nil ||
		b.PreviousResponseID() != "" || b.Unseen() != "" || len(b.ItemReferences()) != 0 {
		t.Errorf("stored context reported for a body without any: %v", err)
	}
}

// A response's usage is read as input and output tokens with their
// details; a count no request could have is named.
func TestResponsesUsage(t *testing.T) {
	t.Parallel()
	u, err := llm.UsageOf([]byte(`{"object":"response","usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":64},"output_tokens":40,"output_tokens_details":{"reasoning_tokens":25},"total_tokens":160}}`))
	if err != nil || !reflect.DeepEqual(u, llm.Usage{PromptTokens: 120, CompletionTokens: 40, TotalTokens: 160, CachedTokens: 64, ReasoningTokens: 25}) {
		t.Fatalf("usage %+v, %v", u, err)
	}
	if why := llm.UnbelievableUsage(llm.Usage{PromptTokens: 10, CompletionTokens: 5, ReasoningTokens: 6, TotalTokens: 15}); !strings.Contains(why, "reasoning") {
		t.Errorf("reasoning beyond output: %q", why)
	}
	if why := llm.UnbelievableUsage(llm.Usage{PromptTokens: 50_000, CompletionTokens: 5, TotalTokens: 50_005}); why != "" {
		t.Errorf("a large prompt is admission's to judge, not the reader's: %q", why)
	}
}

const okResponse = `{"id":"resp_1","object":"response","status":"completed","model":"up","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12},"extra_field":{"kept":true}}`

// A Responses call sends the client's body with the upstream model to
// /responses and returns the provider's bytes with their usage; answers it
// cannot take are errors of their class.
func TestResponsesCall(t *testing.T) {
	t.Parallel()
	rec := &recorder{status: 200, body: okResponse, headers: map[string]string{"x-request-id": "req_9"}}
	p := newProvider(t, startRecorder(t, rec), 5*time.Second)
	resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointResponses, Upstream: "up",
		Body: []byte(`{"model":"gpt-4o","input":"hi","temperature":0,"store":false,"previous_response_id":"resp_0"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Body) != okResponse || !reflect.DeepEqual(resp.Usage, (llm.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12, CachedTokens: 4})) || resp.RequestID != "req_9" {
		t.Fatalf("response %+v", resp)
	}
	if got := rec.bodies[0]; !strings.Contains(got, `"model":"up"`) || !strings.Contains(got, `"temperature":0`) ||
		!strings.Contains(got, `"store":false`) || !strings.Contains(got, `"previous_response_id":"resp_0"`) {
		t.Fatalf("sent %s", got)
	}
	for _, c := range []struct {
		status int
		body   string
		class  llm.Class
		code   client.Code
	}{
		{200, `{"object":"chat.completion"}`, llm.ClassPermanent, client.CodeProviderResponseInvalid},
		{200, `{"object":"response","usage":{"input_tokens":"ten"}}`, llm.ClassPermanent, client.CodeProviderResponseInvalid},
		{200, `{"object":"resp`, llm.ClassRetryable, client.CodeProviderResponseUnreadable},
		{429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, llm.ClassRateLimited, client.CodeRateLimitExceeded},
		{400, `{"error":{"message":"Previous response not found","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, llm.ClassPermanent, "previous_response_not_found"},
	} {
		rec := &recorder{status: c.status, body: c.body}
		p := newProvider(t, startRecorder(t, rec), 5*time.Second)
		_, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointResponses, Body: []byte(`{"model":"m","input":"hi"}`)})
		if e := asError(t, err); e.Class != c.class || e.Code != c.code {
			t.Errorf("%d %s: %v (class %v code %q)", c.status, c.body, e, e.Class, e.Code)
		}
	}
}

// responsesEvents is a Responses API stream as OpenAI sends it, ending
// with end (an event's type and data, or "" for none).
func responsesEvents(end string) string {
	var b strings.Builder
	ev := func(typ, data string) { fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", typ, data) }
	ev("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","usage":null}}`)
	ev("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":1,"delta":"Hel"}`)
	ev("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":2,"delta":"lo"}`)
	b.WriteString(end)
	return b.String()
}

// A streamed Responses call relays every event and ends with
// response.completed, whose response and usage are the answer; an error
// event or response.failed is the call's error; a stream cut before its end
// says how many events it relayed.
func TestResponsesStream(t *testing.T) {
	t.Parallel()
	completed := "event: response.completed\ndata: " + `{"type":"response.completed","sequence_number":3,"response":{"id":"resp_1","object":"response","status":"completed","usage":{"input_tokens":7,"output_tokens":2,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":9}}}` + "\n\n"
	cases := []struct {
		name, end string
		events    int
		code      client.Code
	}{
		{"completed", completed, 4, ""},
		{"error event", "event: error\ndata: " + `{"type":"error","sequence_number":3,"code":"server_error","message":"The server had an error","param":null}` + "\n\n", 3, client.CodeServerError},
		{"failed", "event: response.failed\ndata: " + `{"type":"response.failed","sequence_number":3,"response":{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"boom"}}}` + "\n\n", 3, client.CodeServerError},
		{"cut", "", 3, client.CodeProviderStreamFailed},
	}
	for _, c := range cases {
		var sent string
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b := make([]byte, 4096)
			n, _ := r.Body.Read(b)
			sent = r.URL.Path + " " + string(b[:n])
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte(responsesEvents(c.end)))
		}))
		p := newProvider(t, hs.URL+"/v1", 5*time.Second)
		var events []string
		resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointResponses, Upstream: "up", Body: []byte(`{"model":"m","input":"hi"}`),
			Stream: func(d []byte) error { events = append(events, string(d)); return nil }})
		hs.Close()
		if !strings.HasPrefix(sent, "/v1/responses ") || !strings.Contains(sent, `"stream":true`) || strings.Contains(sent, "stream_options") || !strings.Contains(sent, `"model":"up"`) {
			t.Errorf("%s: sent %s", c.name, sent)
		}
		if c.name == "completed" {
			if err != nil || resp.Chunks != 4 || !reflect.DeepEqual(resp.Usage, (llm.Usage{PromptTokens: 7, CompletionTokens: 2, TotalTokens: 9, ReasoningTokens: 1})) ||
				!strings.HasPrefix(string(resp.Body), `{"id":"resp_1"`) {
				t.Errorf("completed: %v %+v", err, resp)
			}
			continue
		}
		e := asError(t, err)
		if e.Relayed != c.events || e.Code != c.code || e.Class != llm.ClassRetryable || len(events) != c.events {
			t.Errorf("%s: %v, relayed %d of %d events, code %q", c.name, e, e.Relayed, len(events), e.Code)
		}
	}
}

// An Azure provider calls the Responses API at /openai/responses with its
// api-version, or at /openai/v1/responses without one, the deployment as
// the body's model; whole and streamed, against the simulator.
func TestResponsesOnAzure(t *testing.T) {
	t.Parallel()
	ts := startSim(t, sim.Config{APIKey: testKey, Limits: sim.Limits{RPM: 100, TPM: 100000}, RateHeaders: sim.HeadersAzure})
	base := ts.BaseURL[:len(ts.BaseURL)-len("/v1")]
	body := []byte(`{"model":"ignored","input":"Say hello.","max_output_tokens":20}`)
	for _, version := range []string{"2025-04-01-preview", ""} {
		p := newAzure(t, base, version)
		resp, err := p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointResponses, Upstream: "my-gpt4o", Body: body})
		if err != nil || resp.Usage.PromptTokens == 0 || resp.Usage.CompletionTokens == 0 || func() bool { id, _ := llm.StoredIDs(resp.Body); return id == "" }() {
			t.Fatalf("api-version %q: %v %+v", version, err, resp)
		}
		events := 0
		resp, err = p.Call(context.Background(), llm.Request{Endpoint: llm.EndpointResponses, Upstream: "my-gpt4o", Body: body,
			Stream: func([]byte) error { events++; return nil }})
		if err != nil || resp.Chunks != events || events < 5 || resp.Usage.CompletionTokens == 0 {
			t.Fatalf("api-version %q, streamed: %v, %d events, %+v", version, err, events, resp)
		}
	}
	for _, a := range ts.Admissions(0) {
		if a.Model != "my-gpt4o" {
			t.Fatalf("admitted %+v, want deployment my-gpt4o", a)
		}
	}
}
