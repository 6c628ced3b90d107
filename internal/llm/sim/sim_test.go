package sim_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newClock() *testutil.Clock { return testutil.NewClock(time.Unix(1_700_000_000, 0)) }

func post(t testing.TB, h http.Handler, endpoint, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func chat(model string, maxTokens int) string {
	mt := ""
	if maxTokens > 0 {
		mt = `,"max_tokens":` + strconv.Itoa(maxTokens)
	}
	return `{"model":"` + model + `","messages":[{"role":"user","content":"hello world"}]` + mt + `}`
}

type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type apiErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeErr(t *testing.T, rec *httptest.ResponseRecorder) apiErr {
	t.Helper()
	var e apiErr
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("error body %q: %v", rec.Body, err)
	}
	return e
}

func header(rec *httptest.ResponseRecorder, k string) string { return rec.Header().Get(k) }

func TestRequestsPerMinute(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{RPM: 5}, Now: c.Now})
	h := s.Handler()
	for i := range 5 {
		rec := post(t, h, llm.EndpointChat, chat("m", 10))
		if rec.Code != 200 {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
		if got := header(rec, "x-ratelimit-remaining-requests"); got != strconv.Itoa(4-i) {
			t.Errorf("request %d: remaining %s", i, got)
		}
	}
	rec := post(t, h, llm.EndpointChat, chat("m", 10))
	if rec.Code != 429 {
		t.Fatalf("burst past capacity: %d", rec.Code)
	}
	// 5 per minute refill one request every 12s.
	e := decodeErr(t, rec)
	if e.Error.Type != "requests" || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" || e.Error.Param != nil ||
		!strings.Contains(e.Error.Message, "on requests per min (RPM): Limit 5, Used 5, Requested 1") {
		t.Errorf("429 body %s", rec.Body)
	}
	for k, want := range map[string]string{
		"x-ratelimit-limit-requests": "5", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "12s",
		"retry-after-ms": "12000", "retry-after": "12",
	} {
		if got := header(rec, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if rl := llm.ParseRateLimit(rec.Header()); rl.RetryAfter != 12*time.Second {
		t.Errorf("parsed %+v", rl)
	}
	c.Add(12*time.Second - time.Millisecond)
	if rec := post(t, h, llm.EndpointChat, chat("m", 10)); rec.Code != 429 || header(rec, "retry-after-ms") != "1" || header(rec, "retry-after") != "1" {
		t.Errorf("before the reset: %d retry-after-ms %s", rec.Code, header(rec, "retry-after-ms"))
	}
	c.Add(time.Millisecond)
	if rec := post(t, h, llm.EndpointChat, chat("m", 10)); rec.Code != 200 {
		t.Errorf("at the reset: %d", rec.Code)
	}
	st := s.Stats()
	if st.Admitted != 6 || st.RateLimited != 2 || st.Requests != 8 {
		t.Errorf("stats %+v", st)
	}
}

func TestTokensPerMinuteChargesMaxTokensAndRefunds(t *testing.T) {
	t.Parallel()
	for _, refund := range []bool{true, false} {
		t.Run(fmt.Sprint("refund=", refund), func(t *testing.T) {
			t.Parallel()
			c := newClock()
			s := sim.New(sim.Config{Limits: sim.Limits{TPM: 1000}, Now: c.Now, Refund: refund, Seed: 1})
			h := s.Handler()
			// "hello world" is 2 tokens: the request asks 2 + 300.
			rec := post(t, h, llm.EndpointChat, chat("m", 300))
			if rec.Code != 200 || header(rec, "x-ratelimit-remaining-tokens") != "698" {
				t.Fatalf("%d remaining %s", rec.Code, header(rec, "x-ratelimit-remaining-tokens"))
			}
			var out struct {
				Usage usage `json:"usage"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &out)
			if out.Usage.PromptTokens != 2 {
				t.Errorf("prompt tokens %d", out.Usage.PromptTokens)
			}
			unused := 300 - out.Usage.CompletionTokens
			adm := s.Admissions(0)
			if len(adm) != 1 || adm[0].Tokens != 302 {
				t.Fatalf("log %+v", adm)
			}
			if refund && (adm[0].Refunded != unused || !adm[0].RefundedAt.Equal(c.Now())) {
				t.Errorf("refund %d at %v, want %d", adm[0].Refunded, adm[0].RefundedAt, unused)
			}
			// The next request sees the refund (the clock has not moved).
			rec = post(t, h, llm.EndpointChat, chat("m", 10))
			want := 698 - 12
			if refund {
				want += int(unused)
			}
			if got := header(rec, "x-ratelimit-remaining-tokens"); got != strconv.Itoa(want) {
				t.Errorf("remaining after second %s, want %d", got, want)
			}
		})
	}
}

func TestTokens429IsConsistentWithBucket(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 600}, Now: c.Now})
	h := s.Handler()
	if rec := post(t, h, llm.EndpointChat, chat("m", 498)); rec.Code != 200 { // 500 tokens
		t.Fatal(rec.Code)
	}
	// 100 left; 200 asked: 100 missing at 10 tokens/s is 10s.
	rec := post(t, h, llm.EndpointChat, chat("m", 198))
	if rec.Code != 429 {
		t.Fatal(rec.Code)
	}
	e := decodeErr(t, rec)
	if e.Error.Type != "tokens" || !strings.Contains(e.Error.Message, "on tokens per min (TPM): Limit 600, Used 500, Requested 200. Please try again in 10s.") {
		t.Errorf("message %q", e.Error.Message)
	}
	if header(rec, "x-ratelimit-reset-tokens") != "10s" || header(rec, "retry-after-ms") != "10000" || header(rec, "retry-after") != "10" ||
		header(rec, "x-ratelimit-remaining-tokens") != "100" {
		t.Errorf("headers %v", rec.Header())
	}
	// The announced wait is exactly enough.
	c.Add(10 * time.Second)
	if rec := post(t, h, llm.EndpointChat, chat("m", 198)); rec.Code != 200 {
		t.Errorf("after the announced wait: %d", rec.Code)
	}
	// The 429 charged nothing.
	if st := s.Stats(); st.TokensAdmitted != 700 || st.RateLimited != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestRequestTooLarge(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 100}, Now: newClock().Now})
	rec := post(t, s.Handler(), llm.EndpointChat, chat("m", 200))
	e := decodeErr(t, rec)
	if rec.Code != 429 || !strings.Contains(e.Error.Message, "Request too large for m") || header(rec, "retry-after") != "" {
		t.Errorf("%d %s %v", rec.Code, rec.Body, rec.Header())
	}
}

func TestDailyLimits(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{RPM: 100, RPD: 2}, Now: c.Now})
	h := s.Handler()
	post(t, h, llm.EndpointChat, chat("m", 1))
	post(t, h, llm.EndpointChat, chat("m", 1))
	rec := post(t, h, llm.EndpointChat, chat("m", 1))
	if rec.Code != 429 || !strings.Contains(decodeErr(t, rec).Error.Message, "requests per day (RPD)") || header(rec, "retry-after") != "43200" {
		t.Errorf("%d %s retry-after %s", rec.Code, rec.Body, header(rec, "retry-after"))
	}
}

func TestPerModelAndSharedBuckets(t *testing.T) {
	t.Parallel()
	per := sim.New(sim.Config{Limits: sim.Limits{RPM: 1}, Models: map[string]sim.Model{"big": {Limits: sim.Limits{RPM: 3}}}, Now: newClock().Now})
	codes := func(s *sim.Server, models ...string) string {
		var out []string
		for _, m := range models {
			out = append(out, strconv.Itoa(post(t, s.Handler(), llm.EndpointChat, chat(m, 1)).Code))
		}
		return strings.Join(out, " ")
	}
	if got := codes(per, "a", "a", "b", "big", "big", "big", "big"); got != "200 429 200 200 200 200 429" {
		t.Errorf("per model: %s", got)
	}
	shared := sim.New(sim.Config{Limits: sim.Limits{RPM: 2}, SharedBuckets: true, Now: newClock().Now})
	if got := codes(shared, "a", "b", "c"); got != "200 200 429" {
		t.Errorf("shared: %s", got)
	}
}

func TestSetLimits(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{RPM: 1}, Now: c.Now})
	h := s.Handler()
	post(t, h, llm.EndpointChat, chat("m", 1))
	if rec := post(t, h, llm.EndpointChat, chat("m", 1)); rec.Code != 429 {
		t.Fatal(rec.Code)
	}
	s.SetLimits(0, 0) // no limits
	if rec := post(t, h, llm.EndpointChat, chat("m", 1)); rec.Code != 200 {
		t.Errorf("after lifting limits: %d", rec.Code)
	}
	s.SetLimits(60, 0)
	// The bucket starts empty-ish where it was, and refills at 1/s.
	if rec := post(t, h, llm.EndpointChat, chat("m", 1)); rec.Code != 200 {
		t.Errorf("after setting 60 rpm: %d %s", rec.Code, rec.Body)
	}
	if got := s.Limits("m"); got.RPM != 60 {
		t.Errorf("limits %+v", got)
	}
}

func TestFaultRatesAreSeededAndFree(t *testing.T) {
	t.Parallel()
	run := func(seed uint64) (string, sim.Stats) {
		s := sim.New(sim.Config{Seed: seed, Faults: sim.Faults{Rate429: 0.1, Rate500: 0.1, RateHang: 0.05, HangFor: time.Nanosecond}, Now: newClock().Now})
		h := s.Handler()
		var b strings.Builder
		for range 2000 {
			rec := post(t, h, llm.EndpointChat, chat("m", 10))
			b.WriteString(strconv.Itoa(rec.Code))
			if rec.Code == 429 && (header(rec, "retry-after-ms") != "1000" || decodeErr(t, rec).Error.Code == nil) {
				t.Errorf("spurious 429: %v %s", rec.Header(), rec.Body)
			}
			if rec.Code == 500 && decodeErr(t, rec).Error.Type != "server_error" {
				t.Errorf("500 body %s", rec.Body)
			}
		}
		return b.String(), s.Stats()
	}
	seq1, st := run(42)
	seq2, _ := run(42)
	seq3, _ := run(43)
	if seq1 != seq2 {
		t.Error("the same seed gave different outcomes")
	}
	if seq1 == seq3 {
		t.Error("different seeds gave the same outcomes")
	}
	// Within 4 standard deviations of the configured rates.
	near := func(name string, got int64, p float64) {
		mean, sd := 2000*p, math.Sqrt(2000*p*(1-p))
		if math.Abs(float64(got)-mean) > 4*sd {
			t.Errorf("%s: %d, want about %.0f", name, got, mean)
		}
	}
	near("spurious 429", st.Spurious429, 0.1)
	near("500", st.Errors500, 0.1)
	near("hung", st.Hung, 0.05)
	if st.Admitted+st.Spurious429+st.Errors500+st.Hung != 2000 || st.RateLimited != 0 {
		t.Errorf("stats %+v", st)
	}
	// Faults charge nothing: 12 tokens per admitted request, no more.
	if st.TokensAdmitted != 12*st.Admitted {
		t.Errorf("tokens admitted %d for %d requests", st.TokensAdmitted, st.Admitted)
	}
}

func TestSpurious429DoesNotConsume(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{RPM: 10}, Faults: sim.Faults{Rate429: 1}, Now: c.Now})
	for range 20 {
		if rec := post(t, s.Handler(), llm.EndpointChat, chat("m", 1)); rec.Code != 429 || header(rec, "x-ratelimit-remaining-requests") != "10" {
			t.Fatalf("%d remaining %s", rec.Code, header(rec, "x-ratelimit-remaining-requests"))
		}
	}
	if err := s.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if rec := post(t, s.Handler(), llm.EndpointChat, chat("m", 1)); rec.Code != 200 {
			t.Fatalf("request %d after faults cleared: %d", i, rec.Code)
		}
	}
	if err := s.SetFaults(sim.Faults{Rate429: 0.8, Rate500: 0.5}); err == nil {
		t.Error("rates over 1 accepted")
	}
}

func TestUsageIsRealistic(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Seed: 9, Now: newClock().Now, DefaultMaxTokens: 50})
	h := s.Handler()
	e := llm.NewEstimator()
	sawLength, sawStop := false, false
	for i := range 200 {
		max := 1 + i%40
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":"Tell me something."}],"max_tokens":` + strconv.Itoa(max) + `,"n":2}`
		if i%10 == 0 {
			body = `{"model":"gpt-4o","messages":[{"role":"user","content":"Tell me something."}]}`
			max = 50
		}
		rec := post(t, h, llm.EndpointChat, body)
		var out struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			Model   string `json:"model"`
			Choices []struct {
				Index   int `json:"index"`
				Message struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		if out.ID == "" || out.Object != "chat.completion" || out.Created == 0 || out.Model != "gpt-4o" || header(rec, "x-request-id") == "" {
			t.Errorf("response %s", rec.Body)
		}
		var completion int64
		for _, ch := range out.Choices {
			// The content is about as many tokens as the choice used.
			n, _ := e.PromptTokens(llm.EndpointEmbeddings, "gpt-4o", "", []byte(`{"model":"gpt-4o","input":`+strconv.Quote(ch.Message.Content)+`}`))
			completion += n
			if ch.Message.Role != "assistant" || ch.Message.Content == "" {
				t.Errorf("choice %+v", ch)
			}
			switch ch.FinishReason {
			case "length":
				sawLength = true
			case "stop":
				sawStop = true
			default:
				t.Errorf("finish_reason %q", ch.FinishReason)
			}
		}
		wantChoices := 2
		if i%10 == 0 {
			wantChoices = 1
		}
		u := out.Usage
		if len(out.Choices) != wantChoices || u.PromptTokens != 4 || u.CompletionTokens < int64(wantChoices) || u.CompletionTokens > int64(max*wantChoices) ||
			u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("usage %+v with max %d, %d choices", u, max, len(out.Choices))
		}
		if completion < u.CompletionTokens/2 || completion > 2*u.CompletionTokens+2 {
			t.Errorf("text of %d tokens for %d completion tokens", completion, u.CompletionTokens)
		}
	}
	if !sawLength || !sawStop {
		t.Errorf("finish reasons: length %v, stop %v", sawLength, sawStop)
	}
}

func TestEmbeddings(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now})
	h := s.Handler()
	type resp struct {
		Object string `json:"object"`
		Data   []struct {
			Object    string          `json:"object"`
			Index     int             `json:"index"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Model string `json:"model"`
		Usage usage  `json:"usage"`
	}
	var out resp
	rec := post(t, h, llm.EndpointEmbeddings, `{"model":"text-embedding-3-small","input":["hello world","hello"]}`)
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || len(out.Data) != 2 || out.Object != "list" || out.Usage.PromptTokens != 3 || out.Usage.TotalTokens != 3 {
		t.Fatalf("%v %s", err, rec.Body)
	}
	var v []float64
	_ = json.Unmarshal(out.Data[1].Embedding, &v)
	var norm float64
	for _, x := range v {
		norm += x * x
	}
	if len(v) != 64 || math.Abs(norm-1) > 1e-3 || out.Data[1].Index != 1 || out.Data[1].Object != "embedding" {
		t.Errorf("embedding of %d, norm %v", len(v), norm)
	}
	out = resp{}
	rec = post(t, h, llm.EndpointEmbeddings, `{"model":"text-embedding-3-small","input":[1,2,3],"dimensions":16,"encoding_format":"base64"}`)
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	var b64 string
	if len(out.Data) != 1 || json.Unmarshal(out.Data[0].Embedding, &b64) != nil {
		t.Fatalf("%s", rec.Body)
	}
	if raw, err := base64.StdEncoding.DecodeString(b64); err != nil || len(raw) != 64 {
		t.Errorf("base64 of %d bytes: %v", len(raw), err)
	}
	if rec := post(t, h, llm.EndpointEmbeddings, `{"model":"e","input":"x","dimensions":0}`); rec.Code != 400 {
		t.Errorf("dimensions 0: %d", rec.Code)
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{APIKey: "sk-sim-1234567890", OnlyKnownModels: true, Models: map[string]sim.Model{"m": {}}, Now: newClock().Now})
	h := s.Handler()
	do := func(auth, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, llm.EndpointChat, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := do("", chat("m", 1)); rec.Code != 401 || *decodeErr(t, rec).Error.Code != "invalid_api_key" {
		t.Errorf("no key: %d %s", rec.Code, rec.Body)
	}
	if rec := do("sk-wrong", chat("m", 1)); rec.Code != 401 {
		t.Errorf("wrong key: %d", rec.Code)
	}
	if rec := do("sk-sim-1234567890", chat("other", 1)); rec.Code != 404 || *decodeErr(t, rec).Error.Code != "model_not_found" {
		t.Errorf("unknown model: %d %s", rec.Code, rec.Body)
	}
	rec := do("sk-sim-1234567890", `{"model":"m","messages":[]}`)
	if e := decodeErr(t, rec); rec.Code != 400 || e.Error.Param == nil || *e.Error.Param != "messages" || e.Error.Type != "invalid_request_error" {
		t.Errorf("bad body: %d %s", rec.Code, rec.Body)
	}
	if rec := do("sk-sim-1234567890", chat("m", 1)); rec.Code != 200 {
		t.Errorf("good request: %d %s", rec.Code, rec.Body)
	}
	if st := s.Stats(); st.Unauthorized != 2 || st.BadRequests != 2 || st.Requests != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestMaxInWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	log := []sim.Admission{
		{Time: at(0), Requests: 1, Tokens: 100, Outcome: sim.Admitted, Refunded: 60, RefundedAt: at(1)},
		{Time: at(5), Requests: 1, Tokens: 100, Outcome: sim.Admitted},
		{Time: at(6), Requests: 1, Tokens: 500, Outcome: sim.RateLimited},
		{Time: at(9.9), Requests: 1, Tokens: 100, Outcome: sim.Admitted},
		{Time: at(10), Requests: 1, Tokens: 100, Outcome: sim.Admitted},
		{Time: at(30), Requests: 1, Tokens: 1000, Outcome: sim.Admitted},
	}
	cases := []struct {
		w    time.Duration
		want sim.WindowMax
	}{
		// [0,10) holds 3 admitted requests, tokens 100-60+100+100 = 240;
		// [5,15) holds 300 tokens net.
		{10 * time.Second, sim.WindowMax{Requests: 3, Tokens: 1000}},
		{5 * time.Second, sim.WindowMax{Requests: 2, Tokens: 1000}}, // [5,10) excludes 10
		{time.Second, sim.WindowMax{Requests: 2, Tokens: 1000}},
		{100 * time.Second, sim.WindowMax{Requests: 5, Tokens: 1340}},
	}
	for _, c := range cases {
		if got := sim.MaxInWindow(log, c.w); got != c.want {
			t.Errorf("w=%v: %+v, want %+v", c.w, got, c.want)
		}
	}
	without := log[:5]
	if got := sim.MaxInWindow(without, 10*time.Second); got != (sim.WindowMax{Requests: 3, Tokens: 300}) {
		t.Errorf("without the big one: %+v", got)
	}
	if got := sim.MaxInWindow(nil, time.Second); got != (sim.WindowMax{}) {
		t.Errorf("empty: %+v", got)
	}
	l := sim.Limits{RPM: 60, TPM: 6000, RPD: 1000}
	if got := l.MaxAdmissible(30 * time.Second); got != (sim.WindowMax{Requests: 90, Tokens: 9000}) {
		t.Errorf("MaxAdmissible %+v", got)
	}
	if got := (sim.Limits{}).MaxAdmissible(time.Minute); got.Requests != math.MaxInt64 {
		t.Errorf("unlimited %+v", got)
	}
}

// TestNeverPastLimits pushes random traffic with a moving clock and checks the
// invariant tests of llmq rely on: no window holds more than the buckets allow.
func TestNeverPastLimits(t *testing.T) {
	t.Parallel()
	c := newClock()
	limits := sim.Limits{RPM: 30, TPM: 3000}
	s := sim.New(sim.Config{Limits: limits, Now: c.Now, Seed: 5})
	h := s.Handler()
	r := rand.New(rand.NewPCG(7, 8))
	for range 3000 {
		c.Add(time.Duration(r.IntN(400)) * time.Millisecond)
		post(t, h, llm.EndpointChat, chat([]string{"a", "b"}[r.IntN(2)], 1+r.IntN(150)))
	}
	log := s.Admissions(0)
	for _, m := range []string{"a", "b"} {
		entries := sim.OfModel(log, m)
		for _, w := range []time.Duration{time.Second, 10 * time.Second, time.Minute, 5 * time.Minute} {
			got, bound := sim.MaxInWindow(entries, w), limits.MaxAdmissible(w)
			if got.Requests > bound.Requests || got.Tokens > bound.Tokens {
				t.Errorf("model %s, window %v: admitted %+v, bound %+v", m, w, got, bound)
			}
		}
	}
	if st := s.Stats(); st.RateLimited == 0 || st.Admitted == 0 {
		t.Errorf("traffic did not reach the limits: %+v", st)
	}
}

func TestEarlyArrivals(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	log := []sim.Admission{
		{Seq: 1, Time: at(0), Model: "a", Outcome: sim.Admitted},
		{Seq: 2, Time: at(1), Model: "a", Outcome: sim.RateLimited, RetryAfter: 10 * time.Second},
		{Seq: 3, Time: at(2), Model: "b", Outcome: sim.Admitted},    // another model's buckets
		{Seq: 4, Time: at(5), Model: "a", Outcome: sim.RateLimited}, // early, and announces nothing
		{Seq: 5, Time: at(11), Model: "a", Outcome: sim.Admitted},   // at the reset
		{Seq: 6, Time: at(12), Model: "a", Outcome: sim.Spurious429, RetryAfter: time.Second},
		{Seq: 7, Time: at(12.5), Model: "a", Outcome: sim.Admitted},
	}
	var seqs []int64
	for _, a := range sim.EarlyArrivals(log, false) {
		seqs = append(seqs, a.Seq)
	}
	if fmt.Sprint(seqs) != "[4 7]" {
		t.Errorf("early %v", seqs)
	}
	if n := len(sim.EarlyArrivals(log, true)); n != 3 {
		t.Errorf("shared: %d early", n)
	}
}

func TestAdmissionLogRing(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{LogSize: 3, Now: newClock().Now})
	for range 5 {
		post(t, s.Handler(), llm.EndpointChat, chat("m", 1))
	}
	all := s.Admissions(0)
	if len(all) != 3 || all[0].Seq != 3 || all[2].Seq != 5 {
		t.Errorf("log %+v", all)
	}
	if after := s.Admissions(4); len(after) != 1 || after[0].Seq != 5 {
		t.Errorf("after 4: %+v", after)
	}
	if st := s.Stats(); st.LogDropped != 2 {
		t.Errorf("dropped %d", st.LogDropped)
	}
}

func TestControlAPI(t *testing.T) {
	t.Parallel()
	ts := sim.Start(sim.Config{Limits: sim.Limits{RPM: 100}, Models: map[string]sim.Model{"listed": {}}})
	defer ts.Close()
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	call := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, "")
		buf := make([]byte, 1<<16)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String()
	}
	if code, _ := call("POST", "/v1/chat/completions", chat("m", 5)); code != 200 {
		t.Fatal(code)
	}
	if code, body := call("GET", "/v1/models", ""); code != 200 || !strings.Contains(body, `"id":"listed"`) || !strings.Contains(body, `"id":"m"`) {
		t.Errorf("models %d %s", code, body)
	}
	code, body := call("GET", "/sim/stats?window=60s", "")
	var rep sim.StatsReport
	if err := json.Unmarshal([]byte(body), &rep); code != 200 || err != nil || rep.Admitted != 1 || rep.Windows["m"].Admitted.Requests != 1 || rep.Windows["m"].Allowed.Requests != 200 {
		t.Errorf("stats %d %s", code, body)
	}
	if code, _ := call("GET", "/sim/stats?window=soon", ""); code != 400 {
		t.Errorf("bad window: %d", code)
	}
	code, body = call("GET", "/sim/admissions?after=0", "")
	var adm []sim.Admission
	if err := json.Unmarshal([]byte(body), &adm); code != 200 || err != nil || len(adm) != 1 || adm[0].Outcome != sim.Admitted || adm[0].Tokens != 7 {
		t.Errorf("admissions %d %s", code, body)
	}
	if code, _ := call("POST", "/sim/limits", `{"model":"m","rpm":1}`); code != 204 {
		t.Errorf("limits %d", code)
	}
	// The bucket keeps what it holds, up to its new capacity of one.
	if code, _ := call("POST", "/v1/chat/completions", chat("m", 5)); code != 200 {
		t.Errorf("first after limits: %d", code)
	}
	if code, _ := call("POST", "/v1/chat/completions", chat("m", 5)); code != 429 {
		t.Errorf("second after limits: %d", code)
	}
	if code, _ := call("POST", "/sim/faults", `{"rate_500":1}`); code != 204 {
		t.Errorf("faults %d", code)
	}
	if code, _ := call("POST", "/v1/chat/completions", chat("x", 5)); code != 500 {
		t.Errorf("after faults: %d", code)
	}
	if code, _ := call("POST", "/sim/faults", `{"rate_500":2}`); code != 400 {
		t.Errorf("bad faults: %d", code)
	}
	if code, _ := call("POST", "/sim/reset", ``); code != 204 {
		t.Errorf("reset %d", code)
	}
	if st := ts.Stats(); st.Requests != 0 || len(ts.Admissions(0)) != 0 {
		t.Errorf("after reset %+v", st)
	}
}

func TestLatencyAndClose(t *testing.T) {
	t.Parallel()
	ts := sim.Start(sim.Config{Latency: 30 * time.Millisecond})
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	start := time.Now()
	resp, err := client.Post(ts.BaseURL+"/chat/completions", "application/json", strings.NewReader(chat("m", 5)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if el := time.Since(start); resp.StatusCode != 200 || el < 30*time.Millisecond {
		t.Errorf("%d after %v", resp.StatusCode, el)
	}
	// A hung request ends when the server closes.
	if err := ts.SetFaults(sim.Faults{RateHang: 1}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := client.Post(ts.BaseURL+"/chat/completions", "application/json", strings.NewReader(chat("m", 5)))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for ts.Stats().Hung == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ts.Close()
	<-done
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	bad := []sim.Config{
		{Limits: sim.Limits{RPM: -1}},
		{Faults: sim.Faults{Rate429: 1.5}},
		{Faults: sim.Faults{Rate429: 0.6, Rate500: 0.6}},
		{CompletionMin: 0.8, CompletionMax: 0.5},
		{EmbeddingDim: -3},
		{Models: map[string]sim.Model{"x": {DefaultMaxTokens: -1}}},
	}
	for i, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("config %d accepted", i)
		}
	}
	if err := (sim.Config{}).Validate(); err != nil {
		t.Error(err)
	}
}

func BenchmarkServeChat(b *testing.B) {
	s := sim.New(sim.Config{Limits: sim.Limits{RPM: 1 << 40, TPM: 1 << 50}, LogSize: 1 << 16})
	h := s.Handler()
	body := `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Summarize the plot of Hamlet in one sentence."}],"max_tokens":64}`
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, llm.EndpointChat, strings.NewReader(body))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 200 {
				b.Fatal(rec.Code)
			}
		}
	})
}

func BenchmarkServeEmbeddings(b *testing.B) {
	s := sim.New(sim.Config{LogSize: 1 << 16})
	h := s.Handler()
	body := `{"model":"text-embedding-3-small","input":["one sentence to embed","another one"]}`
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, llm.EndpointEmbeddings, strings.NewReader(body))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 200 {
				b.Fatal(rec.Code)
			}
		}
	})
}

func TestEchoStartsContentWithUserField(t *testing.T) {
	t.Parallel()
	ts := sim.Start(sim.Config{Echo: true})
	defer ts.Close()
	body := `{"model":"gpt-4o-mini","user":"job-42","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(ts.BaseURL+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if len(out.Choices) != 1 || !strings.HasPrefix(out.Choices[0].Message.Content, "job-42 ") {
		t.Fatalf("content = %+v, want it to start with the user field", out.Choices)
	}
}
