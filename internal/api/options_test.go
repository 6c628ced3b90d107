package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/api"
)

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
