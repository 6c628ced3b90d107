package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/wire"
)

// The backstop of the checks that name the param: a value that reached
// Postgres and was refused there (here a read's, which the store returns
// unclassified) is a 400 in the error shape, not a 500.
func TestValueTheDatabaseRefusesIsBadRequest(t *testing.T) {
	t.Parallel()
	db, err := store.OpenMigrated(t.Context(), testutil.Postgres(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := New(Deps{Store: db}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := s.plain(func(w http.ResponseWriter, r *http.Request) error {
		_, err := s.Store.JobGetForTenant(r.Context(), "ten_x", "job_\x00")
		return err
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/jobs/x", nil))
	var e client.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
	}
	if rec.Code != http.StatusBadRequest || e.ErrorObject.Type != wire.TypeInvalidRequest || e.ErrorObject.Code != "invalid_value" || e.ErrorObject.Message == "" {
		t.Fatalf("answer: %d %s", rec.Code, rec.Body)
	}
}
