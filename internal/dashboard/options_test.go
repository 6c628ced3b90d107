package dashboard_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/dashboard"
)

// A bad option is an error naming the field, and no Server.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	s, err := dashboard.New(dashboard.Deps{IsAdmin: func(*http.Request) bool { return true }}, dashboard.Options{MaxBatches: -1})
	if err == nil || s != nil || !strings.Contains(err.Error(), "Options.MaxBatches") {
		t.Fatalf("New: %v, %v; want an error naming Options.MaxBatches", s, err)
	}
}
