package sim_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// try sends a chat request of 2 + maxTokens tokens and returns its status and
// headers.
func try(s *sim.Server, maxTokens int) (int, http.Header) {
	status, h, _ := s.Begin(llm.EndpointChat, []byte(chat("m", maxTokens))).Finish()
	return status, h
}

// A provider that also enforces its limits over a short window admits only
// the window's share at once, whatever room its minute buckets show, and
// says so in the 429 while its remaining counts still show the minute's
// room.
func TestShortWindowKinds(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{sim.WindowBucket, sim.WindowFixed, sim.WindowSliding} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			c := newClock() // on a whole second: a fixed window starts now
			// 600 RPM over 1 s: 10 requests a window; tokens unbounded
			s := sim.New(sim.Config{Limits: sim.Limits{RPM: 600}, Now: c.Now,
				ShortWindow: sim.ShortWindow{Period: time.Second, Kind: kind}})
			for i := range 10 {
				if status, _ := try(s, 1); status != 200 {
					t.Fatalf("request %d: %d, want 200 within the window's 10", i, status)
				}
			}
			status, h := try(s, 1)
			if status != 429 {
				t.Fatalf("11th request in one second: %d, want 429", status)
			}
			if got := h.Get("x-ratelimit-remaining-requests"); got != "590" {
				t.Errorf("remaining requests %q, want the minute's 590", got)
			}
			ms, _ := strconv.Atoi(h.Get("retry-after-ms"))
			wantMS := map[string]int{sim.WindowBucket: 100, sim.WindowFixed: 1000, sim.WindowSliding: 1000}[kind]
			if ms != wantMS {
				t.Errorf("retry-after-ms %d, want %d", ms, wantMS)
			}
			if st := s.Stats(); st.RateLimited != 1 || st.RateLimitedShort != 1 || st.Admitted != 10 {
				t.Errorf("stats %+v, want 10 admitted and 1 refused by the short window", st)
			}
			// half a window later: the bucket has 5, the fixed and sliding
			// windows none
			c.Add(500 * time.Millisecond)
			admitted := 0
			for range 10 {
				if status, _ := try(s, 1); status == 200 {
					admitted++
				}
			}
			want := map[string]int{sim.WindowBucket: 5, sim.WindowFixed: 0, sim.WindowSliding: 0}[kind]
			if admitted != want {
				t.Errorf("after 500ms %d admitted, want %d", admitted, want)
			}
			// a second after the first burst the fixed window is new and the
			// sliding one has let the burst go
			c.Add(500 * time.Millisecond)
			admitted = 0
			for range 12 {
				if status, _ := try(s, 1); status == 200 {
					admitted++
				}
			}
			want = map[string]int{sim.WindowBucket: 5, sim.WindowFixed: 10, sim.WindowSliding: 10}[kind]
			if admitted != want {
				t.Errorf("after 1s %d admitted, want %d", admitted, want)
			}
		})
	}
}

// Tokens are counted over the short window too, unless RequestsOnly; a
// request larger than the window's share goes into an untouched window.
func TestShortWindowTokens(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 60_000}, Now: c.Now,
		ShortWindow: sim.ShortWindow{Period: time.Second}})
	if status, _ := try(s, 598); status != 200 { // 600 of the second's 1,000
		t.Fatalf("first: %d", status)
	}
	if status, h := try(s, 598); status != 429 || h.Get("x-ratelimit-remaining-tokens") != "59400" {
		t.Fatalf("second: %d %v, want 429 with the minute's 59400 remaining", status, h)
	}
	c.Add(time.Second)
	if status, _ := try(s, 1498); status != 200 { // larger than a window, into a full one
		t.Fatalf("a request above the window's share into a full window: %d", status)
	}
	c.Add(200 * time.Millisecond)
	if status, _ := try(s, 8); status != 429 {
		t.Fatalf("the window is in debt after the large request: %d", status)
	}

	r := sim.New(sim.Config{Limits: sim.Limits{TPM: 60_000, RPM: 600}, Now: c.Now,
		ShortWindow: sim.ShortWindow{Period: time.Second, RequestsOnly: true}})
	if status, _ := try(r, 5000); status != 200 {
		t.Fatalf("RequestsOnly counted tokens over the window: %d", status)
	}
}

// The header shapes of Azure OpenAI and Anthropic, and nonsense in their
// place.
func TestRateHeaderShapes(t *testing.T) {
	t.Parallel()
	c := newClock()
	limits := sim.Limits{RPM: 10, TPM: 6000}

	az := sim.New(sim.Config{Limits: limits, Now: c.Now, RateHeaders: sim.HeadersAzure})
	_, h := try(az, 1998)
	if h.Get("x-ratelimit-remaining-requests") != "9" || h.Get("x-ratelimit-remaining-tokens") != "4000" ||
		h.Get("x-ratelimit-limit-tokens") != "" || h.Get("x-ratelimit-reset-tokens") != "" {
		t.Errorf("azure: %v", h)
	}
	try(az, 1998)
	try(az, 1998)
	status, h := try(az, 1998)
	if status != 429 || h.Get("x-ms-retry-after-ms") == "" || h.Get("x-ms-retry-after-ms") != h.Get("retry-after-ms") {
		t.Errorf("azure 429: %d %v", status, h)
	}

	ptu := sim.New(sim.Config{Limits: limits, Now: c.Now, RateHeaders: sim.HeadersAzurePTU})
	if _, h := try(ptu, 1498); h.Get("azure-openai-deployment-utilization") != "25.0%" || h.Get("x-ratelimit-remaining-tokens") != "" {
		t.Errorf("azure PTU: %v", h)
	}

	an := sim.New(sim.Config{Limits: limits, Now: c.Now, RateHeaders: sim.HeadersAnthropic})
	_, h = try(an, 1498)
	if h.Get("anthropic-ratelimit-tokens-limit") != "6000" || h.Get("anthropic-ratelimit-tokens-remaining") != "4000" ||
		h.Get("anthropic-ratelimit-requests-remaining") != "9" || h.Get("x-ratelimit-limit-tokens") != "" {
		t.Errorf("anthropic: %v", h)
	}
	reset, err := time.Parse(time.RFC3339, h.Get("anthropic-ratelimit-tokens-reset"))
	if err != nil || reset.Before(c.Now().Add(15*time.Second)) || reset.After(c.Now().Add(17*time.Second)) {
		t.Errorf("anthropic reset %q (%v), want the bucket full again in 15 s", h.Get("anthropic-ratelimit-tokens-reset"), err)
	}

	noisy := sim.New(sim.Config{Limits: limits, Now: c.Now, RateHeaders: sim.HeadersAzure, HeaderNoise: 1})
	_, h = try(noisy, 1)
	if v := h.Get("x-ratelimit-remaining-tokens"); v != "0" && v != "-1" {
		t.Errorf("noise: remaining %q, want 0 or -1", v)
	}
}

// A 429's wait in each form a provider may send it, or none.
func TestRetryAfterForms(t *testing.T) {
	t.Parallel()
	for _, form := range []string{sim.RetryAfterMS, sim.RetryAfterSeconds, sim.RetryAfterDate, sim.RetryAfterNone} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			s := sim.New(sim.Config{Limits: sim.Limits{RPM: 1}, Now: c.Now, RetryAfter: form, RateHeaders: sim.HeadersNone})
			try(s, 1)
			status, h := try(s, 1)
			if status != 429 {
				t.Fatalf("status %d", status)
			}
			ms, ra := h.Get("retry-after-ms"), h.Get("retry-after")
			switch form {
			case sim.RetryAfterMS:
				if ms != "60000" || ra != "60" {
					t.Errorf("retry-after-ms %q retry-after %q", ms, ra)
				}
			case sim.RetryAfterSeconds:
				if ms != "" || ra != "60" {
					t.Errorf("retry-after-ms %q retry-after %q", ms, ra)
				}
			case sim.RetryAfterDate:
				d, err := http.ParseTime(ra)
				if ms != "" || err != nil || d.Before(c.Now().Add(time.Minute)) || d.After(c.Now().Add(61*time.Second)) {
					t.Errorf("retry-after-ms %q retry-after %q (%v)", ms, ra, err)
				}
			case sim.RetryAfterNone:
				if ms != "" || ra != "" {
					t.Errorf("retry-after-ms %q retry-after %q", ms, ra)
				}
			}
		})
	}
}

// A ramp admits a quarter of a window's share after a quiet spell, then lets
// usage grow by its factor from one window to the next.
func TestRamp(t *testing.T) {
	t.Parallel()
	c := newClock() // a multiple of 10 s: a ramp window starts now
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 60_000}, Now: c.Now, Ramp: sim.Ramp{Growth: 2}})
	sent := func() (admitted int) {
		for range 40 {
			if status, _ := try(s, 998); status == 200 {
				admitted++
			}
			c.Add(100 * time.Millisecond)
		}
		return admitted
	}
	// 10,000 tokens a window at the TPM; the floor is 2,500: 2 calls of
	// 1,000 tokens and the one that crosses it is refused
	if got := sent(); got != 2 {
		t.Fatalf("first window: %d admitted, want 2", got)
	}
	c.Add(6 * time.Second) // the next window
	if got := sent(); got != 4 {
		t.Fatalf("second window: %d admitted, want 4 (twice the first)", got)
	}
	if st := s.Stats(); st.RateLimitedShort != st.RateLimited || st.RateLimited == 0 {
		t.Errorf("stats %+v", st)
	}
}

// OmitUsage leaves the usage out of that share of answers, streamed or
// not, drawn from the seed.
func TestOmitUsage(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Faults: sim.Faults{OmitUsage: 0.2}, Seed: 3})
	without := 0
	for range 500 {
		_, _, body := s.Begin(llm.EndpointChat, []byte(chat("m", 5))).Finish()
		if !strings.Contains(string(body), `"usage"`) {
			without++
		}
	}
	if without < 70 || without > 130 {
		t.Errorf("%d of 500 answers without usage, want about 100", without)
	}
	all := sim.New(sim.Config{Now: newClock().Now, Faults: sim.Faults{OmitUsage: 1}})
	rec := post(t, all.Handler(), llm.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`)
	if strings.Contains(rec.Body.String(), `"usage":{`) || !strings.Contains(rec.Body.String(), "[DONE]") {
		t.Errorf("stream without usage: %s", rec.Body.String())
	}
}

// StreamError fails that share of streams after their first content, as a
// provider's server error midway does: a chat stream ends with an error
// chunk, a Responses API stream with an error or a response.failed event
// (both are sent), neither with its usage or end. Non-streamed answers are
// whole.
func TestStreamError(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Now: newClock().Now, Faults: sim.Faults{StreamError: 0.3}, Seed: 5})
	h := s.Handler()
	failed := 0
	for range 200 {
		body := post(t, h, llm.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`).Body.String()
		events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
		last := events[len(events)-1]
		switch {
		case strings.HasPrefix(last, `data: {"error":{"message":"The server had an error`):
			failed++
			// the role chunk, one content chunk, the error
			if len(events) != 3 || strings.Contains(body, `"usage":{`) || strings.Contains(body, "[DONE]") {
				t.Fatalf("failed stream: %s", body)
			}
		case last != "data: [DONE]" || !strings.Contains(body, `"usage":{`):
			t.Fatalf("whole stream: %s", body)
		}
	}
	t.Logf("%d of 200 streams failed", failed)
	if failed < 40 || failed > 80 {
		t.Errorf("%d of 200 streams failed, want about 60", failed)
	}
	if rec := post(t, h, llm.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"usage"`) {
		t.Errorf("a non-streamed answer: %d %s", rec.Code, rec.Body)
	}

	all := sim.New(sim.Config{Now: newClock().Now, Faults: sim.Faults{StreamError: 1}, Seed: 5})
	ends := map[string]int{}
	for range 40 {
		body := post(t, all.Handler(), llm.EndpointResponses, `{"model":"m","input":"hi","max_output_tokens":40,"stream":true}`).Body.String()
		events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
		name, data, _ := strings.Cut(strings.TrimPrefix(events[len(events)-1], "event: "), "\ndata: ")
		var e struct {
			Type     string `json:"type"`
			Code     string `json:"code"`
			Sequence int    `json:"sequence_number"`
			Response struct {
				Status string `json:"status"`
				Error  struct {
					Code string `json:"code"`
				} `json:"error"`
				Usage json.RawMessage `json:"usage"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &e); err != nil || e.Type != name || e.Sequence != len(events)-1 || len(events) != 6 {
			t.Fatalf("failed Responses stream (%v): %s", err, body)
		}
		switch {
		case name == "error" && e.Code == "server_error":
		case name == "response.failed" && e.Response.Status == "failed" && e.Response.Error.Code == "server_error" && string(e.Response.Usage) == "null":
		default:
			t.Fatalf("failed Responses stream: %s", body)
		}
		ends[name]++
	}
	if ends["error"] < 8 || ends["response.failed"] < 8 {
		t.Errorf("ends %v, want both kinds", ends)
	}
}
