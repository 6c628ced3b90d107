package llm_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/llm"
)

// A provider's string is cut at a character's boundary, never inside one.
func TestTruncateKeepsUTF8(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc"},
		{"héllo", 2, "h"}, // é is two bytes: cut before it
		{strings.Repeat("€", 5), 7, "€€"},
		{"a\xffb", 3, "a\xffb"}, // within the bound: as given
	} {
		got := llm.Truncate(c.in, c.n)
		if got != c.want || (len(c.in) > c.n && !utf8.ValidString(got)) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// A provider's error fields and request id are bounded wherever they are
// read: an error answer through go-openai (chat) and over plain HTTP (the
// Responses API), and a stream's error chunk; each stays valid UTF-8.
func TestProviderStringsAreBounded(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("é", 5000)
	errorObject := `{"error":{"message":"` + huge + `","type":"` + huge + `","param":"` + huge + `","code":"` + huge + `"}}`
	headers := map[string]string{"x-request-id": strings.Repeat("r", 100_000)}
	calls := []struct {
		name   string
		rec    *recorder
		req    llm.Request
		status int
	}{
		{"chat", &recorder{status: 400, headers: headers, body: errorObject},
			llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}, 400},
		{"responses", &recorder{status: 400, headers: headers, body: errorObject},
			llm.Request{Endpoint: llm.EndpointResponses, Body: json.RawMessage(`{"model":"m","input":"hi"}`)}, 400},
		{"stream", &recorder{status: 200, headers: headers, body: "data: " + errorObject + "\n\n"},
			llm.Request{Endpoint: llm.EndpointChat, Body: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`),
				Stream: func([]byte) error { return nil }}, 200},
	}
	for _, c := range calls {
		p := newProvider(t, startRecorder(t, c.rec), 5*time.Second)
		_, err := p.Call(context.Background(), c.req)
		e := asError(t, err)
		for name, v := range map[string]string{"message": e.Message, "type": e.Type, "code": string(e.Code), "param": e.Param, "request id": e.RequestID} {
			if v == "" || len(v) > 1010 || name != "message" && len(v) > 200 || !utf8.ValidString(v) {
				t.Errorf("%s: %s of %d bytes", c.name, name, len(v))
			}
		}
		if e.StatusCode != c.status {
			t.Errorf("%s: status %d", c.name, e.StatusCode)
		}
	}
}
