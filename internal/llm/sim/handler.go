package sim

import (
	"bytes"
	"cmp"
	"crypto/subtle"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// Handler serves the OpenAI API (POST /v1/chat/completions, POST
// /v1/responses, POST /v1/embeddings, GET /v1/models), Anthropic's Messages
// API (POST /v1/messages, with x-api-key and anthropic-version), the Responses API's
// stored responses (GET and DELETE /v1/responses/{id}, POST
// /v1/responses/{id}/cancel), the same calls as Azure OpenAI takes them (POST
// /openai/deployments/{deployment}/chat/completions?api-version=…, the
// deployment as the model; POST /openai/responses?api-version=…, the
// deployment as the body's model; and POST /openai/v1/…), OpenAI's Files and
// Batches endpoints (POST /v1/files, GET /v1/files/{id}[/content], DELETE
// /v1/files/{id}, POST /v1/batches, GET /v1/batches[/{id}], POST
// /v1/batches/{id}/cancel; see BatchConfig), the same under /openai (with
// api-version) and /openai/v1, and the simulator's control API:
//
//	GET  /sim/stats[?window=60s][&custom_ids=1]
//	                              Stats and BatchStats ("batch"); with window,
//	                              per model the most requests and tokens
//	                              admitted in any window of that length and the
//	                              most the limits allow; with custom_ids, how
//	                              many times each batch line's custom_id was
//	                              answered
//	GET  /sim/admissions[?after=N] the admission log after entry N
//	GET  /sim/bills   the bill log (Server.Bills)
//	POST /sim/limits  {"model"?, "rpm", "tpm", "rpd", "tpd", "itpm", "otpm"}
//	POST /sim/faults  {"rate_429", "rate_500", "rate_529", "rate_hang", "omit_usage", "stream_error", "hang_for": "5s", "retry_after_429": "1s"}
//	POST /sim/mode    {"worst_case": true}
//	POST /sim/reset   clears stats and logs, refills buckets
//
// With Config.APIKey set, every path needs the key, the control API's too;
// without, the simulator is for loopback use.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+llm.EndpointChat, s.serveCompletion)
	mux.HandleFunc("POST "+llm.EndpointResponses, s.serveCompletion)
	mux.HandleFunc("POST "+llm.EndpointEmbeddings, s.serveCompletion)
	mux.HandleFunc("GET /v1/models", s.serveModels)
	mux.HandleFunc("POST "+EndpointMessages, s.serveMessages)
	// Azure OpenAI: a deployment's paths, and the v1 API's.
	mux.HandleFunc("POST /openai/deployments/{deployment}/chat/completions", s.serveAzureDeployment)
	mux.HandleFunc("POST /openai/deployments/{deployment}/embeddings", s.serveAzureDeployment)
	mux.HandleFunc("POST /openai/v1/chat/completions", s.serveAzureV1)
	mux.HandleFunc("POST /openai/v1/responses", s.serveAzureV1)
	mux.HandleFunc("POST /openai/v1/embeddings", s.serveAzureV1)
	s.handleResponses(mux)
	s.handleBatchAPI(mux)
	mux.HandleFunc("GET /sim/stats", s.serveStats)
	mux.HandleFunc("GET /sim/admissions", s.serveAdmissions)
	mux.HandleFunc("GET /sim/bills", s.serveBills)
	mux.HandleFunc("POST /sim/limits", s.serveSetLimits)
	mux.HandleFunc("POST /sim/faults", s.serveSetFaults)
	mux.HandleFunc("POST /sim/mode", s.serveSetMode)
	mux.HandleFunc("POST /sim/reset", func(w http.ResponseWriter, _ *http.Request) {
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
	if s.cfg.APIKey == "" {
		return mux
	}
	// One check before every path, so no route can be added without it.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, EndpointMessages) {
			// Anthropic's key, in its header, refused in its shape.
			if !s.keyMatches(r.Header.Get("x-api-key")) {
				s.count(func(st *Stats) { st.Unauthorized++ })
				anthropicError(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key", "")
				return
			}
			mux.ServeHTTP(w, r)
			return
		}
		if !s.authorized(r) {
			s.count(func(st *Stats) { st.Unauthorized++ })
			apiError(w, http.StatusUnauthorized, "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
				"invalid_request_error", "", "invalid_api_key")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// apiError writes OpenAI's error shape.
func apiError(w http.ResponseWriter, status int, message, typ, param, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(message, typ, param, code))
}

// errorBody is OpenAI's error shape as OpenAI writes it, "param" before
// "code", param and code null when empty. It is the provider's bytes, not
// llmq's answer (wire owns that, with code first): a simulator that wrote
// llmq's order would test llmq's parsing against itself.
func errorBody(message, typ, param, code string) []byte {
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
	return b.Bytes()
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

// drawNoise and drawNoise + 1 are the draws of the header noise,
// drawNoise + 2 whether the usage is left out, drawNoise + 3 whether a
// stream fails midway and drawNoise + 4 how a Responses API stream says so,
// apart from the completions' (one per choice).
const drawNoise = 1 << 20

func (s *Server) serveCompletion(w http.ResponseWriter, r *http.Request) {
	s.flight.Add(1)
	defer s.flight.Add(-1)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		apiError(w, http.StatusBadRequest, "The request body could not be read: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	body, stream, includeUsage, err := streamRequest(r.URL.Path, body)
	if err != nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		apiError(w, http.StatusBadRequest, err.Error(), "invalid_request_error", "stream", "")
		return
	}
	s.deliver(w, r, s.begin(r.URL.Path, body, stream), stream, includeUsage)
}

// deliver answers exchange x: streamed when stream is set and it was
// admitted, else whole after its latency, or not until the client gives up
// for a hung one.
func (s *Server) deliver(w http.ResponseWriter, r *http.Request, x *Exchange, stream, includeUsage bool) {
	if stream && x.admitted {
		s.serveStream(w, r, x, includeUsage)
		return
	}
	if x.hang {
		for k, v := range x.header {
			w.Header()[k] = v
		}
		s.hang(w, r, x.hangFor)
		return
	}
	// A client that gives up does not get its tokens back sooner: the
	// provider finishes the work, so the refund comes at the same time.
	ok := s.wait(r, x.latency)
	status, header, resp := x.Finish()
	if !ok {
		return
	}
	for k, v := range header {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	_, _ = w.Write(resp)
}

// serveAzureDeployment serves a call to an Azure OpenAI deployment's path
// as the OpenAI call it is: the deployment's name is the model, whatever the
// body says, and a call without an api-version is not found, as on Azure.
func (s *Server) serveAzureDeployment(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("api-version") == "" {
		apiError(w, http.StatusNotFound, "Resource not found", "", "", "404")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var fields map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(body, &fields)
	}
	if err != nil || fields == nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		apiError(w, http.StatusBadRequest, "The request body is not a JSON object.", "invalid_request_error", "", "")
		return
	}
	fields["model"], _ = json.Marshal(r.PathValue("deployment"))
	body, _ = json.Marshal(fields)
	r = r.Clone(r.Context())
	r.URL.Path = "/v1" + strings.TrimPrefix(r.URL.Path, "/openai/deployments/"+r.PathValue("deployment"))
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	s.serveCompletion(w, r)
}

// serveAzureV1 serves Azure OpenAI's v1 API: OpenAI's calls under /openai.
func (s *Server) serveAzureV1(w http.ResponseWriter, r *http.Request) {
	r = r.Clone(r.Context())
	r.URL.Path = strings.TrimPrefix(r.URL.Path, "/openai")
	s.serveCompletion(w, r)
}

// authorized says whether r carries Config.APIKey: as a bearer token
// (OpenAI, Azure's v1 API), in the api-key header (Azure) or in x-api-key
// (Anthropic).
func (s *Server) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		got = cmp.Or(r.Header.Get("api-key"), r.Header.Get("x-api-key"))
	}
	return s.keyMatches(got)
}

// keyMatches says whether key is Config.APIKey.
func (s *Server) keyMatches(key string) bool {
	return key != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.APIKey)) == 1
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

// contextWindow is the model's context length; 0 for none.
func (s *Server) contextWindow(model string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.models[model].ContextWindow
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
