package api

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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
	if rec.Code != http.StatusBadRequest || e.ErrorObject.Type != wire.TypeInvalidRequest || e.ErrorObject.Code != client.CodeInvalidValue || e.ErrorObject.Message == "" {
		t.Fatalf("answer: %d %s", rec.Code, rec.Body)
	}
}

// SQLite locked by another process past its busy timeout cannot serve now,
// as a Postgres that does not answer: a 503 database_unavailable with
// Retry-After, not a 500.
func TestDatabaseBusyIsUnavailable(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "llmq.db")
	db, err := store.OpenMigrated(t.Context(), "sqlite://"+path+"?_busy_timeout=50", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	other, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(t.Context(), `UPDATE tenants SET name = name`); err != nil {
		t.Fatal(err)
	}
	s, err := New(Deps{Store: db}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := s.plain(func(w http.ResponseWriter, r *http.Request) error {
		_, err := s.Store.TenantInsert(r.Context(), &store.TenantInsertParams{Name: "acme", Tier: "standard"})
		return err
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/admin/v1/tenants", nil))
	var e client.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
	}
	if rec.Code != http.StatusServiceUnavailable || e.ErrorObject.Type != wire.TypeUnavailable || e.ErrorObject.Code != client.CodeDatabaseUnavailable ||
		rec.Header().Get("Retry-After") != "5" || strings.Contains(rec.Body.String(), "locked") || strings.Contains(rec.Body.String(), path) {
		t.Fatalf("answer: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}
