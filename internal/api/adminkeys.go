package api

import (
	"bytes"
	"io"
	"net/http"

	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// keyOptions are the settings of a key the admin API may set: at creation
// (POST /admin/v1/tenants/{id}/keys, body optional) and later (PATCH
// /admin/v1/keys/{id}).
type keyOptions struct {
	// APIExempt frees the key from its tier's API rate limit (an internal
	// service's key), whatever its tenant's setting.
	APIExempt *bool `json:"api_exempt"`
}

// decodeKeyOptions reads keyOptions from r's body, which may be empty.
func (s *Server) decodeKeyOptions(w http.ResponseWriter, r *http.Request) (*keyOptions, error) {
	var o keyOptions
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return &o, nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &o); err != nil {
		return nil, err
	}
	return &o, nil
}

// updateKey changes a key's settings: PATCH /admin/v1/keys/{id}
// {"api_exempt": true}.
func (s *Server) updateKey(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, ids.Key, "api key")
	if err != nil {
		return err
	}
	o, err := s.decodeKeyOptions(w, r)
	if err != nil {
		return err
	}
	k, err := s.Store.APIKeyUpdate(r.Context(), &store.APIKeyUpdateParams{ID: id, APIExempt: o.APIExempt})
	if err != nil {
		return missingAs(err, "api key", id)
	}
	s.keysChanged(r.Context())
	s.Logger.Info("api key updated", "key", k.ID, "api_exempt", k.APIExempt)
	return writeOK(w, wire.APIKey(k))
}
