package api_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/api"
)

// A negative option is an error naming the field, and no Server; the zero
// value builds one.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		opts  api.Options
	}{
		{"Options.MaxBodyBytes", api.Options{MaxBodyBytes: -1}},
	} {
		s, err := api.New(api.Deps{}, tc.opts)
		if err == nil || s != nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New: %v, %v; want an error naming %s", s, err, tc.field)
		}
	}
	if s, err := api.New(api.Deps{}, api.Options{}); err != nil || s == nil {
		t.Errorf("New with the zero Options: %v, %v", s, err)
	}
}

// A negative option is an error naming the field, and no Files or Batch
// API: its paths stay unknown URLs; the zero value serves them.
func TestBatchOptionsValidate(t *testing.T) {
	t.Parallel()
	const files = "GET /v1/files"
	pattern := func(s *api.Server) string {
		_, p := s.Mux().Handler(httptest.NewRequest("GET", "/v1/files", nil))
		return p
	}
	for _, tc := range []struct {
		field string
		opts  api.BatchOptions
	}{
		{"BatchOptions.MaxFileBytes", api.BatchOptions{MaxFileBytes: -1}},
		{"BatchOptions.MaxFileLines", api.BatchOptions{MaxFileLines: -1}},
	} {
		s, err := api.New(api.Deps{}, api.Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = s.EnableBatches(nil, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("EnableBatches: %v; want an error naming %s", err, tc.field)
		}
		if got := pattern(s); got == files {
			t.Errorf("EnableBatches failed and serves %s", files)
		}
	}
	s, err := api.New(api.Deps{}, api.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnableBatches(nil, api.BatchOptions{}); err != nil {
		t.Fatalf("EnableBatches with the zero BatchOptions: %v", err)
	}
	if got := pattern(s); got != files {
		t.Errorf("GET /v1/files is served by %q, want %q", got, files)
	}
}
