package sim_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// billedAnswer is what an answer says of its own bill: its usage, service
// tier and id, and the built-in tool calls among its output items.
type billedAnswer struct {
	Model        string                   `json:"model"`
	ServiceTier  string                   `json:"service_tier"`
	ID           string                   `json:"id"`
	Status       string                   `json:"status"`
	Output       []outputItemObj          `json:"output"`
	Usage        *answerUsage             `json:"usage"`
	Choices      []choiceObj              `json:"choices"`
	Incomplete   *struct{ Reason string } `json:"incomplete_details"`
	streamEvents []string
}

type outputItemObj struct {
	ID      string                 `json:"id"`
	Type    string                 `json:"type"`
	Status  string                 `json:"status"`
	Action  *struct{ Type string } `json:"action"`
	Content []json.RawMessage      `json:"content"`
}

type choiceObj struct {
	FinishReason string `json:"finish_reason"`
}

// answerUsage reads both APIs' usage.
type answerUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// call sends body to endpoint through h, streamed (with the usage asked
// for) when stream is set, and reads the answer; a non-200 fails the test.
func call(t *testing.T, h http.Handler, endpoint, body string, stream bool) billedAnswer {
	t.Helper()
	if stream {
		body = withField(body, "stream", "true")
		if endpoint == llm.EndpointChat {
			body = withField(body, "stream_options", `{"include_usage":true}`)
		}
	}
	rec := post(t, h, endpoint, body)
	if rec.Code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", endpoint, body, rec.Code, rec.Body)
	}
	return readAnswer(t, endpoint, rec, stream)
}

// readAnswer reads a 200 answer, plain or streamed, of either API.
func readAnswer(t *testing.T, endpoint string, rec *httptest.ResponseRecorder, stream bool) billedAnswer {
	t.Helper()
	var a billedAnswer
	switch {
	case !stream:
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
			t.Fatalf("answer %s: %v", rec.Body, err)
		}
	case endpoint == llm.EndpointResponses:
		for _, e := range readSSE(t, rec.Body.String()) {
			a.streamEvents = append(a.streamEvents, e.name)
			if e.name == "response.completed" || e.name == "response.incomplete" {
				var d struct {
					Response json.RawMessage `json:"response"`
				}
				if err := json.Unmarshal(e.data, &d); err != nil || json.Unmarshal(d.Response, &a) != nil {
					t.Fatalf("final event %s: %v", e.data, err)
				}
			}
		}
	default:
		for _, e := range streamEvents(t, rec.Body.String()) {
			if e == "[DONE]" {
				continue
			}
			var ch billedAnswer
			if err := json.Unmarshal([]byte(e), &ch); err != nil {
				t.Fatalf("chunk %s: %v", e, err)
			}
			a.Model, a.ServiceTier, a.ID = ch.Model, ch.ServiceTier, ch.ID
			if ch.Usage != nil {
				a.Usage = ch.Usage
			}
			for _, c := range ch.Choices {
				if c.FinishReason != "" {
					a.Choices = append(a.Choices, c)
				}
			}
		}
	}
	return a
}

// bill is the bill the answer shows, to compare with the simulator's.
func (a billedAnswer) bill(t *testing.T, endpoint string, stream bool) sim.Bill {
	t.Helper()
	if a.Usage == nil {
		t.Fatalf("an answer without usage: %+v", a)
	}
	u := a.Usage
	b := sim.Bill{Endpoint: endpoint, Model: a.Model, ServiceTier: a.ServiceTier, Stream: stream}
	switch endpoint {
	case llm.EndpointResponses:
		b.InputTokens, b.OutputTokens, b.CachedTokens, b.ResponseID = u.InputTokens, u.OutputTokens, u.InputTokensDetails.CachedTokens, a.ID
	default:
		b.InputTokens, b.OutputTokens, b.CachedTokens = u.PromptTokens, u.CompletionTokens, u.PromptTokensDetails.CachedTokens
	}
	if endpoint == llm.EndpointEmbeddings {
		b.ServiceTier = "default"
	}
	if u.TotalTokens != b.InputTokens+b.OutputTokens {
		t.Errorf("total_tokens %d ≠ %d input + %d output", u.TotalTokens, b.InputTokens, b.OutputTokens)
	}
	for _, item := range a.Output {
		if kind, ok := strings.CutSuffix(item.Type, "_call"); ok {
			if b.ToolCalls == nil {
				b.ToolCalls = map[string]int64{}
			}
			b.ToolCalls[kind]++
		}
	}
	return b
}

// sameBill compares a bill with the one its answer showed, but for the
// admission log entry, which the answer does not carry.
func sameBill(got, want sim.Bill) bool {
	got.Seq = 0
	return got.Endpoint == want.Endpoint && got.Model == want.Model && got.ServiceTier == want.ServiceTier &&
		got.InputTokens == want.InputTokens && got.CachedTokens == want.CachedTokens && got.OutputTokens == want.OutputTokens &&
		maps.Equal(got.ToolCalls, want.ToolCalls) && got.ResponseID == want.ResponseID && got.Batch == want.Batch && got.Stream == want.Stream
}

// In the ordinary mode too, every admitted call is billed once, in order,
// exactly what its answer's usage says: chat (n of 1 and 2), the Responses
// API, embeddings, each plain and streamed where the API streams; the
// admission log entry of each is its Seq.
func TestBillsMatchUsage(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Seed: 12, CompletionMin: 0.2, CompletionMax: 0.8, PromptFactor: 1.3})
	h := s.Handler()
	calls := []struct {
		endpoint, body string
		stream         bool
	}{
		{llm.EndpointChat, chat("m", 40), false},
		{llm.EndpointChat, withField(chat("m", 60), "n", "2"), false},
		{llm.EndpointChat, chat("m", 80), true},
		{llm.EndpointChat, withField(chat("m", 30), "service_tier", `"flex"`), true},
		{llm.EndpointResponses, respBody("m", 50), false},
		{llm.EndpointResponses, withField(respBody("m", 70), "service_tier", `"priority"`), true},
		{llm.EndpointEmbeddings, `{"model":"e","input":["one two three","four"]}`, false},
		{llm.EndpointChat, withField(chat("other", 0), "service_tier", `"auto"`), false},
	}
	var want []sim.Bill
	for _, c := range calls {
		want = append(want, call(t, h, c.endpoint, c.body, c.stream).bill(t, c.endpoint, c.stream))
	}
	// A refused call is not billed.
	if rec := post(t, h, llm.EndpointChat, `{"model":"m","messages":[]}`); rec.Code != http.StatusBadRequest {
		t.Fatalf("bad body: %d", rec.Code)
	}
	got := s.Bills()
	if len(got) != len(want) {
		t.Fatalf("%d bills for %d calls: %+v", len(got), len(want), got)
	}
	adm := s.Admissions(0)
	var input, output int64
	for i := range want {
		if !sameBill(got[i], want[i]) || got[i].Seq != adm[i].Seq {
			t.Errorf("call %d billed %+v; its answer says %+v (admission %d)", i, got[i], want[i], adm[i].Seq)
		}
		input += got[i].InputTokens
		output += got[i].OutputTokens
	}
	if got[1].OutputTokens <= 0 || got[7].ServiceTier != "default" || got[3].ServiceTier != "flex" || got[5].ServiceTier != "priority" || !got[2].Stream {
		t.Errorf("bills %+v", got)
	}
	if st := s.Stats(); st.PromptTokens != input || st.CompletionTokens != output {
		t.Errorf("stats count %d prompt and %d completion tokens; the bills %d and %d", st.PromptTokens, st.CompletionTokens, input, output)
	}
	// The control API shows the same log; a reset clears it.
	var shown []sim.Bill
	if rec := do(t, h, http.MethodGet, "/sim/bills", nil, ""); rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &shown) != nil || len(shown) != len(got) ||
		!sameBill(shown[4], got[4]) {
		t.Errorf("GET /sim/bills: %d %s", rec.Code, rec.Body)
	}
	s.Reset()
	if b := s.Bills(); len(b) != 0 {
		t.Errorf("after a reset: %+v", b)
	}
}

// A stream that fails midway, and an answer without its usage, are billed
// all the same: the provider served them.
func TestBillsOfFailedStreamsAndMissingUsage(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Seed: 3, WorstCase: true, Faults: sim.Faults{StreamError: 1, OmitUsage: 1}})
	h := s.Handler()
	for _, endpoint := range []string{llm.EndpointChat, llm.EndpointResponses} {
		body := chat("m", 40)
		if endpoint == llm.EndpointResponses {
			body = respBody("m", 40)
		}
		if rec := post(t, h, endpoint, withField(body, "stream", "true")); rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "[DONE]") ||
			strings.Contains(rec.Body.String(), "response.incomplete") {
			t.Fatalf("%s: %d %s", endpoint, rec.Code, rec.Body)
		}
		if rec := post(t, h, endpoint, body); rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), `"usage":{`) {
			t.Fatalf("%s without usage: %d %s", endpoint, rec.Code, rec.Body)
		}
	}
	bills := s.Bills()
	if len(bills) != 4 {
		t.Fatalf("%d bills, want 4: %+v", len(bills), bills)
	}
	for i, b := range bills {
		if b.InputTokens != 2 || b.OutputTokens != 40 || b.Stream != (i%2 == 0) || b.Seq != int64(i+1) {
			t.Errorf("bill %d: %+v; want 2 input and 40 output tokens", i, b)
		}
	}
}

// The bill log is bounded by LogSize, as the admission log is.
func TestBillLogRing(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{LogSize: 3, Now: newClock().Now})
	for i := range 5 {
		post(t, s.Handler(), llm.EndpointChat, chat(fmt.Sprintf("m%d", i), 1))
	}
	b := s.Bills()
	if len(b) != 3 || b[0].Model != "m2" || b[2].Model != "m4" || b[0].Seq != 3 {
		t.Errorf("bills %+v", b)
	}
	if st := s.Stats(); st.BillsDropped != 2 {
		t.Errorf("dropped %d", st.BillsDropped)
	}
}
