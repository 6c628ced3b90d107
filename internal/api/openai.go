package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
	"github.com/llmq/llmq/internal/worker"
)

// SyncRunner runs synchronous requests: the worker's handler.
type SyncRunner interface {
	RunSync(ctx context.Context, c worker.SyncCall) (*worker.SyncResult, error)
}

// SyncOptions configure the synchronous OpenAI endpoints.
type SyncOptions struct {
	// MaxWait (LLMQ_SYNC_MAX_WAIT, more than 0) is the longest a request
	// waits for its budget and rate limit; its MaxWaitHeader may lower it.
	MaxWait time.Duration
}

// MaxWaitHeader lowers a synchronous request's wait: seconds ("2.5") or a
// duration ("500ms").
const MaxWaitHeader = "X-Llmq-Max-Wait"

// JobIDHeader names the job of a synchronous request in its answer.
const JobIDHeader = "X-Llmq-Job-Id"

type syncAPI struct {
	*Server
	runner SyncRunner
	opts   SyncOptions
}

// EnableSync serves OpenAI's own endpoints on tenant keys, so the official
// SDKs reach llmq with base_url <llmq>/v1: POST /v1/chat/completions and
// POST /v1/responses (streamed too; responses also in the background, with
// GET /v1/responses/{id} and its cancel), POST /v1/embeddings, GET
// /v1/models; and Anthropic's POST /v1/messages (see messages). Each
// request is a job of its tenant, admitted as POST /v1/jobs admits one,
// run by runner.
func (s *Server) EnableSync(runner SyncRunner, opts SyncOptions) {
	a := &syncAPI{Server: s, runner: runner, opts: opts}
	t := s.tenantRoute
	for _, endpoint := range []string{llm.EndpointChat, llm.EndpointEmbeddings, llm.EndpointResponses} {
		s.mux.Handle("POST "+endpoint, t("", a.call(endpoint)))
	}
	s.mux.Handle("GET "+llm.EndpointResponses+"/{id}", t("", a.getResponse))
	s.mux.Handle("POST "+llm.EndpointResponses+"/{id}/cancel", t("", a.cancelResponse))
	s.mux.Handle("GET /v1/models", t("", a.listModels))
	s.mux.Handle("GET /v1/models/{id}", t("", a.getModel))
	s.mux.Handle("POST "+llm.EndpointMessages, s.tenantRouteAs(anthropicWay, "", a.messages))
}

// model is OpenAI's model object.
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (a *syncAPI) listModels(w http.ResponseWriter, r *http.Request) error {
	p := a.Policy.Current()
	out := make([]model, 0, len(p.Models))
	for _, m := range p.Models {
		out = append(out, model{ID: m.Name, Object: "model", OwnedBy: m.OwnedBy()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return writeOK(w, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", out})
}

func (a *syncAPI) getModel(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	m, ok := a.Policy.Current().Model(id)
	if !ok {
		return wire.Errorf(http.StatusNotFound, wire.TypeInvalidRequest, client.CodeModelNotFound, "model",
			"The model '%.100s' does not exist or is not served here.", id)
	}
	return writeOK(w, model{ID: m.Name, Object: "model", OwnedBy: m.OwnedBy()})
}

// call serves the requests to endpoint. A chat or Responses request that
// streams is the job of the request unstreamed, as POST /v1/jobs stores it.
// POST /v1/responses with "background": true is a job of llmq's whose id is
// the response's until it ends. The provider is called without background
// (llmq is the background), so its answer carries the usage charged at
// once; the completed response is the provider's, whose id a follow-up's
// previous_response_id names.
func (a *syncAPI) call(endpoint string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		var raw json.RawMessage
		body, err := decodeJSON(w, r, a.Server.opts.MaxBodyBytes, &raw, false)
		if err != nil {
			return err
		}
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) != nil || fields == nil {
			return a.run(w, r, endpoint, body, false, false) // admission names what is wrong
		}
		strip := []string{"stream", "stream_options"}
		if endpoint == llm.EndpointResponses {
			switch strings.TrimSpace(string(fields["background"])) {
			case "", "false", "null": // "" when absent
			case "true":
				return a.background(w, r, body, fields)
			default:
				return wire.Invalid("background", client.CodeInvalidValue, "'background' must be a boolean.")
			}
			strip = append(strip, "background")
		}
		stream, includeUsage, err := streamFields(endpoint, fields)
		if err != nil {
			return err
		}
		return a.run(w, r, endpoint, without(body, fields, strip...), stream, includeUsage)
	}
}

// run serves one synchronous request to endpoint with body.
func (a *syncAPI) run(w http.ResponseWriter, r *http.Request, endpoint string, body []byte,
	stream, includeUsage bool) error {
	idemKey := ""
	var err error
	if !stream { // a stream is not replayed
		if idemKey, err = idempotencyKey(r); err != nil {
			return err
		}
	}
	wait, err := a.maxWait(r)
	if err != nil {
		return err
	}
	job, admitted, err := a.admitJob(r.Context(), callerOf(r), &createJobRequest{Endpoint: endpoint, Body: body}, idemKey, true)
	if err != nil {
		return openAIError(err)
	}
	w.Header().Set(JobIDHeader, job.ID)
	if admitted == nil {
		return a.replay(w, job)
	}
	call := worker.SyncCall{JobID: job.ID, Deadline: time.Now().Add(wait)}
	var relay *sseRelay
	if stream {
		relay = &sseRelay{w: w, out: streamTo(w, r), rc: http.NewResponseController(w), includeUsage: includeUsage,
			typed: endpoint == llm.EndpointResponses || endpoint == llm.EndpointMessages, anthropic: endpoint == llm.EndpointMessages}
		call.Stream = relay.send
	}
	answered := false
	call.Answer = func(resp *llm.Response) {
		answered = true
		a.answer(w, resp, relay)
	}
	res, err := a.runner.RunSync(r.Context(), call)
	var refusal *wire.Error
	switch {
	case errors.As(err, &refusal):
		return refusal
	case err != nil && r.Context().Err() != nil:
		return nil // the client left before the call: nobody to answer
	case err != nil:
		return err
	}
	if res.ProviderError != nil {
		if relay != nil && relay.started {
			relay.fail(res.ProviderError)
			return nil
		}
		return providerAnswer(res.ProviderError)
	}
	if !answered {
		a.answer(w, res.Response, relay)
	}
	return nil
}

// answer writes the provider's answer: the rest of a stream, or the whole
// body, flushed at once (the job is settled and stored after).
func (a *syncAPI) answer(w http.ResponseWriter, resp *llm.Response, relay *sseRelay) {
	if relay != nil {
		relay.done()
		return
	}
	h := w.Header()
	if resp.RequestID != "" {
		h.Set("X-Request-Id", resp.RequestID)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(time.Minute))
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(resp.Body)
	_ = rc.Flush()
}

// maxWait is the request's wait: MaxWait, or less when MaxWaitHeader asks.
func (a *syncAPI) maxWait(r *http.Request) (time.Duration, error) {
	v := strings.TrimSpace(r.Header.Get(MaxWaitHeader))
	if v == "" {
		return a.opts.MaxWait, nil
	}
	invalid := wire.Invalid(MaxWaitHeader, client.CodeInvalidHeader, "%s must be seconds (\"2.5\") or a duration (\"500ms\"), got '%.50s'.", MaxWaitHeader, v)
	negative := wire.Invalid(MaxWaitHeader, client.CodeInvalidHeader, "%s must not be negative, got '%.50s'.", MaxWaitHeader, v)
	d, err := time.ParseDuration(v)
	if err != nil {
		// Plain seconds; a wait longer than any duration is the longest
		// one: the server's LLMQ_SYNC_MAX_WAIT bounds it anyway.
		f, ferr := strconv.ParseFloat(v, 64)
		switch {
		case errors.Is(ferr, strconv.ErrRange) && f > 0, ferr == nil && f >= a.opts.MaxWait.Seconds():
			return a.opts.MaxWait, nil
		case errors.Is(ferr, strconv.ErrRange) && f < 0, ferr == nil && f < 0:
			return 0, negative
		case ferr != nil || math.IsNaN(f) || math.IsInf(f, 0):
			return 0, invalid
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 0 {
		return 0, negative
	}
	return min(d, a.opts.MaxWait), nil
}

// streamFields reads a body's stream and stream_options.
func streamFields(endpoint string, fields map[string]json.RawMessage) (stream, includeUsage bool, err error) {
	switch strings.TrimSpace(string(fields["stream"])) {
	case "true":
		stream = true
	case "false", "null", "": // "" when absent
	default:
		return false, false, wire.Invalid("stream", client.CodeInvalidValue, "'stream' must be a boolean.")
	}
	if stream && endpoint == llm.EndpointEmbeddings {
		return false, false, wire.Invalid("stream", client.CodeInvalidValue, "'stream' is only supported on %s, %s and %s.",
			llm.EndpointChat, llm.EndpointResponses, llm.EndpointMessages)
	}
	if opts, has := fields["stream_options"]; has && strings.TrimSpace(string(opts)) != "null" {
		if !stream {
			return false, false, wire.Invalid("stream_options", client.CodeInvalidValue,
				"'stream_options' is only allowed when 'stream' is true.")
		}
		// The Responses API's stream_options (include_obfuscation) shape
		// only its events' padding: llmq asks for the provider's default.
		if endpoint == llm.EndpointChat {
			var o struct {
				IncludeUsage *bool `json:"include_usage"`
			}
			if err := json.Unmarshal(opts, &o); err != nil {
				return false, false, wire.Invalid("stream_options", client.CodeInvalidValue,
					"'stream_options' must be an object with a boolean include_usage.")
			}
			includeUsage = o.IncludeUsage != nil && *o.IncludeUsage
		}
	}
	return stream, includeUsage, nil
}

// without is body without the members names of its fields: body itself
// when it has none of them. The fields were read from a JSON text, so they
// marshal.
func without(body []byte, fields map[string]json.RawMessage, names ...string) []byte {
	n := len(fields)
	for _, name := range names {
		delete(fields, name)
	}
	if len(fields) == n {
		return body
	}
	body, _ = json.Marshal(fields)
	return body
}

// openAIError is an admission refusal as the OpenAI endpoints name it: the
// body is the request, so a param is named without POST /v1/jobs's "body."
// prefix, and an exhausted budget is OpenAI's insufficient_quota.
func openAIError(err error) error {
	var e *wire.Error
	if !errors.As(err, &e) {
		return err
	}
	out := *e
	out.Param = strings.TrimPrefix(out.Param, "body.")
	if out.Param == "body" {
		out.Param = ""
	}
	if out.Code == client.CodeBudgetExhausted && out.Status == http.StatusTooManyRequests {
		out.Type, out.Code = wire.TypeInsufficientQuota, client.CodeInsufficientQuota
	}
	return &out
}

// replay answers an idempotent retry with the first request's answer.
func (a *syncAPI) replay(w http.ResponseWriter, job *store.Job) error {
	if !job.Sync {
		return wire.Errorf(http.StatusConflict, wire.TypeInvalidRequest, client.CodeIdempotencyKeyReused, "Idempotency-Key",
			"This Idempotency-Key was used for job %s, submitted to POST /v1/jobs.", job.ID)
	}
	w.Header().Set("Idempotent-Replayed", "true")
	switch {
	case job.Status == store.JobSucceeded:
		return writeRaw(w, job.ResponseStatus, job.ResponseBody)
	case job.Status.Terminal() && job.Error != nil:
		status := job.ResponseStatus
		if status == 0 {
			status = http.StatusTooManyRequests
			if job.Error.Type == wire.TypeInvalidRequest {
				status = http.StatusBadRequest
			}
		}
		return &wire.Error{Status: status, Type: job.Error.Type, Code: job.Error.Code, Param: job.Error.Param, Message: job.Error.Message}
	case job.Status.Terminal():
		return wire.Errorf(http.StatusConflict, wire.TypeInvalidRequest, client.CodeRequestCancelled, "Idempotency-Key",
			"The request with this Idempotency-Key (job %s) was %s.", job.ID, job.Status)
	default:
		return &wire.Error{Status: http.StatusConflict, Type: wire.TypeInvalidRequest, Code: client.CodeRequestInProgress, Param: "Idempotency-Key",
			Message: "The request with this Idempotency-Key (job " + job.ID + ") is still running; retry later.", RetryAfter: time.Second}
	}
}

// providerAnswer is the provider's refusal, with its status, as the client's
// answer. A call without an answer, or with a 2xx answer llmq could not
// take, is a 502: an SDK must never take it for a success.
func providerAnswer(pe *llm.Error) *wire.Error {
	e := &wire.Error{Status: pe.StatusCode, Type: pe.Type, Code: pe.Code, Param: pe.Param, Message: pe.Message}
	if d, ok := pe.RateLimit.Delay(); ok {
		e.RetryAfter = d
	}
	if e.Status < 400 {
		e.Status = http.StatusBadGateway
	}
	if e.Type == "" {
		e.Type = wire.TypeServer
		if e.Status == http.StatusTooManyRequests {
			e.Type = wire.TypeRateLimit
		} else if e.Status < 500 {
			e.Type = wire.TypeInvalidRequest
		}
	}
	if e.Message == "" {
		e.Message = http.StatusText(e.Status)
	}
	return e
}

// sseRelay writes a streamed answer's events to the client as they come.
// A client that has gone is written to no more, and the call goes on: it is
// charged once, when it ends.
type sseRelay struct {
	w            http.ResponseWriter
	out          interface{ Write([]byte) (int, error) }
	rc           *http.ResponseController
	includeUsage bool
	// typed: the Responses API's or the Messages API's stream, whose events
	// are named by their data's type and which ends with its last event,
	// not [DONE]; anthropic: the Messages API's, whose error event is in
	// Anthropic's shape.
	typed, anthropic bool
	started          bool
	gone             bool
}

func (s *sseRelay) send(data []byte) error {
	if s.gone || (!s.typed && !s.includeUsage && llm.StripUsageChunk(data)) {
		return nil
	}
	if !s.started {
		s.started = true
		h := s.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		s.w.WriteHeader(http.StatusOK)
	}
	s.write(s.event(data))
	return nil
}

// event is data as one Server-Sent Event, named by its type when typed.
func (s *sseRelay) event(data []byte) []byte {
	buf := make([]byte, 0, len(data)+64)
	if s.typed {
		var e struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(data, &e) == nil && e.Type != "" && !strings.ContainsAny(e.Type, "\r\n") {
			buf = append(append(append(buf, "event: "...), e.Type...), '\n')
		}
	}
	return append(append(append(buf, "data: "...), data...), "\n\n"...)
}

func (s *sseRelay) write(b []byte) {
	if s.gone {
		return
	}
	if _, err := s.out.Write(b); err != nil {
		s.gone = true
		return
	}
	if err := s.rc.Flush(); err != nil {
		s.gone = true
	}
}

// done ends the stream; a stream that sent nothing still starts and ends.
func (s *sseRelay) done() {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "text/event-stream")
		s.w.WriteHeader(http.StatusOK)
	}
	if !s.typed {
		s.write([]byte("data: [DONE]\n\n"))
	}
}

// fail ends a started stream with an error event: chat's {"error": …},
// the Responses API's event of type error, or Anthropic's.
func (s *sseRelay) fail(pe *llm.Error) {
	e := providerAnswer(pe)
	if s.anthropic {
		s.write(s.event(wire.AnthropicErrorBody(e)))
		return
	}
	if !s.typed {
		s.write(append(append([]byte("data: "), wire.ErrorBody(e.Object())...), "\n\n"...))
		return
	}
	var param *string // null when empty
	if e.Param != "" {
		param = &e.Param
	}
	data, _ := json.Marshal(struct {
		Type    string      `json:"type"`
		Code    client.Code `json:"code"`
		Message string      `json:"message"`
		Param   *string     `json:"param"`
	}{"error", e.Code, e.Message, param})
	s.write(s.event(data))
}

// background submits a background response: a job of the Responses API.
func (a *syncAPI) background(w http.ResponseWriter, r *http.Request, body []byte,
	fields map[string]json.RawMessage) error {
	if s := strings.TrimSpace(string(fields["stream"])); s == "true" {
		return wire.Invalid("stream", client.CodeInvalidValue,
			"'stream' cannot be combined with 'background' here: follow a background response with GET /v1/responses/{id}.")
	}
	body = without(body, fields, "background", "stream", "stream_options")
	job, err := a.submitJob(w, r, &createJobRequest{Endpoint: llm.EndpointResponses, Body: body})
	if err != nil {
		return openAIError(err)
	}
	w.Header().Set(JobIDHeader, job.ID)
	return writeResponseObject(w, job)
}

// callersResponse is the caller's background response id: a job of theirs
// on the Responses API.
func (a *syncAPI) callersResponse(r *http.Request) (*store.Job, error) {
	id := r.PathValue("id")
	missing := wire.Errorf(http.StatusNotFound, wire.TypeInvalidRequest, client.CodeNotFound, "",
		"No background response found with id '%.100s'. llmq keeps the background responses it runs; a response stored at the provider is retrieved from the provider.", id)
	if !ids.Valid(ids.Job, id) {
		return nil, missing
	}
	job, err := a.Store.JobGetForTenant(r.Context(), callerOf(r).tenant.ID, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (job.Endpoint != llm.EndpointResponses || job.Sync)) {
		return nil, missing
	}
	return job, err
}

func (a *syncAPI) getResponse(w http.ResponseWriter, r *http.Request) error {
	job, err := a.callersResponse(r)
	if err != nil {
		return err
	}
	return writeResponseObject(w, job)
}

func (a *syncAPI) cancelResponse(w http.ResponseWriter, r *http.Request) error {
	job, err := a.callersResponse(r)
	if err != nil {
		return err
	}
	if !job.Status.Terminal() {
		if job, _, err = a.cancelCallersJob(r, job.ID); err != nil {
			return err
		}
	}
	return writeResponseObject(w, job)
}

// responseStatuses are the Responses API's statuses of a background
// response's job; the others are "queued".
var responseStatuses = map[store.JobStatus]string{store.JobSucceeded: "completed", store.JobFailed: "failed",
	store.JobCancelled: "cancelled", store.JobRunning: "in_progress"}

// responseUsage is a background response's usage, in the Responses API's names.
type responseUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens int64 `json:"output_tokens"`
	TotalTokens  int64 `json:"total_tokens"`
}

// writeResponseObject answers with a background response: the provider's
// response once the job succeeded, else a response object of the job's
// state (its error when it failed, the usage it was charged when it ended
// while its call ran).
func writeResponseObject(w http.ResponseWriter, job *store.Job) error {
	if job.Status == store.JobSucceeded && len(job.ResponseBody) > 0 && bytes.HasPrefix(bytes.TrimSpace(job.ResponseBody), []byte("{")) {
		return writeRaw(w, http.StatusOK, job.ResponseBody)
	}
	type responseError struct {
		Code    client.Code `json:"code"`
		Message string      `json:"message"`
	}
	out := struct {
		ID                string            `json:"id"`
		Object            string            `json:"object"`
		CreatedAt         int64             `json:"created_at"`
		Status            string            `json:"status"`
		Background        bool              `json:"background"`
		Model             string            `json:"model"`
		Output            []json.RawMessage `json:"output"`
		Error             *responseError    `json:"error"`
		IncompleteDetails *struct{}         `json:"incomplete_details"`
		Usage             *responseUsage    `json:"usage"`
		Metadata          map[string]string `json:"metadata"`
	}{ID: job.ID, Object: "response", CreatedAt: job.CreatedAt.Unix(), Status: cmp.Or(responseStatuses[job.Status], "queued"), Background: true,
		Model: job.Model, Output: []json.RawMessage{}, Metadata: map[string]string{}}
	if u := wire.JobUsage(job); u != nil {
		out.Usage = &responseUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
		out.Usage.InputTokensDetails.CachedTokens = job.CachedTokens
	}
	if job.Status == store.JobFailed && job.Error != nil {
		out.Error = &responseError{Code: job.Error.Code, Message: job.Error.Message}
		if out.Error.Code == "" {
			out.Error.Code = client.CodeServerError
		}
	}
	return writeOK(w, out)
}
