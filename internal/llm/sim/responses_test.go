package sim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// respBody is the Responses API body asking what chat(model, maxTokens)
// asks: the same message, max_output_tokens for max_tokens.
func respBody(model string, maxTokens int) string {
	mt := ""
	if maxTokens > 0 {
		mt = `,"max_output_tokens":` + strconv.Itoa(maxTokens)
	}
	return `{"model":"` + model + `","input":[{"role":"user","content":"hello world"}]` + mt + `}`
}

// withField adds "key": raw to a JSON object body.
func withField(body, key, raw string) string {
	return strings.TrimSuffix(body, "}") + `,"` + key + `":` + raw + `}`
}

// responseObj is what the tests read of a response object.
type responseObj struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	CreatedAt         int64           `json:"created_at"`
	Status            string          `json:"status"`
	CompletedAt       *int64          `json:"completed_at"`
	Error             json.RawMessage `json:"error"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Instructions       *string `json:"instructions"`
	MaxOutputTokens    *int64  `json:"max_output_tokens"`
	Model              string  `json:"model"`
	PreviousResponseID *string `json:"previous_response_id"`
	Store              bool    `json:"store"`
	Temperature        float64 `json:"temperature"`
	TopP               float64 `json:"top_p"`
	Output             []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []struct {
			Type        string            `json:"type"`
			Text        string            `json:"text"`
			Annotations []json.RawMessage `json:"annotations"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int64 `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens *int64 `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int64 `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens *int64 `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int64 `json:"total_tokens"`
	} `json:"usage"`
}

func (o *responseObj) text() string {
	var b strings.Builder
	for _, item := range o.Output {
		for _, c := range item.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

func decodeResponse(t testing.TB, body []byte) responseObj {
	t.Helper()
	var o responseObj
	if err := json.Unmarshal(body, &o); err != nil || o.Object != "response" {
		t.Fatalf("not a response object (%v): %s", err, body)
	}
	return o
}

// sseEvent is one Server-Sent Event: its event name and data.
type sseEvent struct {
	name string
	data []byte
}

// readSSE reads a stream into its events.
func readSSE(t testing.TB, body string) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.name != "" || cur.data != nil {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = []byte(strings.TrimPrefix(line, "data: "))
		default:
			t.Fatalf("unexpected line %q", line)
		}
	}
	if cur.name != "" || cur.data != nil {
		t.Fatalf("stream ends inside an event: %q", body)
	}
	return out
}

// streamedResponse checks a Responses API stream's shape (OpenAI's events
// in OpenAI's order, each named as its type, numbered from 0) and returns
// its text (the deltas joined) and the final event's response.
func streamedResponse(t testing.TB, body string) (string, json.RawMessage, responseObj) {
	t.Helper()
	evs := readSSE(t, body)
	var text strings.Builder
	var names []string
	var final json.RawMessage
	for i, e := range evs {
		var d struct {
			Type           string          `json:"type"`
			SequenceNumber *int            `json:"sequence_number"`
			Response       json.RawMessage `json:"response"`
			Delta          string          `json:"delta"`
			ItemID         string          `json:"item_id"`
		}
		if err := json.Unmarshal(e.data, &d); err != nil {
			t.Fatalf("event %d %q: %v", i, e.data, err)
		}
		if d.Type != e.name || d.SequenceNumber == nil || *d.SequenceNumber != i {
			t.Fatalf("event %d named %q: %s", i, e.name, e.data)
		}
		if n := len(names); n == 0 || names[n-1] != d.Type {
			names = append(names, d.Type)
		}
		if d.Type == "response.output_text.delta" {
			text.WriteString(d.Delta)
		}
		if d.Type == "response.completed" || d.Type == "response.incomplete" {
			final = d.Response
		}
	}
	end := "response.completed"
	if len(names) > 0 && names[len(names)-1] == "response.incomplete" {
		end = "response.incomplete"
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", end}
	if !slices.Equal(names, want) {
		t.Fatalf("events %q, want %q", names, want)
	}
	return text.String(), final, decodeResponse(t, final)
}

// twinAnswer is what a chat call and the same Responses API call must have
// alike.
type twinAnswer struct {
	status  int
	header  http.Header
	text    string
	usage   llm.Usage
	errType string
	errCode string
}

// callTwin sends body to endpoint through h, streamed or not, and reads the
// answer, whichever API it is.
func callTwin(t *testing.T, h http.Handler, endpoint, body string, stream bool) twinAnswer {
	t.Helper()
	if stream {
		body = withField(body, "stream", "true")
		if endpoint == llm.EndpointChat {
			body = withField(body, "stream_options", `{"include_usage":true}`)
		}
	}
	rec := post(t, h, endpoint, body)
	a := twinAnswer{status: rec.Code, header: rec.Header().Clone()}
	a.header.Del("Content-Length")
	if rec.Code != http.StatusOK {
		e := decodeErr(t, rec)
		a.errType = e.Error.Type
		if e.Error.Code != nil {
			a.errCode = *e.Error.Code
		}
		return a
	}
	var err error
	switch {
	case endpoint == llm.EndpointResponses && stream:
		var final json.RawMessage
		a.text, final, _ = streamedResponse(t, rec.Body.String())
		a.usage, err = llm.UsageOf(final)
	case endpoint == llm.EndpointResponses:
		o := decodeResponse(t, rec.Body.Bytes())
		a.text = o.text()
		a.usage, err = llm.UsageOf(rec.Body.Bytes())
	case stream:
		var text strings.Builder
		for _, e := range streamEvents(t, rec.Body.String()) {
			if e == "[DONE]" {
				continue
			}
			var ch struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
				Usage json.RawMessage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(e), &ch); err != nil {
				t.Fatal(err)
			}
			for _, c := range ch.Choices {
				text.WriteString(c.Delta.Content)
			}
			if len(ch.Choices) == 0 {
				a.usage, err = llm.UsageOf([]byte(e))
			}
		}
		a.text = text.String()
	default:
		var cc struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &cc)
		a.text = cc.Choices[0].Message.Content
		a.usage, err = llm.UsageOf(rec.Body.Bytes())
	}
	if err != nil {
		t.Fatal(err)
	}
	// The tokens are compared; a stream without its usage chunk says
	// nothing of its tier.
	a.usage.ServiceTier = ""
	return a
}

// A Responses API call is admitted, charged, refunded, limited, failed and
// answered exactly as the chat completion asking the same, in every counting
// mode, streamed or not: four simulators see the same calls (chat and
// Responses, each plain and streamed) and must answer alike, call by call
// (status, rate-limit headers, retry-after, text, usage as llm reads it), and
// end with the same stats and admission log.
func TestResponsesCountAsChat(t *testing.T) {
	t.Parallel()
	modes := map[string]sim.Config{
		"default":                  {},
		"refund":                   {Refund: true},
		"refund delayed":           {Refund: true, RefundDelay: 20 * time.Second},
		"prompt factor":            {PromptFactor: 1.7},
		"default max tokens":       {DefaultMaxTokens: 300},
		"model default max tokens": {Models: map[string]sim.Model{"m": {DefaultMaxTokens: 120}}},
		"context window":           {DefaultMaxTokens: 150, Models: map[string]sim.Model{"m": {ContextWindow: 200}}},
		"external":                 {External: sim.External{TPM: 1200, CallTokens: 100}},
		"headers at completion":    {HeadersAt: sim.HeadersAtCompletion, Refund: true},
		"limits only":              {RateHeaders: sim.HeadersLimitsOnly},
		"no rate headers":          {RateHeaders: sim.HeadersNone},
		"azure":                    {RateHeaders: sim.HeadersAzure},
		"azure ptu":                {RateHeaders: sim.HeadersAzurePTU},
		"anthropic":                {RateHeaders: sim.HeadersAnthropic},
		"header noise":             {HeaderNoise: 0.5},
		"retry-after seconds":      {RetryAfter: sim.RetryAfterSeconds},
		"retry-after date":         {RetryAfter: sim.RetryAfterDate},
		"no retry-after":           {RetryAfter: sim.RetryAfterNone},
		"short window bucket":      {ShortWindow: sim.ShortWindow{Period: time.Second, Kind: sim.WindowBucket}},
		"short window fixed":       {ShortWindow: sim.ShortWindow{Period: 2 * time.Second, Kind: sim.WindowFixed}},
		"short window sliding":     {ShortWindow: sim.ShortWindow{Period: time.Second, Kind: sim.WindowSliding}},
		"short window requests":    {ShortWindow: sim.ShortWindow{Period: time.Second, RequestsOnly: true}},
		"ramp":                     {Ramp: sim.Ramp{Growth: 1.5}},
		"faults":                   {Faults: sim.Faults{Rate429: 0.1, Rate500: 0.1, RetryAfter429: 3 * time.Second}},
		"omit usage":               {Faults: sim.Faults{OmitUsage: 0.4}},
		"shared buckets":           {SharedBuckets: true},
		"daily limits":             {Limits: sim.Limits{RPD: 25, TPD: 4000}},
		"completion at max":        {CompletionMin: 1, CompletionMax: 1},
		"echo":                     {Echo: true},
	}
	for name, cfg := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			type run struct {
				endpoint string
				stream   bool
			}
			runs := []run{{llm.EndpointChat, false}, {llm.EndpointResponses, false}, {llm.EndpointChat, true}, {llm.EndpointResponses, true}}
			answers := make([][]twinAnswer, len(runs))
			stats := make([]sim.Stats, len(runs))
			logs := make([][]sim.Admission, len(runs))
			for i, r := range runs {
				c := newClock()
				cfg := cfg
				if cfg.Limits == (sim.Limits{}) {
					cfg.Limits = sim.Limits{RPM: 60, TPM: 3000}
				}
				cfg.Now, cfg.Seed = c.Now, 11
				s := sim.New(cfg)
				h := s.Handler()
				for k := range 40 {
					model := "m"
					if k%5 == 4 {
						model = "n"
					}
					maxTokens := []int{16, 40, 0, 100, 250, 30, 400, 20}[k%8]
					var body string
					if r.endpoint == llm.EndpointChat {
						body = chat(model, maxTokens)
					} else {
						body = respBody(model, maxTokens)
					}
					if cfg.Echo {
						body = withField(body, "user", fmt.Sprintf(`"caller-%d"`, k))
					}
					answers[i] = append(answers[i], callTwin(t, h, r.endpoint, body, r.stream))
					c.Add(250 * time.Millisecond)
				}
				c.Add(time.Minute) // delayed refunds fall due
				stats[i], logs[i] = s.Stats(), s.Admissions(0)
			}
			if stats[1].Responses != stats[1].Requests || stats[3].Responses != stats[3].Requests || stats[0].Responses != 0 {
				t.Errorf("responses counted %d of %d and %d of %d requests; chat %d", stats[1].Responses, stats[1].Requests,
					stats[3].Responses, stats[3].Requests, stats[0].Responses)
			}
			admitted, limited := 0, 0
			for i := 1; i < len(runs); i++ {
				stats[i].Responses = 0
				if stats[i] != stats[0] {
					t.Errorf("%+v: stats %+v\nchat: %+v", runs[i], stats[i], stats[0])
				}
				if !slices.Equal(logs[i], logs[0]) {
					t.Errorf("%+v: the admission log differs from chat's", runs[i])
				}
			}
			for k := range answers[0] {
				// A stream's headers go with its first event, before the
				// call completes: compare streams with streams.
				for _, pair := range [][2]int{{0, 1}, {2, 3}, {0, 2}} {
					a, b := answers[pair[0]][k], answers[pair[1]][k]
					if pair == [2]int{0, 2} {
						if cfg.HeadersAt == sim.HeadersAtCompletion {
							continue
						}
						a.header, b.header = a.header.Clone(), b.header.Clone()
						a.header.Del("Content-Type")
						b.header.Del("Content-Type")
						a.header.Del("Cache-Control")
						b.header.Del("Cache-Control")
					}
					if a.status != b.status || !maps.EqualFunc(a.header, b.header, slices.Equal) || a.text != b.text ||
						!reflect.DeepEqual(a.usage, b.usage) || a.errType != b.errType || a.errCode != b.errCode {
						t.Errorf("call %d: %+v answered\n%+v\n%+v answered\n%+v", k, runs[pair[0]], a, runs[pair[1]], b)
					}
				}
				switch answers[1][k].status {
				case http.StatusOK:
					admitted++
				case http.StatusTooManyRequests:
					limited++
				}
			}
			if admitted == 0 {
				t.Errorf("no call admitted: the mode is not exercised")
			}
			if name == "default" && limited == 0 {
				t.Errorf("no call limited: the limits are not exercised")
			}
		})
	}
}

// A plain response is OpenAI's response object: one assistant message of
// output_text, the request's settings echoed, its usage what the simulator
// charged (the prompt at admission, plus max_output_tokens) and counted.
func TestResponsesPlain(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Seed: 4, CompletionMin: 0.2, CompletionMax: 0.6, PromptFactor: 1.3})
	h := s.Handler()
	body := `{"model":"m","instructions":"Answer briefly.","input":[{"role":"user","content":[{"type":"input_text","text":"What is a token bucket?"}]},` +
		`{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{\"q\":\"bucket\"}"},{"type":"function_call_output","call_id":"c1","output":"a rate limiter"}],` +
		`"max_output_tokens":200,"temperature":0.3,"metadata":{"k":"v"},"tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}}]}`
	p, err := llm.NewEstimator().Parse(llm.EndpointResponses, "", "", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	rec := post(t, h, llm.EndpointResponses, body)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("x-ratelimit-limit-tokens") != "" {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	o := decodeResponse(t, rec.Body.Bytes())
	wantPrompt := int64(float64(p.ContentTokens)*1.3 + 0.999999)
	u := o.Usage
	switch {
	case !strings.HasPrefix(o.ID, "resp_") || o.CreatedAt != c.Now().Unix() || o.Status != "completed" || o.CompletedAt == nil ||
		string(o.Error) != "null" || o.IncompleteDetails != nil || o.Model != "m" || !o.Store:
		t.Errorf("response %s", rec.Body)
	case o.Instructions == nil || *o.Instructions != "Answer briefly." || o.MaxOutputTokens == nil || *o.MaxOutputTokens != 200 ||
		o.PreviousResponseID != nil || o.Temperature != 0.3 || o.TopP != 1:
		t.Errorf("echoed settings %s", rec.Body)
	case len(o.Output) != 1 || o.Output[0].Type != "message" || !strings.HasPrefix(o.Output[0].ID, "msg_") || o.Output[0].Status != "completed" ||
		o.Output[0].Role != "assistant" || len(o.Output[0].Content) != 1 || o.Output[0].Content[0].Type != "output_text" ||
		o.Output[0].Content[0].Annotations == nil || o.text() == "":
		t.Errorf("output %s", rec.Body)
	case u == nil || u.InputTokens != wantPrompt || u.OutputTokens < 40 || u.OutputTokens > 120 || u.TotalTokens != u.InputTokens+u.OutputTokens ||
		u.InputTokensDetails.CachedTokens == nil || u.OutputTokensDetails.ReasoningTokens == nil:
		t.Errorf("usage %s, want %d input tokens", rec.Body, wantPrompt)
	}
	got, err := llm.UsageOf(rec.Body.Bytes())
	if err != nil || got.PromptTokens != u.InputTokens || got.CompletionTokens != u.OutputTokens || got.TotalTokens != u.TotalTokens {
		t.Errorf("llm reads %+v (%v)", got, err)
	}
	for _, key := range []string{`"metadata":{"k":"v"}`, `"tool_choice":"auto"`, `"truncation":"disabled"`, `"parallel_tool_calls":true`,
		`"text":{"format":{"type":"text"}`, `"service_tier":"default"`, `"background":false`, `"name":"lookup"`} {
		if !strings.Contains(rec.Body.String(), key) {
			t.Errorf("no %s in %s", key, rec.Body)
		}
	}
	st := s.Stats()
	if st.Requests != 1 || st.Responses != 1 || st.Admitted != 1 || st.TokensAdmitted != wantPrompt+200 ||
		st.PromptTokens != u.InputTokens || st.CompletionTokens != u.OutputTokens {
		t.Errorf("stats %+v", st)
	}
	if adm := s.Admissions(0); len(adm) != 1 || adm[0].Tokens != wantPrompt+200 || adm[0].Model != "m" {
		t.Errorf("log %+v", adm)
	}

	// Output that reaches max_output_tokens leaves the response incomplete.
	full := sim.New(sim.Config{Now: c.Now, CompletionMin: 1, CompletionMax: 1})
	rec = post(t, full.Handler(), llm.EndpointResponses, respBody("m", 16))
	o = decodeResponse(t, rec.Body.Bytes())
	if o.Status != "incomplete" || o.IncompleteDetails == nil || o.IncompleteDetails.Reason != "max_output_tokens" || o.CompletedAt != nil ||
		o.Output[0].Status != "incomplete" || o.Usage.OutputTokens != 16 {
		t.Errorf("at max_output_tokens: %s", rec.Body)
	}
	// Without max_output_tokens, the default max tokens is charged.
	dflt := sim.New(sim.Config{Now: c.Now, DefaultMaxTokens: 77, Models: map[string]sim.Model{"big": {DefaultMaxTokens: 999}}})
	post(t, dflt.Handler(), llm.EndpointResponses, respBody("m", 0))
	post(t, dflt.Handler(), llm.EndpointResponses, respBody("big", 0))
	if adm := dflt.Admissions(0); len(adm) != 2 || adm[0].Tokens != 2+77 || adm[1].Tokens != 2+999 {
		t.Errorf("default max tokens charged: %+v", adm)
	}
}

// A streamed response is OpenAI's events, in OpenAI's order, without
// [DONE]; the text of its deltas is the response's, and response.completed
// carries the whole response with the usage the simulator charged and
// counted, the very object GET /v1/responses/{id} returns.
func TestResponsesStream(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Seed: 8, CompletionMin: 0.5, CompletionMax: 0.9})
	h := s.Handler()
	body := withField(respBody("m", 300), "instructions", `"Be brief."`)
	p, err := llm.NewEstimator().Parse(llm.EndpointResponses, "", "", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	rec := post(t, h, llm.EndpointResponses, withField(body, "stream", "true"))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/event-stream" || rec.Header().Get("Content-Length") != "" ||
		rec.Header().Get("x-request-id") == "" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	if strings.Contains(rec.Body.String(), "[DONE]") {
		t.Error("a Responses API stream has no [DONE]")
	}
	text, final, o := streamedResponse(t, rec.Body.String())
	if text != o.text() || o.Status != "completed" || o.Usage == nil || *o.Instructions != "Be brief." {
		t.Errorf("deltas %q, final %s", text, final)
	}
	evs := readSSE(t, rec.Body.String())
	var created, added struct {
		Response struct {
			ID     string            `json:"id"`
			Status string            `json:"status"`
			Output []json.RawMessage `json:"output"`
			Usage  json.RawMessage   `json:"usage"`
		} `json:"response"`
		Item struct {
			ID      string            `json:"id"`
			Status  string            `json:"status"`
			Content []json.RawMessage `json:"content"`
		} `json:"item"`
	}
	_ = json.Unmarshal(evs[0].data, &created)
	_ = json.Unmarshal(evs[2].data, &added)
	if created.Response.ID != o.ID || created.Response.Status != "in_progress" || created.Response.Output == nil || len(created.Response.Output) != 0 ||
		string(created.Response.Usage) != "null" {
		t.Errorf("response.created %s", evs[0].data)
	}
	if added.Item.ID != o.Output[0].ID || added.Item.Status != "in_progress" || added.Item.Content == nil || len(added.Item.Content) != 0 {
		t.Errorf("response.output_item.added %s", evs[2].data)
	}
	for _, e := range evs[3:] {
		var d struct {
			ItemID       *string `json:"item_id"`
			OutputIndex  *int    `json:"output_index"`
			ContentIndex *int    `json:"content_index"`
		}
		_ = json.Unmarshal(e.data, &d)
		if e.name == "response.completed" || e.name == "response.output_item.done" {
			continue
		}
		if d.ItemID == nil || *d.ItemID != o.Output[0].ID || d.OutputIndex == nil || *d.OutputIndex != 0 || d.ContentIndex == nil || *d.ContentIndex != 0 {
			t.Errorf("%s", e.data)
		}
	}
	st := s.Stats()
	u, err := llm.UsageOf(final)
	if err != nil || u.PromptTokens != st.PromptTokens || u.CompletionTokens != st.CompletionTokens || st.TokensAdmitted != u.PromptTokens+300 ||
		u.PromptTokens != p.ContentTokens || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage %+v (%v), stats %+v", u, err, st)
	}
	get := do(t, h, http.MethodGet, "/v1/responses/"+o.ID, nil, "")
	if get.Code != http.StatusOK || compact(final) != compact(get.Body.Bytes()) {
		t.Errorf("GET %d %s\nstreamed %s", get.Code, get.Body, final)
	}

	// Output at max_output_tokens ends with response.incomplete.
	full := sim.New(sim.Config{Now: newClock().Now, CompletionMin: 1, CompletionMax: 1})
	rec = post(t, full.Handler(), llm.EndpointResponses, withField(respBody("m", 20), "stream", "true"))
	if _, _, o := streamedResponse(t, rec.Body.String()); o.Status != "incomplete" || o.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("at max_output_tokens: %+v", o)
	}
	// Without its usage (a fault), response.completed says null.
	bare := sim.New(sim.Config{Now: newClock().Now, Faults: sim.Faults{OmitUsage: 1}})
	rec = post(t, bare.Handler(), llm.EndpointResponses, withField(respBody("m", 20), "stream", "true"))
	if _, final, o := streamedResponse(t, rec.Body.String()); o.Usage != nil || !strings.Contains(string(final), `"usage":null`) {
		t.Errorf("omitted usage: %s", final)
	}
	rec = post(t, bare.Handler(), llm.EndpointResponses, respBody("m", 20))
	if o := decodeResponse(t, rec.Body.Bytes()); o.Usage != nil {
		t.Errorf("omitted usage: %s", rec.Body)
	}
}

// A stream's failures before it starts are plain HTTP errors in OpenAI's
// shape (429, 500, 400), and a hung call hangs.
func TestResponsesStreamFailures(t *testing.T) {
	t.Parallel()
	streamed := withField(respBody("m", 50), "stream", "true")
	for _, c := range []struct {
		name   string
		cfg    sim.Config
		body   string
		status int
		code   string
	}{
		{"429", sim.Config{Limits: sim.Limits{TPM: 10}}, streamed, http.StatusTooManyRequests, "rate_limit_exceeded"},
		{"spurious 429", sim.Config{Faults: sim.Faults{Rate429: 1}}, streamed, http.StatusTooManyRequests, "rate_limit_exceeded"},
		{"500", sim.Config{Faults: sim.Faults{Rate500: 1}}, streamed, http.StatusInternalServerError, ""},
		{"hang", sim.Config{Faults: sim.Faults{RateHang: 1, HangFor: 20 * time.Millisecond}}, streamed, http.StatusGatewayTimeout, ""},
		{"context window", sim.Config{Models: map[string]sim.Model{"m": {ContextWindow: 40}}}, streamed, http.StatusBadRequest, "context_length_exceeded"},
		{"stream not a boolean", sim.Config{}, withField(respBody("m", 50), "stream", `"yes"`), http.StatusBadRequest, ""},
		{"stream_options without stream", sim.Config{}, withField(respBody("m", 50), "stream_options", `{}`), http.StatusBadRequest, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.cfg.Now = newClock().Now
			s := sim.New(c.cfg)
			start := time.Now()
			rec := post(t, s.Handler(), llm.EndpointResponses, c.body)
			if rec.Code != c.status || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
				t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
			}
			e := decodeErr(t, rec)
			if code := e.Error.Code; c.code != "" && (code == nil || *code != c.code) || e.Error.Message == "" {
				t.Errorf("error %s", rec.Body)
			}
			if c.name == "hang" && time.Since(start) < 20*time.Millisecond {
				t.Errorf("a hung stream answered after %v", time.Since(start))
			}
		})
	}
}

// Bodies the Responses API refuses, with OpenAI's error shape; the context
// window counts the prompt and max_output_tokens as for chat.
func TestResponsesRefusals(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Models: map[string]sim.Model{"small": {ContextWindow: 100}}})
	h := s.Handler()
	for _, c := range []struct {
		body, param, code string
	}{
		{withField(respBody("m", 20), "background", "true"), "background", "unsupported_value"},
		{withField(respBody("m", 20), "temperature", `"hot"`), "temperature", "invalid_type"},
		{withField(respBody("m", 20), "tools", `{}`), "tools", "invalid_type"},
		{respBody("m", 8), "max_output_tokens", ""},
		{`{"model":"m"}`, "input", ""},
		{respBody("small", 99), "input", "context_length_exceeded"},
		{respBody("small", 0), "input", "context_length_exceeded"}, // the default 4096
	} {
		rec := post(t, h, llm.EndpointResponses, c.body)
		e := decodeErr(t, rec)
		if rec.Code != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != c.param ||
			(c.code != "") != (e.Error.Code != nil) || c.code != "" && *e.Error.Code != c.code {
			t.Errorf("%s: %d %s", c.body, rec.Code, rec.Body)
		}
	}
	rec := post(t, h, llm.EndpointResponses, respBody("small", 98))
	if rec.Code != http.StatusOK {
		t.Errorf("2 + 98 tokens in a window of 100: %d %s", rec.Code, rec.Body)
	}
	if e := decodeErr(t, post(t, h, llm.EndpointResponses, respBody("small", 99))); e.Error.Message != "Your input exceeds the context window of this model. Please adjust your input and try again." {
		t.Errorf("context message %q", e.Error.Message)
	}
	if st := s.Stats(); st.BadRequests != 8 || st.Requests != 1 || st.Responses != 1 {
		t.Errorf("stats %+v", st)
	}
}

// Stored responses: GET returns one as it was answered, DELETE removes it,
// cancel is OpenAI's 400 for a response not run in the background, an
// unknown id is a 404; "store": false keeps none, and only the last
// StoredResponses are kept.
func TestResponsesStored(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, StoredResponses: 3})
	h := s.Handler()
	var ids []string
	var bodies [][]byte
	for range 4 {
		rec := post(t, h, llm.EndpointResponses, respBody("m", 30))
		ids = append(ids, decodeResponse(t, rec.Body.Bytes()).ID)
		bodies = append(bodies, rec.Body.Bytes())
	}
	notFound := func(rec *httptest.ResponseRecorder, id string) {
		t.Helper()
		e := decodeErr(t, rec)
		if rec.Code != http.StatusNotFound || e.Error.Message != "Response with id '"+id+"' not found." || e.Error.Type != "invalid_request_error" {
			t.Errorf("%d %s", rec.Code, rec.Body)
		}
	}
	notFound(do(t, h, http.MethodGet, "/v1/responses/"+ids[0], nil, ""), ids[0]) // the oldest of 4, past 3
	for i := 1; i < 4; i++ {
		rec := do(t, h, http.MethodGet, "/v1/responses/"+ids[i], nil, "")
		if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), bodies[i]) {
			t.Errorf("GET %s: %d %s\nanswered %s", ids[i], rec.Code, rec.Body, bodies[i])
		}
	}
	rec := do(t, h, http.MethodPost, "/v1/responses/"+ids[1]+"/cancel", nil, "")
	if e := decodeErr(t, rec); rec.Code != http.StatusBadRequest || e.Error.Message != "Cannot cancel a synchronous response." {
		t.Errorf("cancel: %d %s", rec.Code, rec.Body)
	}
	notFound(do(t, h, http.MethodPost, "/v1/responses/resp_none/cancel", nil, ""), "resp_none")
	rec = do(t, h, http.MethodDelete, "/v1/responses/"+ids[2], nil, "")
	if rec.Code != http.StatusOK || compact(rec.Body.Bytes()) != `{"deleted":true,"id":"`+ids[2]+`","object":"response.deleted"}` {
		t.Errorf("delete: %d %s", rec.Code, rec.Body)
	}
	notFound(do(t, h, http.MethodGet, "/v1/responses/"+ids[2], nil, ""), ids[2])
	notFound(do(t, h, http.MethodDelete, "/v1/responses/"+ids[2], nil, ""), ids[2])

	rec = post(t, h, llm.EndpointResponses, withField(respBody("m", 30), "store", "false"))
	o := decodeResponse(t, rec.Body.Bytes())
	if o.Store {
		t.Errorf("store echoed %s", rec.Body)
	}
	notFound(do(t, h, http.MethodGet, "/v1/responses/"+o.ID, nil, ""), o.ID)

	// The key guards them as every other call.
	keyed := sim.New(sim.Config{Now: newClock().Now, APIKey: "sk-x"})
	if rec := do(t, keyed.Handler(), http.MethodGet, "/v1/responses/"+ids[1], nil, ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("without the key: %d", rec.Code)
	}
}

// previous_response_id continues a stored response: the provider counts the
// earlier turns (its input and output) in the follow-up's prompt, at
// admission and in usage, beyond what llmq counts of the body it sees; an
// unknown id is OpenAI's 400.
func TestResponsesPreviousResponseID(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Seed: 2, PromptFactor: 1.5})
	h := s.Handler()
	first := decodeResponse(t, post(t, h, llm.EndpointResponses, respBody("m", 100)).Body.Bytes())
	follow := withField(`{"model":"m","input":"and then?","max_output_tokens":50}`, "previous_response_id", strconv.Quote(first.ID))
	p, err := llm.NewEstimator().Parse(llm.EndpointResponses, "", "", []byte(follow))
	if err != nil {
		t.Fatal(err)
	}
	own := int64(float64(p.ContentTokens)*1.5 + 0.999999)
	rec := post(t, h, llm.EndpointResponses, follow)
	second := decodeResponse(t, rec.Body.Bytes())
	earlier := first.Usage.InputTokens + first.Usage.OutputTokens
	if second.Usage.InputTokens != own+earlier || second.PreviousResponseID == nil || *second.PreviousResponseID != first.ID {
		t.Errorf("follow-up input tokens %d, want %d of its own + %d earlier: %s", second.Usage.InputTokens, own, earlier, rec.Body)
	}
	if u, _ := llm.UsageOf(rec.Body.Bytes()); u.PromptTokens <= p.ContentTokens {
		t.Errorf("usage %+v, llmq counts %d", u, p.ContentTokens)
	}
	if adm := s.Admissions(0); adm[1].Tokens != own+earlier+50 {
		t.Errorf("charged %d, want %d", adm[1].Tokens, own+earlier+50)
	}
	// A chain adds every turn.
	third := decodeResponse(t, post(t, h, llm.EndpointResponses,
		withField(`{"model":"m","input":"and then?","max_output_tokens":50}`, "previous_response_id", strconv.Quote(second.ID))).Body.Bytes())
	if third.Usage.InputTokens != own+second.Usage.InputTokens+second.Usage.OutputTokens {
		t.Errorf("third turn input %d", third.Usage.InputTokens)
	}

	rec = post(t, h, llm.EndpointResponses, withField(respBody("m", 20), "previous_response_id", `"resp_gone"`))
	e := decodeErr(t, rec)
	if rec.Code != http.StatusBadRequest || e.Error.Message != "Previous response with id 'resp_gone' not found." || e.Error.Type != "invalid_request_error" ||
		e.Error.Param == nil || *e.Error.Param != "previous_response_id" || e.Error.Code == nil || *e.Error.Code != "previous_response_not_found" {
		t.Errorf("unknown previous: %d %s", rec.Code, rec.Body)
	}
	// A response not stored cannot be continued.
	unstored := decodeResponse(t, post(t, h, llm.EndpointResponses, withField(respBody("m", 20), "store", "false")).Body.Bytes())
	if rec := post(t, h, llm.EndpointResponses, withField(respBody("m", 20), "previous_response_id", strconv.Quote(unstored.ID))); rec.Code != http.StatusBadRequest {
		t.Errorf("continuing an unstored response: %d", rec.Code)
	}
	// The earlier turns count against the context window too.
	small := sim.New(sim.Config{Now: newClock().Now, Models: map[string]sim.Model{"m": {ContextWindow: 200}}})
	prev := decodeResponse(t, post(t, small.Handler(), llm.EndpointResponses, respBody("m", 150)).Body.Bytes())
	over := withField(respBody("m", 200-2-int(prev.Usage.InputTokens+prev.Usage.OutputTokens)+1), "previous_response_id", strconv.Quote(prev.ID))
	if rec := post(t, small.Handler(), llm.EndpointResponses, over); rec.Code != http.StatusBadRequest {
		t.Errorf("past the window with the earlier turns: %d %s", rec.Code, rec.Body)
	}
}

// A batch of /v1/responses lines is answered with response objects, as
// POST /v1/responses answers.
func TestResponsesBatch(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Now: c.Now, Models: map[string]sim.Model{"m": {ContextWindow: 100}}})
	h := s.Handler()
	var in strings.Builder
	for i := range 20 {
		fmt.Fprintf(&in, `{"custom_id":"r-%d","method":"POST","url":"/v1/responses","body":%s}`+"\n", i, respBody("m", 16+i))
	}
	in.WriteString(`{"custom_id":"too-long","method":"POST","url":"/v1/responses","body":` + respBody("m", 99) + "}\n")
	in.WriteString(`{"custom_id":"streamed","method":"POST","url":"/v1/responses","body":` + withField(respBody("m", 20), "stream", "true") + "}\n")
	b := createBatch(t, h, upload(t, h, []byte(in.String())).ID, llm.EndpointResponses)
	if b.Endpoint != "/v1/responses" {
		t.Fatalf("%+v", b)
	}
	c.Add(time.Second)
	b = getBatch(t, h, b.ID)
	if b.Status != "completed" || b.RequestCounts.Completed != 20 || b.RequestCounts.Failed != 2 {
		t.Fatalf("%+v", b)
	}
	lines := fileContent(t, h, b.OutputFileID)
	if len(lines) != 20 {
		t.Fatalf("%d output lines", len(lines))
	}
	for _, l := range lines {
		i, _ := strconv.Atoi(strings.TrimPrefix(l.CustomID, "r-"))
		o := decodeResponse(t, l.Response.Body)
		u, err := llm.UsageOf(l.Response.Body)
		if l.Response.StatusCode != 200 || o.Status == "" || o.text() == "" || err != nil || u.PromptTokens != 2 ||
			u.CompletionTokens < 1 || u.CompletionTokens > int64(16+i) || *o.MaxOutputTokens != int64(16+i) {
			t.Errorf("line %s: %v %s", l.CustomID, err, l.Response.Body)
		}
	}
	errs := fileContent(t, h, b.ErrorFileID)
	codes := map[string]string{}
	for _, l := range errs {
		var e apiErr
		_ = json.Unmarshal(l.Response.Body, &e)
		codes[l.CustomID] = e.Error.Message
		if l.CustomID == "too-long" && (e.Error.Code == nil || *e.Error.Code != "context_length_exceeded") {
			t.Errorf("too-long: %s", l.Response.Body)
		}
	}
	if len(codes) != 2 || codes["streamed"] != "Streaming is not supported in the Batch API." {
		t.Errorf("errors %v", codes)
	}
	// A line of another endpoint does not belong in a Responses batch.
	bad := createBatch(t, h, upload(t, h, []byte(chatLine("x", "m", "hi")+"\n")).ID, llm.EndpointResponses)
	c.Add(time.Second)
	if bad = getBatch(t, h, bad.ID); bad.Status != "failed" || bad.Errors == nil || bad.Errors.Data[0].Code != "invalid_url" {
		t.Errorf("a chat line in a Responses batch: %+v", bad)
	}
}

// Azure OpenAI's paths: the v1 API's /openai/v1/responses, and
// /openai/responses with an api-version, the deployment as the body's model;
// the stored responses under both.
func TestResponsesAzurePaths(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, APIKey: "azure-key"})
	h := s.Handler()
	call := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("api-key", "azure-key")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := call(http.MethodPost, "/openai/responses", respBody("my-deployment", 20)); rec.Code != http.StatusNotFound {
		t.Errorf("without api-version: %d", rec.Code)
	}
	var ids []string
	for _, path := range []string{"/openai/responses?api-version=2025-04-01-preview", "/openai/v1/responses"} {
		rec := call(http.MethodPost, path, respBody("my-deployment", 20))
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		o := decodeResponse(t, rec.Body.Bytes())
		if o.Model != "my-deployment" {
			t.Errorf("%s: model %q", path, o.Model)
		}
		ids = append(ids, o.ID)
		rec = call(http.MethodPost, path, withField(respBody("my-deployment", 20), "stream", "true"))
		streamedResponse(t, rec.Body.String())
	}
	for _, id := range ids {
		for _, path := range []string{"/openai/responses/" + id + "?api-version=2025-04-01-preview", "/openai/v1/responses/" + id, "/v1/responses/" + id} {
			if rec := call(http.MethodGet, path, ""); rec.Code != http.StatusOK || decodeResponse(t, rec.Body.Bytes()).ID != id {
				t.Errorf("GET %s: %d %s", path, rec.Code, rec.Body)
			}
		}
		if rec := call(http.MethodGet, "/openai/responses/"+id, ""); rec.Code != http.StatusNotFound {
			t.Errorf("GET without api-version: %d", rec.Code)
		}
		if rec := call(http.MethodPost, "/openai/v1/responses/"+id+"/cancel", ""); rec.Code != http.StatusBadRequest {
			t.Errorf("cancel: %d", rec.Code)
		}
	}
	if st := s.Stats(); st.Responses != 4 || st.Admitted != 4 {
		t.Errorf("stats %+v", st)
	}
}

// The official SDK reads the simulator's responses, plain and streamed,
// retrieves, continues, cancels and deletes them, on the real clock.
func TestResponsesOpenAISDK(t *testing.T) {
	t.Parallel()
	ts := sim.Start(sim.Config{APIKey: "sk-sdk", Latency: 5 * time.Millisecond, LatencyPerToken: 50 * time.Microsecond, Refund: true})
	defer ts.Close()
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	client := openai.NewClient(option.WithBaseURL(ts.BaseURL), option.WithAPIKey("sk-sdk"), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	params := responses.ResponseNewParams{
		Model:           "gpt-sim",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Say something about token buckets.")},
		Instructions:    openai.String("Answer briefly."),
		MaxOutputTokens: openai.Int(120),
	}
	r, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != responses.ResponseStatusCompleted && r.Status != responses.ResponseStatusIncomplete || r.OutputText() == "" ||
		r.Usage.InputTokens == 0 || r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens || r.MaxOutputTokens != 120 ||
		r.Instructions.OfString != "Answer briefly." || string(r.Model) != "gpt-sim" {
		t.Errorf("response %s", r.RawJSON())
	}

	stream := client.Responses.NewStreaming(ctx, params)
	var types []string
	var text strings.Builder
	var done responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.completed":
			done = ev.AsResponseCompleted().Response
		case "response.incomplete":
			done = ev.AsResponseIncomplete().Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if len(types) < 9 || types[0] != "response.created" || done.ID == "" || done.OutputText() != text.String() || done.Usage.OutputTokens == 0 {
		t.Errorf("events %q, response %s", types, done.RawJSON())
	}

	got, err := client.Responses.Get(ctx, done.ID, responses.ResponseGetParams{})
	if err != nil || got.ID != done.ID || got.OutputText() != done.OutputText() || got.Usage.InputTokens != done.Usage.InputTokens {
		t.Errorf("get: %v %s", err, got.RawJSON())
	}
	next, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("More.")},
		PreviousResponseID: openai.String(done.ID), MaxOutputTokens: openai.Int(16),
	})
	if err != nil || next.Usage.InputTokens <= done.Usage.TotalTokens || next.PreviousResponseID != done.ID {
		t.Errorf("continued: %v %s", err, next.RawJSON())
	}
	_, err = client.Responses.Cancel(ctx, done.ID)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Type != "invalid_request_error" {
		t.Errorf("cancel: %v", err)
	}
	if err := client.Responses.Delete(ctx, done.ID); err != nil {
		t.Errorf("delete: %v", err)
	}
	if _, err := client.Responses.Get(ctx, done.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("get after delete: %v", err)
	}
	_, err = client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("More.")}, PreviousResponseID: openai.String("resp_nope"),
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "previous_response_not_found" || apiErr.Param != "previous_response_id" {
		t.Errorf("unknown previous: %v", err)
	}
	if st := ts.Stats(); st.Responses != 3 || st.BadRequests != 1 || st.TokensRefunded == 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestResponsesConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (sim.Config{StoredResponses: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "StoredResponses") {
		t.Errorf("%v", err)
	}
}
