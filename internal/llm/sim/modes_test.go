package sim_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// begin runs Begin and fails the test unless the request was admitted.
func begin(t *testing.T, s *sim.Server, maxTokens int) *sim.Exchange {
	t.Helper()
	x := s.Begin(llm.EndpointChat, []byte(chat("m", maxTokens)))
	if !x.Admitted() {
		status, _, body := x.Finish()
		t.Fatalf("not admitted: %d %s", status, body)
	}
	return x
}

func remainingTokens(t *testing.T, x *sim.Exchange) int {
	t.Helper()
	_, h, _ := x.Finish()
	n, err := strconv.Atoi(h.Get("x-ratelimit-remaining-tokens"))
	if err != nil {
		t.Fatalf("remaining tokens %q: %v", h.Get("x-ratelimit-remaining-tokens"), err)
	}
	return n
}

func usageOf(t *testing.T, x *sim.Exchange) usage {
	t.Helper()
	_, _, body := x.Finish()
	var out struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	return out.Usage
}

// By default, as OpenAI documents its limits, max_tokens stays charged when a
// call completes: the bucket regains only its refill.
func TestDefaultKeepsMaxTokensCharged(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 6000}, Now: c.Now, Seed: 1, CompletionMin: 0.1, CompletionMax: 0.1})
	x := begin(t, s, 1000) // 2 + 1000
	if got := remainingTokens(t, x); got != 4998 {
		t.Fatalf("remaining after admission %d, want 4998", got)
	}
	c.Add(time.Second) // 100 tokens of refill
	x.Finish()
	if st := s.Stats(); st.TokensRefunded != 0 || st.TokensAdmitted != 1002 {
		t.Errorf("stats %+v", st)
	}
	if got := remainingTokens(t, begin(t, s, 8)); got != 4998+100-10 {
		t.Errorf("remaining %d, want %d: the unused 900 tokens must stay charged", got, 4998+100-10)
	}
}

// With Refund, the unused part comes back at completion, or RefundDelay
// after it, and not before.
func TestRefundAtCompletionAndDelayed(t *testing.T) {
	t.Parallel()
	for _, delay := range []time.Duration{0, 2 * time.Second} {
		t.Run(delay.String(), func(t *testing.T) {
			t.Parallel()
			c := newClock()
			s := sim.New(sim.Config{Limits: sim.Limits{TPM: 6000}, Now: c.Now, Seed: 1, Refund: true, RefundDelay: delay,
				CompletionMin: 0.1, CompletionMax: 0.1})
			x := begin(t, s, 1000)
			u := usageOf(t, x) // Finish at admission time
			unused := int(1000 - u.CompletionTokens)
			if unused != 900 {
				t.Fatalf("completion %d", u.CompletionTokens)
			}
			before := remainingTokens(t, begin(t, s, 8))
			want := 4998 - 10
			if delay == 0 {
				want += unused
			}
			if before != want {
				t.Errorf("remaining right after completion %d, want %d", before, want)
			}
			c.Add(delay)
			// 900 of the first call, 7 of the second (10 asked, 1 used)
			if after := s.Stats().TokensRefunded; after != int64(unused)+7 {
				t.Errorf("refunded %d after the delay, want %d", after, unused+7)
			}
			adm := s.Admissions(0)
			if adm[0].Refunded != int64(unused) || !adm[0].RefundedAt.Equal(c.Now()) {
				t.Errorf("log %+v", adm[0])
			}
		})
	}
}

// PromptFactor makes the provider count prompts with another tokenizer, at
// admission and in usage alike.
func TestPromptFactor(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 100_000}, Now: c.Now, PromptFactor: 1.6})
	body := `{"model":"m","messages":[{"role":"user","content":"` + words(100) + `"}],"max_tokens":10}`
	p, err := llm.NewEstimator().Parse(llm.EndpointChat, "", "", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	est := p.ContentTokens
	x := s.Begin(llm.EndpointChat, []byte(body))
	_, _, out := x.Finish()
	var resp struct {
		Usage usage `json:"usage"`
	}
	_ = json.Unmarshal(out, &resp)
	want := int64(float64(est)*1.6 + 0.999999)
	if resp.Usage.PromptTokens != want {
		t.Errorf("usage prompt tokens %d, want %d (1.6 x %d)", resp.Usage.PromptTokens, want, est)
	}
	if st := s.Stats(); st.TokensAdmitted != want+10 {
		t.Errorf("charged %d, want %d", st.TokensAdmitted, want+10)
	}
}

func words(n int) string {
	b := make([]byte, 0, 6*n)
	for i := range n {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, "water"...)
	}
	return string(b)
}

// The external application takes its share of the account continuously, in
// calls of CallTokens, ahead of the simulator's own clients, and never more
// than the buckets hold.
func TestExternalLoad(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 6000, RPM: 1000}, Now: c.Now, External: sim.External{TPM: 1800, CallTokens: 100}})
	begin(t, s, 998).Finish() // starts the model's buckets: 1000 used
	for range 60 {
		c.Add(time.Second)
		s.Stats()
	}
	st := s.Stats()
	if st.ExternalTokens < 1700 || st.ExternalTokens > 1800 || st.ExternalRequests != st.ExternalTokens/100 {
		t.Errorf("external used %d tokens in %d calls in a minute, want 1,700-1,800 in calls of 100", st.ExternalTokens, st.ExternalRequests)
	}
	// Drained by a large call, the external application waits for room,
	// and the headers show the room it leaves.
	s2 := sim.New(sim.Config{Limits: sim.Limits{TPM: 6000}, Now: c.Now, External: sim.External{TPM: 6000, CallTokens: 500}})
	begin(t, s2, 5998).Finish()
	c.Add(time.Second) // 100 tokens refilled; the external application wants 100
	if st := s2.Stats(); st.ExternalTokens != 0 {
		t.Errorf("external took %d tokens of a bucket holding 100", st.ExternalTokens)
	}
	c.Add(4 * time.Second)
	if st := s2.Stats(); st.ExternalTokens != 500 {
		t.Errorf("external took %d tokens once the bucket held 500, want 500", st.ExternalTokens)
	}
	c.Add(time.Second)
	if got := remainingTokens(t, begin(t, s2, 8)); got != 90 {
		t.Errorf("remaining %d, want 90 (100 refilled since the external call, 10 asked)", got)
	}
}

// With HeadersAtCompletion the remaining counts are those of the moment the
// answer is sent: refill and refunds since admission included.
func TestHeadersAtCompletion(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := sim.New(sim.Config{Limits: sim.Limits{TPM: 6000}, Now: c.Now, Refund: true, HeadersAt: sim.HeadersAtCompletion,
		CompletionMin: 0.1, CompletionMax: 0.1})
	x := begin(t, s, 1000)
	c.Add(500 * time.Millisecond) // 50 tokens of refill
	if got := remainingTokens(t, x); got != 4998+50+900 {
		t.Errorf("remaining at completion %d, want %d", got, 4998+50+900)
	}
}

// RateHeaders leaves out what some OpenAI-compatible servers do not send;
// retry-after stays on 429s (TestRateHeaderShapes has the other shapes).
func TestRateHeaderModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{sim.HeadersAll, sim.HeadersLimitsOnly, sim.HeadersNone} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := sim.New(sim.Config{Limits: sim.Limits{TPM: 100, RPM: 10}, Now: newClock().Now, RateHeaders: mode})
			_, h, _ := begin(t, s, 50).Finish()
			hasLimit, hasRemaining := h.Get("x-ratelimit-limit-tokens") != "", h.Get("x-ratelimit-remaining-tokens") != ""
			if hasLimit != (mode != sim.HeadersNone) || hasRemaining != (mode == sim.HeadersAll) ||
				(h.Get("x-ratelimit-reset-requests") != "") != (mode == sim.HeadersAll) {
				t.Errorf("headers %v", h)
			}
			status, h, _ := s.Begin(llm.EndpointChat, []byte(chat("m", 50))).Finish()
			if status != 429 || h.Get("retry-after-ms") == "" {
				t.Errorf("429 %d without retry-after: %v", status, h)
			}
		})
	}
}

func TestModeConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  sim.Config
		want string
	}{
		{sim.Config{RefundDelay: -1}, "RefundDelay"},
		{sim.Config{PromptFactor: -1}, "PromptFactor"},
		{sim.Config{External: sim.External{TPM: -5}}, "External"},
		{sim.Config{HeadersAt: "later"}, "HeadersAt"},
		{sim.Config{RateHeaders: "some"}, "RateHeaders"},
		{sim.Config{HeaderNoise: 1.5}, "HeaderNoise"},
		{sim.Config{RetryAfter: "soon"}, "RetryAfter"},
		{sim.Config{ShortWindow: sim.ShortWindow{Period: -time.Second}}, "ShortWindow.Period"},
		{sim.Config{ShortWindow: sim.ShortWindow{Period: 2 * time.Minute}}, "ShortWindow.Period"},
		{sim.Config{ShortWindow: sim.ShortWindow{Period: time.Second, Kind: "round"}}, "ShortWindow.Kind"},
		{sim.Config{Ramp: sim.Ramp{Growth: -1}}, "Ramp"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
}
