package sim

import (
	"bytes"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// Handler serves the OpenAI API (POST /v1/chat/completions, POST
// /v1/embeddings, GET /v1/models) and the simulator's control API:
//
//	GET  /sim/stats[?window=60s]  Stats; with window, per model the most
//	                              requests and tokens admitted in any window of
//	                              that length and the most the limits allow
//	GET  /sim/admissions[?after=N] the admission log after entry N
//	POST /sim/limits  {"model"?, "rpm", "tpm", "rpd", "tpd"}
//	POST /sim/faults  {"rate_429", "rate_500", "rate_hang", "hang_for": "5s", "retry_after_429": "1s"}
//	POST /sim/reset   clears stats and log, refills buckets
//
// The control API has no authentication: the simulator is for loopback use.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+llm.EndpointChat, s.serveCompletion)
	mux.HandleFunc("POST "+llm.EndpointEmbeddings, s.serveCompletion)
	mux.HandleFunc("GET /v1/models", s.serveModels)
	mux.HandleFunc("GET /sim/stats", s.serveStats)
	mux.HandleFunc("GET /sim/admissions", s.serveAdmissions)
	mux.HandleFunc("POST /sim/limits", s.serveSetLimits)
	mux.HandleFunc("POST /sim/faults", s.serveSetFaults)
	mux.HandleFunc("POST /sim/reset", func(w http.ResponseWriter, _ *http.Request) {
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// apiError writes OpenAI's error shape.
func apiError(w http.ResponseWriter, status int, message, typ, param, code string) {
	var b bytes.Buffer
	b.WriteString(`{"error":{"message":`)
	appendJSONString(&b, message)
	b.WriteString(`,"type":`)
	appendJSONString(&b, typ)
	b.WriteString(`,"param":`)
	appendNullable(&b, param)
	b.WriteString(`,"code":`)
	appendNullable(&b, code)
	b.WriteString("}}\n")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func appendJSONString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s)
	b.Write(enc)
}

func appendNullable(b *bytes.Buffer, s string) {
	if s == "" {
		b.WriteString("null")
		return
	}
	appendJSONString(b, s)
}

// draw returns the k-th uniform number in [0, 1) of request n: a hash of the
// seed, n and k, so runs with one seed repeat whatever the interleaving of
// the draws of concurrent requests.
func (s *Server) draw(n, k uint64) float64 {
	x := s.cfg.Seed + n*0x9E3779B97F4A7C15 + k*0xD1B54A32D192ED03
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// The draws of one request.
const (
	drawFault = iota
	drawLatency
	drawCompletion // + choice index
)

func (s *Server) serveCompletion(w http.ResponseWriter, r *http.Request) {
	s.flight.Add(1)
	defer s.flight.Add(-1)
	if !s.authorized(r) {
		s.count(func(st *Stats) { st.Unauthorized++ })
		apiError(w, http.StatusUnauthorized, "Incorrect API key provided.", "invalid_request_error", "", "invalid_api_key")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		apiError(w, http.StatusBadRequest, "The request body could not be read: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	endpoint := r.URL.Path
	p, err := s.est.Parse(endpoint, "", "", body)
	if err != nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		var ir *llm.InvalidRequestError
		if errors.As(err, &ir) {
			apiError(w, http.StatusBadRequest, ir.Message, "invalid_request_error", ir.Param, "")
		} else {
			apiError(w, http.StatusBadRequest, err.Error(), "invalid_request_error", "", "")
		}
		return
	}
	if s.cfg.OnlyKnownModels {
		s.mu.Lock()
		_, ok := s.models[p.Model]
		s.mu.Unlock()
		if !ok {
			s.count(func(st *Stats) { st.BadRequests++ })
			apiError(w, http.StatusNotFound, "The model `"+p.Model+"` does not exist or you do not have access to it.", "invalid_request_error", "", "model_not_found")
			return
		}
	}

	var emb embeddingOptions
	if endpoint == llm.EndpointEmbeddings {
		if emb, err = s.embeddingOptions(body); err != nil {
			s.count(func(st *Stats) { st.BadRequests++ })
			apiError(w, http.StatusBadRequest, err.Error(), "invalid_request_error", "dimensions", "")
			return
		}
	}

	n := s.arrival.Add(1)
	tokens := p.ContentTokens
	maxTokens := int64(0)
	if endpoint == llm.EndpointChat {
		maxTokens = p.MaxTokens
		if maxTokens == 0 {
			maxTokens = s.defaultMaxTokens(p.Model)
		}
		tokens += maxTokens * p.N
	}
	now := s.cfg.Now()
	v := s.admit(p.Model, tokens, now, s.draw(n, drawFault))
	setRateHeaders(w.Header(), &v, n, s.cfg.Seed)
	switch v.outcome {
	case RateLimited, Spurious429:
		apiError(w, http.StatusTooManyRequests, v.message, v.kind, "", "rate_limit_exceeded")
		return
	case Error500:
		apiError(w, http.StatusInternalServerError, "The server had an error while processing your request. Sorry about that!", "server_error", "", "")
		return
	case Hung:
		s.hang(w, r, v.hangFor)
		return
	}

	// Admitted: draw the answer, take the time, give back what was unused.
	var completion int64
	var resp []byte
	if endpoint == llm.EndpointChat {
		completions := make([]int64, p.N)
		for i := range completions {
			completions[i] = s.completionTokens(maxTokens, s.draw(n, drawCompletion+uint64(i)))
			completion += completions[i]
		}
		resp = s.chatResponse(n, now, p.Model, p.ContentTokens, maxTokens, completions, s.echo(body))
	} else {
		resp = s.embeddingResponse(n, p, emb)
	}
	// A client that gives up does not get its tokens back sooner: the
	// provider finishes the work, so the refund comes at the same time.
	ok := s.wait(r, s.latency(n, completion))
	s.settle(p.Model, v.seq, tokens-p.ContentTokens-completion)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(resp)))
	_, _ = w.Write(resp)
}

func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.APIKey == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.APIKey)) == 1
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *Server) defaultMaxTokens(model string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.models[model]; ok && m.DefaultMaxTokens > 0 {
		return m.DefaultMaxTokens
	}
	return s.cfg.DefaultMaxTokens
}

func (s *Server) completionTokens(maxTokens int64, u float64) int64 {
	lo, hi := s.cfg.CompletionMin, s.cfg.CompletionMax
	c := int64(math.Ceil(float64(maxTokens) * (lo + u*(hi-lo))))
	return min(max(c, 1), maxTokens)
}

func (s *Server) latency(n uint64, completion int64) time.Duration {
	u := s.draw(n, drawLatency)
	var d time.Duration
	if s.cfg.LatencyDist != nil {
		d = s.cfg.LatencyDist(u)
	} else {
		d = s.cfg.Latency + time.Duration(u*float64(s.cfg.Jitter))
	}
	return max(d, 0) + time.Duration(completion)*s.cfg.LatencyPerToken
}

// wait sleeps d, and reports false if the client left or the server closed
// first.
func (s *Server) wait(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	case <-s.closed:
		return false
	}
}

func (s *Server) hang(w http.ResponseWriter, r *http.Request, hangFor time.Duration) {
	var timeout <-chan time.Time
	if hangFor > 0 {
		t := time.NewTimer(hangFor)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-r.Context().Done():
	case <-s.closed:
		apiError(w, http.StatusServiceUnavailable, "The server is shutting down.", "server_error", "", "")
	case <-timeout:
		apiError(w, http.StatusGatewayTimeout, "The server timed out while processing your request.", "server_error", "", "")
	}
}

// verdict is the limiter's answer to one request.
type verdict struct {
	outcome Outcome
	seq     int64  // the log entry
	kind    string // "requests" or "tokens": the limit that refused
	message string
	wait    time.Duration // the retry-after of a 429; 0 if none
	hangFor time.Duration
	// The per-minute buckets after the decision, for the headers.
	hasReq, hasTok     bool
	limReq, limTok     int64
	remReq, remTok     int64
	resetReq, resetTok time.Duration
}

// admit decides one request under the lock: a fault (drawn with u, before
// the buckets, so faults consume nothing) or the buckets' verdict, charging
// them when they admit. Every decision is logged.
func (s *Server) admit(model string, tokens int64, now time.Time, u float64) verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bucketsLocked(model, now)
	for _, bk := range []*bucket{&b.rpm, &b.tpm, &b.rpd, &b.tpd} {
		bk.refill(now)
	}
	var v verdict
	f := s.faults
	switch {
	case u < f.Rate429:
		v.outcome, v.kind, v.wait = Spurious429, "requests", f.RetryAfter429
		v.message = "Rate limit reached for " + model + " in organization org-llmqsim on requests per min (RPM). Please try again in " + f.RetryAfter429.String() + "."
	case u < f.Rate429+f.Rate500:
		v.outcome = Error500
	case u < f.Rate429+f.Rate500+f.RateHang:
		v.outcome, v.hangFor = Hung, f.HangFor
	default:
		v.outcome = Admitted
		type check struct {
			b      *bucket
			cost   int64
			kind   string
			period string
		}
		checks := [...]check{
			{&b.rpm, 1, "requests", "requests per min (RPM)"},
			{&b.tpm, tokens, "tokens", "tokens per min (TPM)"},
			{&b.rpd, 1, "requests", "requests per day (RPD)"},
			{&b.tpd, tokens, "tokens", "tokens per day (TPD)"},
		}
		var binding *check
		for i := range checks {
			c := &checks[i]
			d, ok := c.b.wait(c.cost)
			if !ok {
				v.outcome, v.kind, v.wait = RateLimited, c.kind, 0
				v.message = "Request too large for " + model + " in organization org-llmqsim on " + c.period +
					": Limit " + itoa(c.b.limit) + ", Requested " + itoa(c.cost) +
					". The input or output tokens must be reduced in order to run successfully."
				binding = nil
				break
			}
			if d > v.wait {
				v.outcome, v.wait, binding = RateLimited, d, c
			}
		}
		if binding != nil {
			v.kind = binding.kind
			v.message = "Rate limit reached for " + model + " in organization org-llmqsim on " + binding.period +
				": Limit " + itoa(binding.b.limit) + ", Used " + itoa(binding.b.limit-binding.b.remaining()) +
				", Requested " + itoa(binding.cost) + ". Please try again in " + v.wait.String() +
				". Visit https://platform.openai.com/account/rate-limits to learn more."
		}
		if v.outcome == Admitted {
			for _, c := range checks {
				c.b.take(c.cost)
			}
		}
	}
	if b.rpm.limit > 0 {
		v.hasReq, v.limReq, v.remReq = true, b.rpm.limit, b.rpm.remaining()
		v.resetReq = resetFor(&b.rpm, 1)
	}
	if b.tpm.limit > 0 {
		v.hasTok, v.limTok, v.remTok = true, b.tpm.limit, b.tpm.remaining()
		v.resetTok = resetFor(&b.tpm, tokens)
	}

	switch v.outcome {
	case Admitted:
		s.stats.Admitted++
		s.stats.TokensAdmitted += tokens
	case RateLimited:
		s.stats.RateLimited++
	case Spurious429:
		s.stats.Spurious429++
	case Error500:
		s.stats.Errors500++
	case Hung:
		s.stats.Hung++
	}
	s.stats.Requests++
	v.seq = s.log.add(Admission{Time: now, Model: model, Requests: 1, Tokens: tokens, Outcome: v.outcome, RetryAfter: v.wait})
	if v.outcome == RateLimited {
		s.cfg.Logger.Debug("sim: rate limited", "model", model, "tokens", tokens, "retry_after", v.wait)
	}
	return v
}

// resetFor is the x-ratelimit-reset of a bucket: how long until it holds
// cost (after this request was charged, if it was), or until it is full if it
// never can.
func resetFor(b *bucket, cost int64) time.Duration {
	if d, ok := b.wait(cost); ok {
		return d
	}
	return ceilMS(time.Duration(math.Ceil((float64(b.limit) - b.level) / b.rate())))
}

func (s *Server) bucketsLocked(model string, now time.Time) *buckets {
	key := model
	if s.cfg.SharedBuckets {
		key = ""
	}
	b := s.buckets[key]
	if b == nil {
		l := s.limitsLocked(model)
		b = &buckets{
			rpm: newBucket(l.RPM, time.Minute, now),
			tpm: newBucket(l.TPM, time.Minute, now),
			rpd: newBucket(l.RPD, 24*time.Hour, now),
			tpd: newBucket(l.TPD, 24*time.Hour, now),
		}
		s.buckets[key] = b
	}
	return b
}

// settle records a completed call: the unused tokens go back to the token
// buckets, unless DisableRefund.
func (s *Server) settle(model string, seq, unused int64) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if unused > 0 && !s.cfg.DisableRefund {
		b := s.bucketsLocked(model, now)
		b.tpm.give(unused, now)
		b.tpd.give(unused, now)
		s.stats.TokensRefunded += unused
		if e := s.log.get(seq); e != nil {
			e.Refunded, e.RefundedAt = unused, now
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// setRateHeaders writes OpenAI's rate-limit headers and the request id.
func setRateHeaders(h http.Header, v *verdict, n, seed uint64) {
	h.Set("X-Request-Id", "req_"+strconv.FormatUint(seed, 36)+"_"+strconv.FormatUint(n, 10))
	if v.hasReq {
		h.Set("X-Ratelimit-Limit-Requests", itoa(v.limReq))
		h.Set("X-Ratelimit-Remaining-Requests", itoa(v.remReq))
		h.Set("X-Ratelimit-Reset-Requests", v.resetReq.String())
	}
	if v.hasTok {
		h.Set("X-Ratelimit-Limit-Tokens", itoa(v.limTok))
		h.Set("X-Ratelimit-Remaining-Tokens", itoa(v.remTok))
		h.Set("X-Ratelimit-Reset-Tokens", v.resetTok.String())
	}
	if v.wait > 0 {
		h.Set("Retry-After-Ms", itoa(int64(ceilMS(v.wait)/time.Millisecond)))
		h.Set("Retry-After", itoa(int64((v.wait+time.Second-1)/time.Second)))
	}
}

// The text of simulated completions: common words that are one token each in
// o200k_base and cl100k_base, so a completion of k words is about k tokens.
var words = strings.Fields(`the of and to in a is that for it as was with be by on not he this are or his from at which but have an had they you were their one all we can her has there been if more when will would who so no out up into do time only new some could these two may first then its over such than other also after most made well many them our where any work should like see very way well just each much good long make day year data model system request limit token queue worker plan text result answer value order state light world house water place point group number part line`)

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// echo returns the request's "user" field when Config.Echo is set.
func (s *Server) echo(body []byte) string {
	if !s.cfg.Echo {
		return ""
	}
	var r struct {
		User string `json:"user"`
	}
	_ = json.Unmarshal(body, &r)
	return r.User
}

func (s *Server) chatResponse(n uint64, now time.Time, model string, prompt, maxTokens int64, completions []int64, echo string) []byte {
	b := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(b)
	b.Reset()
	var total int64
	b.WriteString(`{"id":"chatcmpl-sim`)
	b.WriteString(strconv.FormatUint(n, 10))
	b.WriteString(`","object":"chat.completion","created":`)
	b.WriteString(itoa(now.Unix()))
	b.WriteString(`,"model":`)
	appendJSONString(b, model)
	b.WriteString(`,"choices":[`)
	for i, c := range completions {
		total += c
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"index":`)
		b.WriteString(strconv.Itoa(i))
		b.WriteString(`,"message":{"role":"assistant","content":`)
		if echo != "" {
			t := strings.NewReplacer(`"`, "", `\`, "").Replace(echo) + " "
			b.WriteString(`"` + t)
		} else {
			b.WriteByte('"')
		}
		s.writeText(b, n, uint64(i), c)
		b.WriteString(`","refusal":null},"logprobs":null,"finish_reason":"`)
		if c >= maxTokens {
			b.WriteString("length")
		} else {
			b.WriteString("stop")
		}
		b.WriteString(`"}`)
	}
	b.WriteString(`],"usage":{"prompt_tokens":`)
	b.WriteString(itoa(prompt))
	b.WriteString(`,"completion_tokens":`)
	b.WriteString(itoa(total))
	b.WriteString(`,"total_tokens":`)
	b.WriteString(itoa(prompt + total))
	b.WriteString(`,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_llmqsim"}`)
	b.WriteByte('\n')
	s.count(func(st *Stats) {
		st.PromptTokens += prompt
		st.CompletionTokens += total
	})
	return bytes.Clone(b.Bytes())
}

// writeText writes about k tokens of sentence-like text.
func (s *Server) writeText(b *bytes.Buffer, n, choice uint64, k int64) {
	x := uint64(s.draw(n, 1000+choice) * (1 << 53))
	for i := int64(0); i < k; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		w := words[(x>>33)%uint64(len(words))]
		if i > 0 {
			b.WriteByte(' ')
		}
		if i%12 == 0 {
			b.WriteString(strings.ToUpper(w[:1]))
			b.WriteString(w[1:])
		} else {
			b.WriteString(w)
		}
		if i%12 == 11 || i == k-1 {
			b.WriteByte('.')
		}
	}
}

type embeddingOptions struct {
	dim    int
	base64 bool
}

func (s *Server) embeddingOptions(body []byte) (embeddingOptions, error) {
	var opts struct {
		EncodingFormat string          `json:"encoding_format"`
		Dimensions     json.RawMessage `json:"dimensions"`
	}
	_ = json.Unmarshal(body, &opts)
	o := embeddingOptions{dim: s.cfg.EmbeddingDim, base64: opts.EncodingFormat == "base64"}
	if len(opts.Dimensions) > 0 && string(opts.Dimensions) != "null" {
		d, err := strconv.Atoi(string(opts.Dimensions))
		if err != nil || d < 1 || d > maxEmbeddingDim {
			return o, errors.New("'dimensions' must be an integer within [1, " + strconv.Itoa(maxEmbeddingDim) + "]")
		}
		o.dim = d
	}
	return o, nil
}

func (s *Server) embeddingResponse(n uint64, p *llm.ParsedRequest, o embeddingOptions) []byte {
	dim, b64 := o.dim, o.base64
	b := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(b)
	b.Reset()
	b.WriteString(`{"object":"list","data":[`)
	vec := make([]float32, dim)
	raw := make([]byte, 4*dim)
	for i := int64(0); i < p.Inputs; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		var norm float64
		for j := range vec {
			v := s.draw(n, uint64(1<<32)+uint64(i)<<16+uint64(j))*2 - 1
			vec[j] = float32(v)
			norm += v * v
		}
		norm = math.Sqrt(norm)
		b.WriteString(`{"object":"embedding","index":`)
		b.WriteString(itoa(i))
		b.WriteString(`,"embedding":`)
		if b64 {
			for j, v := range vec {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(float32(float64(v)/norm)))
			}
			b.WriteByte('"')
			b.WriteString(base64.StdEncoding.EncodeToString(raw))
			b.WriteByte('"')
		} else {
			b.WriteByte('[')
			var num []byte
			for j, v := range vec {
				if j > 0 {
					b.WriteByte(',')
				}
				num = strconv.AppendFloat(num[:0], float64(float32(float64(v)/norm)), 'g', -1, 32)
				b.Write(num)
			}
			b.WriteByte(']')
		}
		b.WriteByte('}')
	}
	b.WriteString(`],"model":`)
	appendJSONString(b, p.Model)
	b.WriteString(`,"usage":{"prompt_tokens":`)
	b.WriteString(itoa(p.ContentTokens))
	b.WriteString(`,"total_tokens":`)
	b.WriteString(itoa(p.ContentTokens))
	b.WriteString("}}\n")
	s.count(func(st *Stats) { st.PromptTokens += p.ContentTokens })
	return bytes.Clone(b.Bytes())
}

func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	names := make(map[string]bool, len(s.models)+len(s.buckets))
	for m := range s.models {
		names[m] = true
	}
	if !s.cfg.SharedBuckets {
		for m := range s.buckets {
			names[m] = true
		}
	}
	s.mu.Unlock()
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for m := range names {
		if m != "" {
			list.Data = append(list.Data, model{ID: m, Object: "model", Created: 1700000000, OwnedBy: "llmq-sim"})
		}
	}
	sort.Slice(list.Data, func(i, j int) bool { return list.Data[i].ID < list.Data[j].ID })
	writeJSON(w, http.StatusOK, list)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ModelWindow is, for one model, the most admitted in any window of the
// requested length and the most its current limits allow.
type ModelWindow struct {
	Admitted WindowMax `json:"admitted"`
	Allowed  WindowMax `json:"allowed"`
}

// StatsReport is the body of GET /sim/stats.
type StatsReport struct {
	Stats
	// Window and Windows are present when the request asked for ?window=.
	Window  string                 `json:"window,omitempty"`
	Windows map[string]ModelWindow `json:"windows,omitempty"`
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	rep := StatsReport{Stats: s.Stats()}
	if ws := r.URL.Query().Get("window"); ws != "" {
		win, err := time.ParseDuration(ws)
		if err != nil || win <= 0 {
			apiError(w, http.StatusBadRequest, "'window' must be a positive duration such as 60s", "invalid_request_error", "window", "")
			return
		}
		log := s.Admissions(0)
		byModel := map[string][]Admission{}
		for _, a := range log {
			key := a.Model
			if s.cfg.SharedBuckets {
				key = ""
			}
			byModel[key] = append(byModel[key], a)
		}
		rep.Window = win.String()
		rep.Windows = make(map[string]ModelWindow, len(byModel))
		for m, entries := range byModel {
			rep.Windows[m] = ModelWindow{Admitted: MaxInWindow(entries, win), Allowed: s.Limits(m).MaxAdmissible(win)}
		}
	}
	writeJSON(w, http.StatusOK, rep)
}

func (s *Server) serveAdmissions(w http.ResponseWriter, r *http.Request) {
	var after int64
	if a := r.URL.Query().Get("after"); a != "" {
		var err error
		if after, err = strconv.ParseInt(a, 10, 64); err != nil {
			apiError(w, http.StatusBadRequest, "'after' must be an integer", "invalid_request_error", "after", "")
			return
		}
	}
	entries := s.Admissions(after)
	if entries == nil {
		entries = []Admission{}
	}
	writeJSON(w, http.StatusOK, entries)
}

func (s *Server) serveSetLimits(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
		Limits
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "the body must be {\"model\"?, \"rpm\", \"tpm\", \"rpd\", \"tpd\"}: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	if err := s.SetModelLimits(req.Model, req.Limits); err != nil {
		apiError(w, http.StatusBadRequest, err.Error(), "invalid_request_error", "", "")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) serveSetFaults(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Rate429       float64 `json:"rate_429"`
		Rate500       float64 `json:"rate_500"`
		RateHang      float64 `json:"rate_hang"`
		HangFor       string  `json:"hang_for"`
		RetryAfter429 string  `json:"retry_after_429"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "the body must be {\"rate_429\", \"rate_500\", \"rate_hang\", \"hang_for\", \"retry_after_429\"}: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	f := Faults{Rate429: req.Rate429, Rate500: req.Rate500, RateHang: req.RateHang}
	for _, d := range []struct {
		name string
		s    string
		to   *time.Duration
	}{{"hang_for", req.HangFor, &f.HangFor}, {"retry_after_429", req.RetryAfter429, &f.RetryAfter429}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			apiError(w, http.StatusBadRequest, "'"+d.name+"' must be a duration such as 5s", "invalid_request_error", d.name, "")
			return
		}
		*d.to = v
	}
	if err := s.SetFaults(f); err != nil {
		apiError(w, http.StatusBadRequest, err.Error(), "invalid_request_error", "", "")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
