package webhook_test

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/webhook"
)

// A bad option is an error naming the field, and no Handler.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	h, err := webhook.NewHandler(webhook.Deps{}, webhook.Options{Timeout: -1})
	if err == nil || h != nil || !strings.Contains(err.Error(), "Options.Timeout") {
		t.Fatalf("NewHandler: %v, %v; want an error naming Options.Timeout", h, err)
	}
}
