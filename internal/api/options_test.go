package api_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/api"
)

// badOption is options with one field negative, and the field's name.
type badOption[O any] struct {
	field string
	opts  O
}

// A negative option is an error naming the field, and no Server; the zero
// value builds one.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []badOption[api.Options]{
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

// A readiness check without a name or a function, or whose name another
// check or a field of /readyz's answer has, is an error naming it.
func TestReadyChecksValidate(t *testing.T) {
	t.Parallel()
	ping := func(context.Context) error { return nil }
	for _, tc := range []struct {
		field  string
		checks []api.ReadyCheck
	}{
		{"ReadyChecks[0]", []api.ReadyCheck{{Check: ping}}},
		{"ReadyChecks[1]", []api.ReadyCheck{{Name: "redis", Check: ping}, {Name: "database"}}},
		{"ReadyChecks[1].Name \"redis\"", []api.ReadyCheck{{Name: "redis", Check: ping}, {Name: "redis", Check: ping}}},
		{"ReadyChecks[0].Name \"status\"", []api.ReadyCheck{{Name: "status", Check: ping}}},
	} {
		s, err := api.New(api.Deps{ReadyChecks: tc.checks}, api.Options{})
		if err == nil || s != nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New: %v, %v; want an error naming %s", s, err, tc.field)
		}
	}
}

// enableRefuses checks that enable, given each bad option, returns an
// error naming its field and leaves pattern unserved, and that given the
// zero options it serves pattern.
func enableRefuses[O any](t *testing.T, enable func(*api.Server, O) error, pattern string, bad []badOption[O]) {
	t.Helper()
	method, path, _ := strings.Cut(pattern, " ")
	try := func(opts O) (served string, err error) {
		s, err := api.New(api.Deps{}, api.Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = enable(s, opts)
		_, served = s.Mux().Handler(httptest.NewRequest(method, path, nil))
		return served, err
	}
	for _, tc := range bad {
		served, err := try(tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v; want an error naming %s", tc.field, err, tc.field)
		}
		if served == pattern {
			t.Errorf("%s: refused, and serves %s", tc.field, pattern)
		}
	}
	var zero O
	if served, err := try(zero); err != nil || served != pattern {
		t.Errorf("zero options: %v, and %s is served by %q", err, pattern, served)
	}
}

// A negative option is an error naming the field, and no Files or Batch
// API: its paths stay unknown URLs.
func TestBatchOptionsValidate(t *testing.T) {
	t.Parallel()
	enableRefuses(t, func(s *api.Server, o api.BatchOptions) error { return s.EnableBatches(nil, o) }, "GET /v1/files",
		[]badOption[api.BatchOptions]{
			{"BatchOptions.MaxFileBytes", api.BatchOptions{MaxFileBytes: -1}},
			{"BatchOptions.MaxFileLines", api.BatchOptions{MaxFileLines: -1}},
		})
}

// A negative option is an error naming the field, and no synchronous
// endpoints.
func TestSyncOptionsValidate(t *testing.T) {
	t.Parallel()
	enableRefuses(t, func(s *api.Server, o api.SyncOptions) error { return s.EnableSync(nil, o) }, "GET /v1/models",
		[]badOption[api.SyncOptions]{
			{"SyncOptions.MaxWait", api.SyncOptions{MaxWait: -1}},
		})
}
