package sim_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm/sim"
)

// streamEvents reads a recorded SSE answer into its events' data.
func streamEvents(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// A streamed request is admitted, counted, refunded and answered exactly as
// the same request unstreamed, in every counting mode: the two simulators
// below see the same requests, one streamed, and must end alike.
func TestStreamCountsAsUnstreamed(t *testing.T) {
	t.Parallel()
	modes := map[string]sim.Config{
		"default":         {},
		"refund":          {Refund: true},
		"refund delayed":  {Refund: true, RefundDelay: time.Minute},
		"prompt factor":   {PromptFactor: 1.4},
		"external":        {External: sim.External{TPM: 30000, CallTokens: 100}},
		"headers at end":  {HeadersAt: sim.HeadersAtCompletion, Refund: true},
		"limits only":     {RateHeaders: sim.HeadersLimitsOnly},
		"no rate headers": {RateHeaders: sim.HeadersNone},
	}
	for name, cfg := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run := func(stream bool) (sim.Stats, []string, []string) {
				c := newClock()
				cfg := cfg
				cfg.Limits, cfg.Now, cfg.Seed = sim.Limits{TPM: 60000, RPM: 600}, c.Now, 7
				s := sim.New(cfg)
				h := s.Handler()
				var contents, remaining []string
				for i := range 5 {
					body := chat("m", 50+i*10)
					if stream {
						body = strings.TrimSuffix(body, "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
					}
					rec := post(t, h, "/v1/chat/completions", body)
					if rec.Code != http.StatusOK {
						t.Fatalf("status %d: %s", rec.Code, rec.Body)
					}
					remaining = append(remaining, rec.Header().Get("x-ratelimit-remaining-tokens"))
					if !stream {
						var cc struct {
							Choices []struct {
								Message struct{ Content string } `json:"message"`
							} `json:"choices"`
							Usage json.RawMessage `json:"usage"`
						}
						if err := json.Unmarshal(rec.Body.Bytes(), &cc); err != nil {
							t.Fatal(err)
						}
						contents = append(contents, cc.Choices[0].Message.Content+"|"+compact(cc.Usage))
						continue
					}
					if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
						t.Fatalf("content type %q", ct)
					}
					ev := streamEvents(t, rec.Body.String())
					if len(ev) < 4 || ev[len(ev)-1] != "[DONE]" {
						t.Fatalf("events %q", ev)
					}
					var text strings.Builder
					var use json.RawMessage
					for _, e := range ev[:len(ev)-1] {
						var ch struct {
							Object  string `json:"object"`
							Choices []struct {
								Delta struct{ Content string } `json:"delta"`
							} `json:"choices"`
							Usage json.RawMessage `json:"usage"`
						}
						if err := json.Unmarshal([]byte(e), &ch); err != nil || ch.Object != "chat.completion.chunk" {
							t.Fatalf("chunk %q: %v", e, err)
						}
						for _, c := range ch.Choices {
							text.WriteString(c.Delta.Content)
						}
						if len(ch.Choices) == 0 {
							use = ch.Usage
						}
					}
					contents = append(contents, text.String()+"|"+compact(use))
				}
				return s.Stats(), contents, remaining
			}
			st1, c1, r1 := run(false)
			st2, c2, r2 := run(true)
			if st1 != st2 {
				t.Errorf("stats unstreamed %+v\nstreamed %+v", st1, st2)
			}
			for i := range c1 {
				if cfg.HeadersAt == sim.HeadersAtCompletion && r1[i] != r2[i] {
					// A stream's headers go with its first chunk, before the
					// call completes: they count it without its refund.
					a, _ := strconv.Atoi(r1[i])
					b, _ := strconv.Atoi(r2[i])
					if b > a {
						t.Errorf("request %d: streamed remaining %d above the unstreamed %d", i, b, a)
					}
					r2[i] = r1[i]
				}
				if c1[i] != c2[i] || r1[i] != r2[i] {
					t.Errorf("request %d: unstreamed %q (remaining %s), streamed %q (remaining %s)", i, c1[i], r1[i], c2[i], r2[i])
				}
			}
		})
	}
}

func compact(raw json.RawMessage) string {
	var v any
	_ = json.Unmarshal(raw, &v)
	b, _ := json.Marshal(v)
	return string(b)
}

// A stream without include_usage has no usage chunk; stream_options without
// stream, and stream on embeddings, are 400s; a 429 is a JSON error, not a
// stream.
func TestStreamShapes(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{Limits: sim.Limits{RPM: 1}, Now: newClock().Now})
	h := s.Handler()
	rec := post(t, h, "/v1/chat/completions", strings.TrimSuffix(chat("m", 20), "}")+`,"stream":true}`)
	for _, e := range streamEvents(t, rec.Body.String()) {
		if strings.Contains(e, `"usage":{`) {
			t.Fatalf("usage chunk without include_usage: %s", e)
		}
	}
	for _, body := range []string{
		strings.TrimSuffix(chat("m", 20), "}") + `,"stream_options":{"include_usage":true}}`,
		strings.TrimSuffix(chat("m", 20), "}") + `,"stream":"yes"}`,
	} {
		if rec := post(t, h, "/v1/chat/completions", body); rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d", body, rec.Code)
		}
	}
	if rec := post(t, h, "/v1/embeddings", `{"model":"e","input":"x","stream":true}`); rec.Code != http.StatusBadRequest {
		t.Errorf("embeddings stream: %d", rec.Code)
	}
	rec = post(t, h, "/v1/chat/completions", strings.TrimSuffix(chat("m", 20), "}")+`,"stream":true}`)
	if rec.Code != http.StatusTooManyRequests || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		t.Fatalf("over the limit: %d %v", rec.Code, rec.Header())
	}
}
