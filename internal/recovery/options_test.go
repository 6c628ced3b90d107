package recovery_test

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/recovery"
)

// A bad option is an error naming the field, and no Reconciler.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	r, err := recovery.New(recovery.Reconciler{}, recovery.Options{MinAge: -1})
	if err == nil || r != nil || !strings.Contains(err.Error(), "Options.MinAge") {
		t.Fatalf("New: %v, %v; want an error naming Options.MinAge", r, err)
	}
}
