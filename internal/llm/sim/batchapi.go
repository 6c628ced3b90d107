package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// dialect is the API a files or batches route belongs to.
type dialect struct {
	// azure: Azure OpenAI's paths, whose batch endpoints and line urls may
	// leave out the /v1 ("/chat/completions").
	azure bool
	// needVersion: the path needs ?api-version=, as Azure's
	// /openai/files and /openai/batches do (not its v1 API's).
	needVersion bool
}

// handleBatchAPI adds the Files and Batches endpoints to mux: OpenAI's under
// /v1, Azure OpenAI's under /openai (with api-version) and /openai/v1.
func (s *Server) handleBatchAPI(mux *http.ServeMux) {
	for _, p := range []struct {
		prefix string
		d      dialect
	}{{"/v1", dialect{}}, {"/openai", dialect{azure: true, needVersion: true}}, {"/openai/v1", dialect{azure: true}}} {
		for _, route := range []struct {
			pattern string
			h       func(http.ResponseWriter, *http.Request, dialect)
		}{
			{"POST " + p.prefix + "/files", s.serveFileUpload},
			{"GET " + p.prefix + "/files", s.serveFileList},
			{"GET " + p.prefix + "/files/{id}", s.serveFile},
			{"GET " + p.prefix + "/files/{id}/content", s.serveFileContent},
			{"DELETE " + p.prefix + "/files/{id}", s.serveFileDelete},
			{"POST " + p.prefix + "/batches", s.serveBatchCreate},
			{"GET " + p.prefix + "/batches", s.serveBatchList},
			{"GET " + p.prefix + "/batches/{id}", s.serveBatch},
			{"POST " + p.prefix + "/batches/{id}/cancel", s.serveBatchCancel},
		} {
			mux.HandleFunc(route.pattern, s.batchAPI(p.d, route.h))
		}
	}
}

// batchAPI checks what every files, batches and stored-response call
// needs: Azure's api-version where it is required (the key is checked
// before every path, by Handler).
func (s *Server) batchAPI(d dialect, h func(http.ResponseWriter, *http.Request, dialect)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if d.needVersion && r.URL.Query().Get("api-version") == "" {
			apiError(w, http.StatusNotFound, "Resource not found", "", "", "404")
			return
		}
		h(w, r, d)
	}
}

// batchObject is OpenAI's batch object.
type batchObject struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"`
	Endpoint         string             `json:"endpoint"`
	Errors           *batchErrors       `json:"errors"`
	InputFileID      string             `json:"input_file_id"`
	CompletionWindow string             `json:"completion_window"`
	Status           string             `json:"status"`
	OutputFileID     *string            `json:"output_file_id"`
	ErrorFileID      *string            `json:"error_file_id"`
	CreatedAt        int64              `json:"created_at"`
	InProgressAt     *int64             `json:"in_progress_at"`
	ExpiresAt        *int64             `json:"expires_at"`
	FinalizingAt     *int64             `json:"finalizing_at"`
	CompletedAt      *int64             `json:"completed_at"`
	FailedAt         *int64             `json:"failed_at"`
	ExpiredAt        *int64             `json:"expired_at"`
	CancellingAt     *int64             `json:"cancelling_at"`
	CancelledAt      *int64             `json:"cancelled_at"`
	RequestCounts    batchRequestCounts `json:"request_counts"`
	Metadata         map[string]string  `json:"metadata"`
}

type batchErrors struct {
	Object string       `json:"object"`
	Data   []batchError `json:"data"`
}

type batchRequestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// object is b as OpenAI shows a batch. Its request counts are the lines
// answered 200 (completed) and with an error (failed); lines left undone by
// an expiry or a cancel are in neither.
func (b *batch) object() batchObject {
	unix := func(t time.Time) *int64 {
		if t.IsZero() {
			return nil
		}
		u := t.Unix()
		return &u
	}
	id := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	o := batchObject{
		ID: b.id, Object: "batch", Endpoint: b.endpoint, InputFileID: b.inputFileID, CompletionWindow: "24h",
		Status: b.status, OutputFileID: id(b.outputID), ErrorFileID: id(b.errorID),
		CreatedAt: b.created.Unix(), InProgressAt: unix(b.inProgressAt), ExpiresAt: unix(b.created.Add(24 * time.Hour)),
		FinalizingAt: unix(b.finalizingAt), CompletedAt: unix(b.completedAt), FailedAt: unix(b.failedAt),
		ExpiredAt: unix(b.expiredAt), CancellingAt: unix(b.cancellingAt), CancelledAt: unix(b.cancelled),
		RequestCounts: batchRequestCounts{Completed: b.completed, Failed: b.failed},
		Metadata:      b.metadata,
	}
	if !b.inProgressAt.IsZero() {
		o.RequestCounts.Total = b.total
	}
	if len(b.errors) > 0 {
		o.Errors = &batchErrors{Object: "list", Data: b.errors}
	}
	return o
}

// serveBatchCreate serves POST /v1/batches.
func (s *Server) serveBatchCreate(w http.ResponseWriter, r *http.Request, d dialect) {
	var req struct {
		InputFileID      string            `json:"input_file_id"`
		Endpoint         string            `json:"endpoint"`
		CompletionWindow string            `json:"completion_window"`
		Metadata         map[string]string `json:"metadata"`
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		apiError(w, http.StatusBadRequest, "We could not parse the JSON body of your request: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	bad := func(param, code, message string) {
		apiError(w, http.StatusBadRequest, message, "invalid_request_error", param, code)
	}
	api := batchEndpoint(req.Endpoint, d.azure)
	switch {
	case req.InputFileID == "":
		bad("input_file_id", "missing_required_parameter", "Missing required parameter: 'input_file_id'.")
		return
	case req.Endpoint == "":
		bad("endpoint", "missing_required_parameter", "Missing required parameter: 'endpoint'.")
		return
	case api == "":
		bad("endpoint", "invalid_value", fmt.Sprintf("Invalid value for 'endpoint': '%s'. Supported values are: '/v1/responses', '/v1/chat/completions' and '/v1/embeddings'.", req.Endpoint))
		return
	case req.CompletionWindow != "24h":
		bad("completion_window", "invalid_value", fmt.Sprintf("Invalid value for 'completion_window': '%s'. Supported values are: '24h'.", req.CompletionWindow))
		return
	case len(req.Metadata) > 16:
		bad("metadata", "invalid_value", "Invalid 'metadata': at most 16 key-value pairs are allowed.")
		return
	}
	for k, v := range req.Metadata {
		if len(k) > 64 || len(v) > 512 {
			bad("metadata", "invalid_value", "Invalid 'metadata': keys must be at most 64 characters and values at most 512.")
			return
		}
	}

	st := s.bat
	now := s.cfg.Now()
	st.mu.Lock()
	s.advanceBatchesLocked(now)
	f := st.files[req.InputFileID]
	cfg := st.cfg
	st.mu.Unlock()
	if f == nil || f.purpose != "batch" {
		msg := fmt.Sprintf("Invalid 'input_file_id': '%s'. No such file.", req.InputFileID)
		if f != nil {
			msg = fmt.Sprintf("Invalid 'input_file_id': '%s'. The file's purpose is '%s'; a batch's input file must have purpose 'batch'.", req.InputFileID, f.purpose)
		}
		bad("input_file_id", "invalid_value", msg)
		return
	}
	b := &batch{
		endpoint: req.Endpoint, api: api, inputFileID: f.id, metadata: req.Metadata,
		cfg: cfg, status: batchValidating,
	}
	// Reading a large file takes a while: not under the lock. The file's
	// data never changes.
	s.parseBatchInput(b, f.data, d.azure)
	b.total = len(b.lines)

	st.mu.Lock()
	// Created now, so that no batch's transitions are made before its own
	// creation while it was read.
	b.created = s.cfg.Now()
	s.advanceBatchesLocked(b.created)
	st.nextBatch++
	b.num = st.nextBatch
	b.id = s.ident("batch_", identBatch, b.num)
	st.batches[b.id] = b
	st.order = append(st.order, b)
	st.active = append(st.active, b)
	st.stats.BatchesCreated++
	// As at OpenAI, the batch is validating when created, however short
	// its validation.
	obj := b.object()
	st.mu.Unlock()
	writeJSON(w, http.StatusOK, obj)
}

// serveBatch serves GET /v1/batches/{id}.
func (s *Server) serveBatch(w http.ResponseWriter, r *http.Request, _ dialect) {
	st := s.bat
	st.mu.Lock()
	s.advanceBatchesLocked(s.cfg.Now())
	b := st.batches[r.PathValue("id")]
	var obj batchObject
	if b != nil {
		obj = b.object()
	}
	st.mu.Unlock()
	if b == nil {
		batchNotFound(w, r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, obj)
}

func batchNotFound(w http.ResponseWriter, id string) {
	apiError(w, http.StatusNotFound, "No batch found with id '"+id+"'.", "invalid_request_error", "batch_id", "")
}

// serveBatchCancel serves POST /v1/batches/{id}/cancel: the batch is
// cancelling at once, and cancelled Config.Batch.CancellingFor later, with
// the lines answered before the cancel in its output or error file and the
// others in its error file as batch_cancelled. A batch that has ended cannot
// be cancelled; cancelling one that is cancelling changes nothing.
func (s *Server) serveBatchCancel(w http.ResponseWriter, r *http.Request, _ dialect) {
	st := s.bat
	now := s.cfg.Now()
	st.mu.Lock()
	s.advanceBatchesLocked(now)
	b := st.batches[r.PathValue("id")]
	if b == nil {
		st.mu.Unlock()
		batchNotFound(w, r.PathValue("id"))
		return
	}
	switch b.status {
	case batchValidating, batchInProgress, batchFinalizing:
		b.status, b.cancellingAt = batchCancelling, now
	case batchCancelling:
	default:
		status := b.status
		st.mu.Unlock()
		apiError(w, http.StatusBadRequest, "Cannot cancel a batch with status '"+status+"'.", "invalid_request_error", "", "")
		return
	}
	obj := b.object()
	st.mu.Unlock()
	writeJSON(w, http.StatusOK, obj)
}

// serveBatchList serves GET /v1/batches?limit=&after=: the batches, newest
// first, after the one named by after.
func (s *Server) serveBatchList(w http.ResponseWriter, r *http.Request, _ dialect) {
	limit := 20
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			apiError(w, http.StatusBadRequest, "Invalid 'limit': must be an integer within [1, 100].", "invalid_request_error", "limit", "invalid_value")
			return
		}
		limit = n
	}
	after := r.URL.Query().Get("after")
	st := s.bat
	st.mu.Lock()
	s.advanceBatchesLocked(s.cfg.Now())
	i := len(st.order) - 1 // newest first
	if after != "" {
		b := st.batches[after]
		if b == nil {
			st.mu.Unlock()
			apiError(w, http.StatusBadRequest, "Invalid 'after': no batch has the id '"+after+"'.", "invalid_request_error", "after", "invalid_value")
			return
		}
		i = int(b.num) - 2 // order[num-1] is b
	}
	list := struct {
		Object  string        `json:"object"`
		Data    []batchObject `json:"data"`
		FirstID *string       `json:"first_id"`
		LastID  *string       `json:"last_id"`
		HasMore bool          `json:"has_more"`
	}{Object: "list", Data: []batchObject{}}
	for ; i >= 0 && len(list.Data) < limit; i-- {
		list.Data = append(list.Data, st.order[i].object())
	}
	list.HasMore = i >= 0
	st.mu.Unlock()
	if n := len(list.Data); n > 0 {
		list.FirstID, list.LastID = &list.Data[0].ID, &list.Data[n-1].ID
	}
	writeJSON(w, http.StatusOK, list)
}
