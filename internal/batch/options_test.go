package batch_test

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/batch"
)

// A bad option is an error naming the field, and no Service.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	svc, err := batch.New(batch.Deps{}, batch.Options{StopGrace: -1})
	if err == nil || svc != nil || !strings.Contains(err.Error(), "Options.StopGrace") {
		t.Fatalf("New: %v, %v; want an error naming Options.StopGrace", svc, err)
	}
}
