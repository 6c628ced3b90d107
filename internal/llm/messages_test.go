package llm_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/wire"
)

// A Messages API body is read and bounded like every body: what is wrong
// is refused naming the field.
func TestParseMessagesRejects(t *testing.T) {
	t.Parallel()
	const m = llm.EndpointMessages
	turn := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct{ name, body, param string }{
		{"model missing", `{"max_tokens":10,` + turn + `}`, "model"},
		{"max_tokens missing", `{"model":"claude",` + turn + `}`, "max_tokens"},
		{"max_tokens zero", `{"model":"claude","max_tokens":0,` + turn + `}`, "max_tokens"},
		{"max_tokens string", `{"model":"claude","max_tokens":"9",` + turn + `}`, "max_tokens"},
		{"messages missing", `{"model":"claude","max_tokens":10}`, "messages"},
		{"messages empty", `{"model":"claude","max_tokens":10,"messages":[]}`, "messages"},
		{"role system", `{"model":"claude","max_tokens":10,"messages":[{"role":"system","content":"x"}]}`, "messages[0].role"},
		{"content missing", `{"model":"claude","max_tokens":10,"messages":[{"role":"user"}]}`, "messages[0].content"},
		{"content number", `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":3}]}`, "messages[0].content"},
		{"block without type", `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type"},
		{"text not a string", `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, "messages[0].content[0].text"},
		{"system number", `{"model":"claude","max_tokens":10,"system":4,` + turn + `}`, "system"},
		{"stream", `{"model":"claude","max_tokens":10,"stream":true,` + turn + `}`, "stream"},
		{"server tool", `{"model":"claude","max_tokens":10,"tools":[{"name":"f","input_schema":{}},{"type":"web_search_20250305","name":"web_search"}],` + turn + `}`, "tools[1].type"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := llm.NewEstimator().Parse(m, "", "", []byte(c.body))
			var ir *wire.Error
			if !errors.As(err, &ir) {
				t.Fatalf("err = %v, want *wire.Error", err)
			}
			if ir.Param != c.param || !strings.Contains(ir.Message, "'"+c.param+"'") {
				t.Errorf("Param %q, message %q; want %q named", ir.Param, ir.Message, c.param)
			}
		})
	}
	// A member named as one llmq reads but for case is reported.
	b, err := llm.Decode(m, []byte(`{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"a","Content":"b"}]}`))
	var ir *wire.Error
	if err != nil || !errors.As(b.CaseVariant(), &ir) || ir.Param != "messages[0].Content" {
		t.Errorf("case variant: %v %v", err, b.CaseVariant())
	}
}

// The worst case comes from max_tokens, and a Claude model's prompt
// estimate errs high: over many generated prompts it is at least what the
// simulator counts (llmq's own content count) and 50% above it.
func TestParseMessagesEstimate(t *testing.T) {
	t.Parallel()
	est := llm.NewEstimator()
	rng := rand.New(rand.NewPCG(48, 2))
	for i := range 200 {
		n := 1 + rng.IntN(2000)
		body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":%d,"system":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral"}}],`+
			`"messages":[{"role":"user","content":[{"type":"text","text":%q},{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]},`+
			`{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},`+
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"42"}]}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`,
			1+i, words(n), words(rng.IntN(500)))
		p, err := est.Parse(llm.EndpointMessages, "", "", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if p.MaxTokens != int64(1+i) || p.N != 1 || p.KnownModel {
			t.Fatalf("parsed %+v", p)
		}
		if p.PromptTokens < p.ContentTokens*3/2 || p.ContentTokens < int64(n)+1600 {
			t.Fatalf("prompt %d, content %d of %d words and an image", p.PromptTokens, p.ContentTokens, n)
		}
	}
	// A document's size is not llmq's to know: the context window bounds it.
	b, err := llm.Decode(llm.EndpointMessages, []byte(`{"model":"claude","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","data":"AAAA"}}]}]}`))
	if err != nil || b.Uncounted() != "messages[0].content[0]" {
		t.Errorf("document: %v %q", err, b.Uncounted())
	}
	if got := llm.OutputField(llm.EndpointMessages, "claude"); got != "max_tokens" {
		t.Errorf("OutputField = %q", got)
	}
	if sim.EndpointMessages != llm.EndpointMessages {
		t.Error("the simulator serves another path")
	}
}
