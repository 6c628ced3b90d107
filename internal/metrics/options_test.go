package metrics_test

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/metrics"
)

// A bad option is an error naming the field, and no Recorder or State.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	if r, err := metrics.New(metrics.Options{FlushInterval: -1}); err == nil || r != nil || !strings.Contains(err.Error(), "Options.FlushInterval") {
		t.Errorf("New: %v, %v; want an error naming Options.FlushInterval", r, err)
	}
	if s, err := metrics.NewState(metrics.StateDeps{}, metrics.StateOptions{Concurrency: -1}); err == nil || s != nil ||
		!strings.Contains(err.Error(), "StateOptions.Concurrency") {
		t.Errorf("NewState: %v, %v; want an error naming StateOptions.Concurrency", s, err)
	}
}
