package sim

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"
)

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
	// Batch counts the Files and Batches endpoints' work.
	Batch BatchStats `json:"batch"`
	// CustomIDRuns is present when the request asked for ?custom_ids=1:
	// Server.CustomIDRuns.
	CustomIDRuns map[string]int64 `json:"custom_id_runs,omitempty"`
	// Window and Windows are present when the request asked for ?window=.
	Window  string                 `json:"window,omitempty"`
	Windows map[string]ModelWindow `json:"windows,omitempty"`
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	rep := StatsReport{Stats: s.Stats(), Batch: s.BatchStats()}
	if v := r.URL.Query().Get("custom_ids"); v != "" && v != "0" && v != "false" {
		rep.CustomIDRuns = s.CustomIDRuns()
	}
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
		Rate529       float64 `json:"rate_529"`
		RateHang      float64 `json:"rate_hang"`
		OmitUsage     float64 `json:"omit_usage"`
		StreamError   float64 `json:"stream_error"`
		HangFor       string  `json:"hang_for"`
		RetryAfter429 string  `json:"retry_after_429"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "the body must be {\"rate_429\", \"rate_500\", \"rate_529\", \"rate_hang\", \"omit_usage\", \"stream_error\", \"hang_for\", \"retry_after_429\"}: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	f := Faults{Rate429: req.Rate429, Rate500: req.Rate500, Rate529: req.Rate529, RateHang: req.RateHang, OmitUsage: req.OmitUsage, StreamError: req.StreamError}
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

func (s *Server) serveBills(w http.ResponseWriter, _ *http.Request) {
	bills := s.Bills()
	if bills == nil {
		bills = []Bill{}
	}
	writeJSON(w, http.StatusOK, bills)
}

// serveSetMode serves POST /sim/mode: the modes that change while the
// simulator serves. A mode the body leaves out stays as it is.
func (s *Server) serveSetMode(w http.ResponseWriter, r *http.Request) {
	var req struct {
		WorstCase *bool `json:"worst_case"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "the body must be {\"worst_case\": true|false}: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	if req.WorstCase != nil {
		s.SetWorstCase(*req.WorstCase)
	}
	w.WriteHeader(http.StatusNoContent)
}
