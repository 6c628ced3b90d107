package sim_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// worstCase is a simulator in worst-case mode playing a provider whose
// default output limit is its whole output window (16,000), with one model
// of a larger default.
func worstCase(t *testing.T, cfg sim.Config) (*sim.Server, http.Handler) {
	t.Helper()
	cfg.WorstCase, cfg.DefaultMaxTokens, cfg.Now = true, 16000, newClock().Now
	cfg.Models = map[string]sim.Model{"big": {DefaultMaxTokens: 32000}}
	s := sim.New(cfg)
	return s, s.Handler()
}

// "hello world", the prompt of chat() and respBody(), is two tokens.
const helloTokens = 2

// In worst-case mode every chat choice produces exactly its output limit:
// max_tokens, max_completion_tokens, the larger of both, else the model's
// default; n choices each; a limit spelt in another case is no limit, as
// OpenAI reads member names exactly. Streamed, the usage chunk says the
// same, and each bill is what the answer said.
func TestWorstCaseChatOutput(t *testing.T) {
	t.Parallel()
	s, h := worstCase(t, sim.Config{})
	msgs := `{"model":"m","messages":[{"role":"user","content":"hello world"}]`
	for _, c := range []struct {
		name   string
		body   string
		output int64
	}{
		{"max_tokens", msgs + `,"max_tokens":100}`, 100},
		{"max_completion_tokens", msgs + `,"max_completion_tokens":200}`, 200},
		{"both, the larger second", msgs + `,"max_tokens":100,"max_completion_tokens":300}`, 300},
		{"both, the larger first", msgs + `,"max_tokens":400,"max_completion_tokens":150}`, 400},
		{"neither: the default", msgs + `}`, 16000},
		{"neither, a model of its own default", strings.Replace(msgs, `"m"`, `"big"`, 1) + `}`, 32000},
		{"n=3", msgs + `,"max_tokens":50,"n":3}`, 150},
		{"n=3, the default", msgs + `,"n":3}`, 48000},
		{"a case variant only", msgs + `,"MAX_TOKENS":16}`, 16000},
		{"case variants of both", msgs + `,"Max_Completion_Tokens":16,"N":2}`, 16000},
		{"an integral decimal", msgs + `,"max_tokens":1e2}`, 100},
	} {
		for _, stream := range []bool{false, true} {
			before := len(s.Bills())
			a := call(t, h, llm.EndpointChat, c.body, stream)
			got := a.bill(t, llm.EndpointChat, stream)
			if got.OutputTokens != c.output || got.InputTokens != helloTokens || got.CachedTokens != 0 {
				t.Errorf("%s (stream %v): usage %+v, want %d output tokens", c.name, stream, a.Usage, c.output)
			}
			for _, ch := range a.Choices {
				if ch.FinishReason != "length" {
					t.Errorf("%s (stream %v): finish_reason %q, want length", c.name, stream, ch.FinishReason)
				}
			}
			bills := s.Bills()
			if len(bills) != before+1 || !sameBill(bills[before], got) {
				t.Errorf("%s (stream %v): billed %+v, the answer said %+v", c.name, stream, bills[before:], got)
			}
		}
	}
}

// A Responses API answer produces max_output_tokens, else the default, and
// says so as OpenAI does: incomplete, for max_output_tokens.
func TestWorstCaseResponsesOutput(t *testing.T) {
	t.Parallel()
	s, h := worstCase(t, sim.Config{})
	for _, c := range []struct {
		name   string
		body   string
		output int64
	}{
		{"max_output_tokens", respBody("m", 100), 100},
		{"none: the default", respBody("m", 0), 16000},
		{"a case variant only", withField(respBody("m", 0), "MAX_OUTPUT_TOKENS", "20"), 16000},
	} {
		for _, stream := range []bool{false, true} {
			a := call(t, h, llm.EndpointResponses, c.body, stream)
			got := a.bill(t, llm.EndpointResponses, stream)
			if got.OutputTokens != c.output || got.InputTokens != helloTokens || a.Status != "incomplete" ||
				a.Incomplete == nil || a.Incomplete.Reason != "max_output_tokens" || len(a.Output) != 1 || a.Output[0].Status != "incomplete" {
				t.Errorf("%s (stream %v): %+v, want %d output tokens, incomplete for max_output_tokens", c.name, stream, a, c.output)
			}
			if stream && a.streamEvents[len(a.streamEvents)-1] != "response.incomplete" {
				t.Errorf("%s: the stream ends with %s", c.name, a.streamEvents[len(a.streamEvents)-1])
			}
			if b := s.Bills(); !sameBill(b[len(b)-1], got) {
				t.Errorf("%s (stream %v): billed %+v, the answer said %+v", c.name, stream, b[len(b)-1], got)
			}
		}
	}
}

// Earlier turns: a follow-up naming a previous_response_id is billed the
// stored conversation (its input and output) with its own prompt; an
// item_reference to any output item of a stored response is billed that
// response's whole output; an item the provider does not hold is OpenAI's
// 400, and a response stored with "store": false holds none.
func TestWorstCaseEarlierTurns(t *testing.T) {
	t.Parallel()
	s, h := worstCase(t, sim.Config{ToolResultTokens: 300})
	est := llm.NewEstimator()
	prompt := func(body string) int64 {
		p, err := est.Parse(llm.EndpointResponses, "", "", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return p.ContentTokens
	}
	first := call(t, h, llm.EndpointResponses, respBody("m", 100), false)
	if first.Usage.InputTokens != helloTokens || first.Usage.OutputTokens != 100 || first.Output[0].ID == "" {
		t.Fatalf("first: %+v", first)
	}

	follow := withField(`{"model":"m","input":"and then what happened?","max_output_tokens":50}`, "previous_response_id", strconv.Quote(first.ID))
	p := prompt(follow)
	a := call(t, h, llm.EndpointResponses, follow, false)
	if want := p + helloTokens + 100; a.Usage.InputTokens != want || a.Usage.OutputTokens != 50 {
		t.Errorf("follow-up: usage %+v, want %d input (%d + the earlier %d + %d)", a.Usage, want, p, helloTokens, 100)
	}
	// The follow-up's own conversation is its prompt with the earlier
	// turns and its output: a third turn is billed all of it.
	third := withField(`{"model":"m","input":"more","max_output_tokens":16}`, "previous_response_id", strconv.Quote(a.ID))
	if b := call(t, h, llm.EndpointResponses, third, false); b.Usage.InputTokens != prompt(third)+a.Usage.InputTokens+50 {
		t.Errorf("third turn: usage %+v, want %d", b.Usage, prompt(third)+a.Usage.InputTokens+50)
	}

	ref := func(id string) string {
		return `{"model":"m","input":[{"type":"item_reference","id":` + strconv.Quote(id) + `},{"role":"user","content":"hello world"}],"max_output_tokens":30}`
	}
	a = call(t, h, llm.EndpointResponses, ref(first.Output[0].ID), true)
	if want := prompt(ref(first.Output[0].ID)) + 100; a.Usage.InputTokens != want || a.Usage.OutputTokens != 30 {
		t.Errorf("item_reference: usage %+v, want %d input", a.Usage, want)
	}
	// The items of a response with tool calls: each names the whole output.
	tools := call(t, h, llm.EndpointResponses, withField(respBody("m", 40), "tools", `[{"type":"web_search"}]`), false)
	if len(tools.Output) != 11 {
		t.Fatalf("%d output items, want 10 calls and a message", len(tools.Output))
	}
	for _, item := range []outputItemObj{tools.Output[0], tools.Output[10]} {
		if a := call(t, h, llm.EndpointResponses, ref(item.ID), false); a.Usage.InputTokens != prompt(ref(item.ID))+40 {
			t.Errorf("item_reference to %s: usage %+v, want %d", item.Type, a.Usage, prompt(ref(item.ID))+40)
		}
	}
	// Its conversation holds the calls' results (300 tokens each).
	cont := withField(`{"model":"m","input":"so?","max_output_tokens":16}`, "previous_response_id", strconv.Quote(tools.ID))
	if b := call(t, h, llm.EndpointResponses, cont, false); b.Usage.InputTokens != prompt(cont)+helloTokens+10*300+40 {
		t.Errorf("after tool calls: usage %+v, want %d", b.Usage, prompt(cont)+helloTokens+10*300+40)
	}

	unstored := call(t, h, llm.EndpointResponses, withField(respBody("m", 20), "store", "false"), false)
	bills := len(s.Bills())
	for _, id := range []string{"msg_unknown", unstored.Output[0].ID} {
		rec := post(t, h, llm.EndpointResponses, ref(id))
		e := decodeErr(t, rec)
		if rec.Code != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != "input" ||
			e.Error.Code != nil || !strings.HasPrefix(e.Error.Message, "Item with id '"+id+"' not found.") {
			t.Errorf("item_reference to %s: %d %s", id, rec.Code, rec.Body)
		}
	}
	rec := post(t, h, llm.EndpointResponses, `{"model":"m","input":[{"type":"item_reference"},{"role":"user","content":"hi"}],"max_output_tokens":16}`)
	if e := decodeErr(t, rec); rec.Code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != "input[0].id" {
		t.Errorf("item_reference without id: %d %s", rec.Code, rec.Body)
	}
	if len(s.Bills()) != bills {
		t.Errorf("refused calls were billed")
	}
}

// Built-in tools: the answer makes max_tool_calls calls (10 when it sets
// none), spread over the request's built-in tools in turn, each an output
// item of OpenAI's type before the message, and is billed the worst
// multi-turn run: (k+1)·P + R·k(k+1)/2 + k·O. A chat call with
// web_search_options is one web search. Outside worst-case mode no tool is
// called.
func TestWorstCaseBuiltInTools(t *testing.T) {
	t.Parallel()
	const r = 500
	s, h := worstCase(t, sim.Config{ToolResultTokens: r})
	formula := func(p, o, k int64) int64 { return (k+1)*p + r*k*(k+1)/2 + k*o }
	function := `{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}`
	for _, c := range []struct {
		name  string
		tools string
		extra string
		types []string
	}{
		{"max_tool_calls 2", `[{"type":"web_search_preview"},` + function + `,{"type":"file_search","vector_store_ids":["vs_1"]}]`, `,"max_tool_calls":2`,
			[]string{"web_search_call", "file_search_call"}},
		{"none named: 10", `[{"type":"web_search_2025_08_26"},{"type":"code_interpreter","container":{"type":"auto"}},{"type":"image_generation"}]`, "",
			[]string{"web_search_call", "code_interpreter_call", "image_generation_call", "web_search_call", "code_interpreter_call",
				"image_generation_call", "web_search_call", "code_interpreter_call", "image_generation_call", "web_search_call"}},
		{"a dated preview", `[{"type":"web_search_preview_2025_03_11"}]`, `,"max_tool_calls":1`, []string{"web_search_call"}},

		{"function tools only", `[` + function + `]`, "", nil},
	} {
		for _, stream := range []bool{false, true} {
			body := strings.TrimSuffix(respBody("m", 100), "}") + `,"tools":` + c.tools + c.extra + `}`
			a := call(t, h, llm.EndpointResponses, body, stream)
			var types []string
			want := map[string]int64{}
			for i, item := range a.Output {
				if i == len(a.Output)-1 {
					if item.Type != "message" {
						t.Errorf("%s: the last item is a %s", c.name, item.Type)
					}
					break
				}
				types = append(types, item.Type)
				want[strings.TrimSuffix(item.Type, "_call")]++
				if item.ID == "" || item.Status != "completed" || item.Type == "web_search_call" && (item.Action == nil || item.Action.Type != "search") {
					t.Errorf("%s: item %+v", c.name, item)
				}
			}
			k := int64(len(c.types))
			if !slices.Equal(types, c.types) || a.Usage.OutputTokens != 100 || a.Usage.InputTokens != formula(helloTokens, 100, k) {
				t.Errorf("%s (stream %v): items %v, usage %+v; want %v and %d input tokens", c.name, stream, types, a.Usage, c.types, formula(helloTokens, 100, k))
			}
			if len(want) == 0 {
				want = nil
			}
			if b := s.Bills(); !maps.Equal(b[len(b)-1].ToolCalls, want) || !sameBill(b[len(b)-1], a.bill(t, llm.EndpointResponses, stream)) {
				t.Errorf("%s (stream %v): billed %+v, the answer showed %v", c.name, stream, b[len(b)-1], want)
			}
			if stream && !slices.Contains(a.streamEvents, "response.output_item.added") {
				t.Errorf("%s: events %v", c.name, a.streamEvents)
			}
		}
	}
	// The figures: with max_tool_calls 2, 3·2 + 500·3 + 2·100 = 1706; with
	// 10 calls, 11·2 + 500·55 + 10·100 = 28522.
	if formula(helloTokens, 100, 2) != 1706 || formula(helloTokens, 100, 10) != 28522 {
		t.Fatal("the formula")
	}

	// Chat's web search: one call, R once.
	a := call(t, h, llm.EndpointChat, withField(chat("m", 100), "web_search_options", `{}`), false)
	if a.Usage.PromptTokens != 2*helloTokens+r+100 || a.Usage.CompletionTokens != 100 {
		t.Errorf("chat with web_search_options: usage %+v, want %d prompt tokens", a.Usage, 2*helloTokens+r+100)
	}
	if b := s.Bills(); !maps.Equal(b[len(b)-1].ToolCalls, map[string]int64{"web_search": 1}) {
		t.Errorf("chat with web_search_options billed %+v", b[len(b)-1])
	}
	// max_tool_calls is bounded, and must be an integer.
	for _, v := range []string{"1001", `"3"`, "-1"} {
		if rec := post(t, h, llm.EndpointResponses, withField(respBody("m", 100), "max_tool_calls", v)); rec.Code != http.StatusBadRequest ||
			*decodeErr(t, rec).Error.Param != "max_tool_calls" {
			t.Errorf("max_tool_calls %s: %d %s", v, rec.Code, rec.Body)
		}
	}

	// Outside worst-case mode: no calls, the prompt billed once.
	s.SetWorstCase(false)
	a = call(t, h, llm.EndpointResponses, withField(respBody("m", 100), "tools", `[{"type":"web_search"}]`), false)
	if len(a.Output) != 1 || a.Usage.InputTokens != helloTokens {
		t.Errorf("ordinary mode with a built-in tool: %+v", a)
	}
	if b := s.Bills(); b[len(b)-1].ToolCalls != nil {
		t.Errorf("ordinary mode billed tool calls: %+v", b[len(b)-1])
	}
}

// The answer's service_tier is the one asked for, "default" for "auto" or
// none, in both APIs, plain and streamed, and so is the bill's; a tier
// OpenAI does not know is its 400.
func TestServiceTiers(t *testing.T) {
	t.Parallel()
	s, h := worstCase(t, sim.Config{})
	for _, tier := range []string{"priority", "flex", "scale", "default", "auto", ""} {
		want := tier
		if tier == "" || tier == "auto" {
			want = "default"
		}
		for _, endpoint := range []string{llm.EndpointChat, llm.EndpointResponses} {
			body := chat("m", 20)
			if endpoint == llm.EndpointResponses {
				body = respBody("m", 20)
			}
			if tier != "" {
				body = withField(body, "service_tier", strconv.Quote(tier))
			}
			for _, stream := range []bool{false, true} {
				a := call(t, h, endpoint, body, stream)
				if b := s.Bills(); a.ServiceTier != want || b[len(b)-1].ServiceTier != want {
					t.Errorf("%s %q (stream %v): answer %q, bill %q; want %q", endpoint, tier, stream, a.ServiceTier, b[len(b)-1].ServiceTier, want)
				}
			}
		}
	}
	if a := call(t, h, llm.EndpointChat, withField(chat("m", 20), "SERVICE_TIER", `"priority"`), false); a.ServiceTier != "default" {
		t.Errorf("a case variant of service_tier served %q", a.ServiceTier)
	}
	for _, v := range []string{`"fast"`, "1"} {
		rec := post(t, h, llm.EndpointChat, withField(chat("m", 20), "service_tier", v))
		if e := decodeErr(t, rec); rec.Code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != "service_tier" {
			t.Errorf("service_tier %s: %d %s", v, rec.Code, rec.Body)
		}
	}
}

// Batch lines are billed as the same calls made one by one, each logged
// with Batch set, and their output lines carry the same usage.
func TestWorstCaseBatch(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, WorstCase: true, DefaultMaxTokens: 16000, ToolResultTokens: 200})
	h := s.Handler()
	line := func(id, url, body string) string {
		return `{"custom_id":"` + id + `","method":"POST","url":"` + url + `","body":` + body + `}`
	}
	chatFile := strings.Join([]string{
		line("a", llm.EndpointChat, chat("m", 40)),
		line("b", llm.EndpointChat, chat("m", 0)),
		line("c", llm.EndpointChat, withField(withField(chat("m", 10), "n", "3"), "service_tier", `"flex"`)),
	}, "\n")
	respFile := strings.Join([]string{
		line("d", llm.EndpointResponses, respBody("m", 30)),
		line("e", llm.EndpointResponses, withField(withField(respBody("m", 30), "tools", `[{"type":"file_search"}]`), "max_tool_calls", "2")),
	}, "\n")
	want := map[string]struct {
		input, output int64
		tier          string
		tools         map[string]int64
	}{
		"a": {helloTokens, 40, "default", nil},
		"b": {helloTokens, 16000, "default", nil},
		"c": {helloTokens, 30, "flex", nil},
		"d": {helloTokens, 30, "default", nil},
		"e": {3*helloTokens + 200*3 + 2*30, 30, "default", map[string]int64{"file_search": 2}},
	}
	order := []string{"a", "b", "c", "d", "e"}
	for _, f := range []struct{ data, endpoint string }{{chatFile, llm.EndpointChat}, {respFile, llm.EndpointResponses}} {
		b := createBatch(t, h, upload(t, h, []byte(f.data)).ID, f.endpoint)
		c.Add(time.Second)
		b = getBatch(t, h, b.ID)
		if b.Status != "completed" || b.OutputFileID == nil {
			t.Fatalf("batch %+v", b)
		}
		for _, l := range fileContent(t, h, b.OutputFileID) {
			a := billedAnswer{}
			if err := json.Unmarshal(l.Response.Body, &a); err != nil || a.Usage == nil {
				t.Fatalf("line %s: %v", l.CustomID, err)
			}
			w := want[l.CustomID]
			got := a.bill(t, f.endpoint, false)
			if got.InputTokens != w.input || got.OutputTokens != w.output || got.ServiceTier != w.tier || !maps.Equal(got.ToolCalls, w.tools) {
				t.Errorf("line %s: %+v, want %+v", l.CustomID, got, w)
			}
		}
	}
	bills := s.Bills()
	if len(bills) != len(order) {
		t.Fatalf("%d bills for %d lines", len(bills), len(order))
	}
	for i, id := range order {
		w, b := want[id], bills[i]
		if !b.Batch || b.Stream || b.Seq != 0 || b.InputTokens != w.input || b.OutputTokens != w.output || b.ServiceTier != w.tier || !maps.Equal(b.ToolCalls, w.tools) {
			t.Errorf("line %s billed %+v, want %+v", id, b, w)
		}
	}
}

// The mode can be set at the control endpoint, and the simulator then
// draws completions again.
func TestModeEndpoint(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Seed: 5, CompletionMin: 0.1, CompletionMax: 0.1})
	h := s.Handler()
	if a := call(t, h, llm.EndpointChat, chat("m", 100), false); a.Usage.CompletionTokens != 10 {
		t.Fatalf("ordinary: %+v", a.Usage)
	}
	if rec := do(t, h, http.MethodPost, "/sim/mode", strings.NewReader(`{"worst_case":true}`), ""); rec.Code != http.StatusNoContent || !s.WorstCase() {
		t.Fatalf("set: %d %s", rec.Code, rec.Body)
	}
	if a := call(t, h, llm.EndpointChat, chat("m", 100), false); a.Usage.CompletionTokens != 100 {
		t.Errorf("worst case: %+v", a.Usage)
	}
	for _, bad := range []string{`{"worst_case":"yes"}`, `{"worst":true}`, `nope`} {
		if rec := do(t, h, http.MethodPost, "/sim/mode", strings.NewReader(bad), ""); rec.Code != http.StatusBadRequest || !s.WorstCase() {
			t.Errorf("%s: %d", bad, rec.Code)
		}
	}
	if rec := do(t, h, http.MethodPost, "/sim/mode", strings.NewReader(`{"worst_case":false}`), ""); rec.Code != http.StatusNoContent || s.WorstCase() {
		t.Errorf("unset: %d", rec.Code)
	}
}

// With an API key, every path needs it: the API's, the Batch API's, the
// stored responses' and the control API's; a request without it is
// OpenAI's 401.
func TestAPIKeyGuardsEveryPath(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, APIKey: "sk-guard"})
	h := s.Handler()
	paths := []struct{ method, path, body string }{
		{http.MethodPost, llm.EndpointChat, chat("m", 5)},
		{http.MethodPost, llm.EndpointResponses, respBody("m", 20)},
		{http.MethodPost, llm.EndpointEmbeddings, `{"model":"e","input":"hi"}`},
		{http.MethodGet, "/v1/models", ""},
		{http.MethodGet, "/v1/files", ""},
		{http.MethodGet, "/v1/batches", ""},
		{http.MethodGet, "/v1/responses/resp_x", ""},
		{http.MethodPost, "/openai/deployments/d/chat/completions?api-version=2024-10-21", chat("m", 5)},
		{http.MethodGet, "/sim/stats", ""},
		{http.MethodGet, "/sim/admissions", ""},
		{http.MethodGet, "/sim/bills", ""},
		{http.MethodPost, "/sim/limits", `{"rpm":1}`},
		{http.MethodPost, "/sim/faults", `{"rate_500":1}`},
		{http.MethodPost, "/sim/mode", `{"worst_case":true}`},
		{http.MethodPost, "/sim/reset", ""},
		{http.MethodGet, "/nowhere", ""},
	}
	for _, key := range []string{"", "sk-wrong"} {
		for _, p := range paths {
			req := httptest.NewRequest(p.method, p.path, strings.NewReader(p.body))
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if e := decodeErr(t, rec); rec.Code != http.StatusUnauthorized || e.Error.Code == nil || *e.Error.Code != "invalid_api_key" {
				t.Errorf("%s %s with key %q: %d %s", p.method, p.path, key, rec.Code, rec.Body)
			}
		}
	}
	if st := s.Stats(); st.Unauthorized != int64(2*len(paths)) || st.Requests != 0 || s.WorstCase() || len(s.Bills()) != 0 {
		t.Errorf("stats %+v: something passed", st)
	}
	for _, p := range paths[:len(paths)-1] {
		req := httptest.NewRequest(p.method, p.path, strings.NewReader(p.body))
		req.Header.Set("Authorization", "Bearer sk-guard")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusUnauthorized {
			t.Errorf("%s %s with the key: %d", p.method, p.path, rec.Code)
		}
	}
}

// With RandomIDs two simulators of one seed give different ids (responses,
// their items, completions, files, batches, request ids), each of its
// prefix and 24 hex digits; without, the same.
func TestRandomIDs(t *testing.T) {
	t.Parallel()
	type ids struct{ resp, msg, chat, file, batch, request string }
	run := func(random bool) ids {
		s := sim.New(sim.Config{Now: newClock().Now, Seed: 9, RandomIDs: random})
		h := s.Handler()
		r := call(t, h, llm.EndpointResponses, respBody("m", 20), false)
		rec := post(t, h, llm.EndpointChat, chat("m", 5))
		var c struct{ ID string }
		_ = json.Unmarshal(rec.Body.Bytes(), &c)
		f := upload(t, h, []byte(chatLine("a", "m", "hi")+"\n"))
		b := createBatch(t, h, f.ID, llm.EndpointChat)
		return ids{r.ID, r.Output[0].ID, c.ID, f.ID, b.ID, rec.Header().Get("X-Request-Id")}
	}
	one, two := run(true), run(true)
	hex24 := func(id, prefix string) bool {
		rest, ok := strings.CutPrefix(id, prefix)
		return ok && len(rest) == 24 && strings.Trim(rest, "0123456789abcdef") == ""
	}
	for _, x := range []struct{ a, b, prefix string }{
		{one.resp, two.resp, "resp_"}, {one.msg, two.msg, "msg_"}, {one.chat, two.chat, "chatcmpl-"},
		{one.file, two.file, "file-"}, {one.batch, two.batch, "batch_"}, {one.request, two.request, "req_"},
	} {
		if x.a == x.b || !hex24(x.a, x.prefix) || !hex24(x.b, x.prefix) {
			t.Errorf("random ids %q and %q", x.a, x.b)
		}
	}
	if a, b := run(false), run(false); a != b {
		t.Errorf("one seed gave %+v and %+v", a, b)
	}
}
