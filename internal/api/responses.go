package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// The Responses API (POST /v1/responses): a synchronous call like chat
// completions (streamed as the Responses API's typed events), or, with
// "background": true, a job of llmq's whose id is the response's until it
// ends: GET /v1/responses/{id} follows it and POST
// /v1/responses/{id}/cancel cancels it. The provider is called without
// background (llmq is the background), so its answer carries the usage
// charged at once; the completed response is the provider's, with the
// provider's id, which a follow-up's previous_response_id names.

func (a *syncAPI) enableResponses() {
	t := a.tenantRoute
	a.mux.Handle("POST "+llm.EndpointResponses, t(a.createResponse))
	a.mux.Handle("GET "+llm.EndpointResponses+"/{id}", t(a.getResponse))
	a.mux.Handle("POST "+llm.EndpointResponses+"/{id}/cancel", t(a.cancelResponse))
}

func (a *syncAPI) createResponse(w http.ResponseWriter, r *http.Request) error {
	var raw json.RawMessage
	body, err := decodeJSON(w, r, a.Server.opts.MaxBodyBytes, &raw)
	if err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return a.run(w, r, llm.EndpointResponses, body) // admission names what is wrong
	}
	bg, has := fields["background"]
	if !has {
		return a.run(w, r, llm.EndpointResponses, body)
	}
	switch strings.TrimSpace(string(bg)) {
	case "false", "null":
		delete(fields, "background")
		if body, err = json.Marshal(fields); err != nil {
			return err
		}
		return a.run(w, r, llm.EndpointResponses, body)
	case "true":
	default:
		return wire.Invalid("background", client.CodeInvalidValue, "'background' must be a boolean.")
	}
	if s := strings.TrimSpace(string(fields["stream"])); s == "true" {
		return wire.Invalid("stream", client.CodeInvalidValue, "'stream' cannot be combined with 'background' here: follow a background response with GET /v1/responses/{id}.")
	}
	delete(fields, "background")
	delete(fields, "stream")
	delete(fields, "stream_options")
	if body, err = json.Marshal(fields); err != nil {
		return err
	}
	job, replayed, err := a.submitJob(r, &createJobRequest{Endpoint: llm.EndpointResponses, Body: body})
	if err != nil {
		return openAIError(err)
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
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

// responseStatus is the Responses API's status of a background response's
// job.
func responseStatus(s store.JobStatus) string {
	switch s {
	case store.JobSucceeded:
		return "completed"
	case store.JobFailed:
		return "failed"
	case store.JobCancelled:
		return "cancelled"
	case store.JobRunning:
		return "in_progress"
	default:
		return "queued"
	}
}

// responseUsage is a background response's usage, in the Responses API's
// names.
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
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(job.ResponseBody)
		return nil
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
	}{ID: job.ID, Object: "response", CreatedAt: job.CreatedAt.Unix(), Status: responseStatus(job.Status), Background: true,
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
