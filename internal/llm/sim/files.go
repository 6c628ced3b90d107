package sim

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// file is a stored file: an uploaded batch input, or a batch's output or
// error file. Its data never changes.
type file struct {
	id, filename, purpose string
	created               time.Time
	data                  []byte
}

// fileObject is OpenAI's file object.
type fileObject struct {
	ID            string  `json:"id"`
	Object        string  `json:"object"`
	Bytes         int     `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	Filename      string  `json:"filename"`
	Purpose       string  `json:"purpose"`
	Status        string  `json:"status"`
	StatusDetails *string `json:"status_details"`
}

func (f *file) object() fileObject {
	return fileObject{ID: f.id, Object: "file", Bytes: len(f.data), CreatedAt: f.created.Unix(),
		Filename: f.filename, Purpose: f.purpose, Status: "processed"}
}

// addFileLocked stores a new file.
func (s *Server) addFileLocked(filename, purpose string, at time.Time, data []byte) *file {
	st := s.bat
	st.nextFile++
	f := &file{id: s.ident("file-", identFile, st.nextFile), filename: filename, purpose: purpose, created: at, data: data}
	st.files[f.id] = f
	return f
}

// serveFileUpload serves POST /v1/files: multipart/form-data with purpose
// "batch" and the file, at most Config.Batch.MaxFileBytes.
func (s *Server) serveFileUpload(w http.ResponseWriter, r *http.Request, _ dialect) {
	st := s.bat
	st.mu.Lock()
	limit := st.cfg.MaxFileBytes
	st.mu.Unlock()
	tooLarge := func() {
		apiError(w, http.StatusBadRequest, "The file is larger than "+strconv.FormatInt(limit, 10)+" bytes, the most a batch input file may hold.",
			"invalid_request_error", "file", "")
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit+1<<20) // the form's other parts
	mr, err := r.MultipartReader()
	if err != nil {
		apiError(w, http.StatusBadRequest, "The request must be multipart/form-data with the fields 'purpose' and 'file'.", "invalid_request_error", "", "")
		return
	}
	var purpose, filename string
	var data []byte
	var hasPurpose, hasFile bool
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				tooLarge()
				return
			}
			apiError(w, http.StatusBadRequest, "The multipart body could not be read: "+err.Error(), "invalid_request_error", "", "")
			return
		}
		switch part.FormName() {
		case "purpose":
			v, err := io.ReadAll(io.LimitReader(part, 256))
			if err != nil {
				apiError(w, http.StatusBadRequest, "The multipart body could not be read: "+err.Error(), "invalid_request_error", "", "")
				return
			}
			purpose, hasPurpose = string(v), true
		case "file":
			filename = part.FileName()
			if data, err = io.ReadAll(io.LimitReader(part, limit+1)); err != nil {
				var mbe *http.MaxBytesError
				if errors.As(err, &mbe) {
					tooLarge()
					return
				}
				apiError(w, http.StatusBadRequest, "The file could not be read: "+err.Error(), "invalid_request_error", "file", "")
				return
			}
			if int64(len(data)) > limit {
				tooLarge()
				return
			}
			hasFile = true
		default:
			_, _ = io.Copy(io.Discard, part)
		}
		_ = part.Close()
	}
	switch {
	case !hasPurpose:
		apiError(w, http.StatusBadRequest, "Missing required parameter: 'purpose'.", "invalid_request_error", "purpose", "missing_required_parameter")
		return
	case purpose != "batch":
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Invalid value for 'purpose': '%s'. The simulator takes files of purpose 'batch' only.", purpose),
			"invalid_request_error", "purpose", "invalid_value")
		return
	case !hasFile:
		apiError(w, http.StatusBadRequest, "Missing required parameter: 'file'.", "invalid_request_error", "file", "missing_required_parameter")
		return
	}
	if filename == "" {
		filename = "file"
	}
	now := s.cfg.Now()
	st.mu.Lock()
	s.advanceBatchesLocked(now)
	f := s.addFileLocked(filename, purpose, now, data)
	st.stats.FilesUploaded++
	obj := f.object()
	st.mu.Unlock()
	writeJSON(w, http.StatusOK, obj)
}

// lookupFile returns the file of the request's {id}, or answers 404.
func (s *Server) lookupFile(w http.ResponseWriter, r *http.Request) *file {
	st := s.bat
	st.mu.Lock()
	s.advanceBatchesLocked(s.cfg.Now())
	f := st.files[r.PathValue("id")]
	st.mu.Unlock()
	if f == nil {
		apiError(w, http.StatusNotFound, "No such File object: "+r.PathValue("id"), "invalid_request_error", "id", "")
	}
	return f
}

// serveFile serves GET /v1/files/{id}: the file object.
func (s *Server) serveFile(w http.ResponseWriter, r *http.Request, _ dialect) {
	if f := s.lookupFile(w, r); f != nil {
		writeJSON(w, http.StatusOK, f.object())
	}
}

// serveFileContent serves GET /v1/files/{id}/content: the file's bytes.
func (s *Server) serveFileContent(w http.ResponseWriter, r *http.Request, _ dialect) {
	f := s.lookupFile(w, r)
	if f == nil {
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(f.data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(f.data)
}

// serveFileDelete serves DELETE /v1/files/{id}. A batch keeps what it read
// of a deleted input file.
func (s *Server) serveFileDelete(w http.ResponseWriter, r *http.Request, _ dialect) {
	st := s.bat
	id := r.PathValue("id")
	st.mu.Lock()
	s.advanceBatchesLocked(s.cfg.Now())
	_, ok := st.files[id]
	delete(st.files, id)
	st.mu.Unlock()
	if !ok {
		apiError(w, http.StatusNotFound, "No such File object: "+id, "invalid_request_error", "id", "")
		return
	}
	writeJSON(w, http.StatusOK, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "file", true})
}

// serveFileList serves GET /v1/files: the files, newest first (order=asc
// for oldest first), of one purpose when ?purpose= names it, at most
// ?limit= (default and most 10,000), as OpenAI's list object.
func (s *Server) serveFileList(w http.ResponseWriter, r *http.Request, _ dialect) {
	q := r.URL.Query()
	limit := 10000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			apiError(w, http.StatusBadRequest, "Invalid 'limit': must be an integer within [1, 10000].", "invalid_request_error", "limit", "invalid_value")
			return
		}
		limit = n
	}
	order := q.Get("order")
	if order != "" && order != "asc" && order != "desc" {
		apiError(w, http.StatusBadRequest, "Invalid 'order': must be asc or desc.", "invalid_request_error", "order", "invalid_value")
		return
	}
	st := s.bat
	st.mu.Lock()
	s.advanceBatchesLocked(s.cfg.Now())
	files := make([]*file, 0, len(st.files))
	for _, f := range st.files {
		if p := q.Get("purpose"); p == "" || f.purpose == p {
			files = append(files, f)
		}
	}
	st.mu.Unlock()
	slices.SortFunc(files, func(a, b *file) int {
		c := a.created.Compare(b.created)
		if c == 0 {
			c = strings.Compare(a.id, b.id)
		}
		if order != "asc" {
			c = -c
		}
		return c
	})
	list := struct {
		Object  string       `json:"object"`
		Data    []fileObject `json:"data"`
		HasMore bool         `json:"has_more"`
	}{Object: "list", Data: []fileObject{}, HasMore: len(files) > limit}
	for _, f := range files[:min(limit, len(files))] {
		list.Data = append(list.Data, f.object())
	}
	writeJSON(w, http.StatusOK, list)
}
