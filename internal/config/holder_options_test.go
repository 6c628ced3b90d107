package config

import (
	"strings"
	"testing"
)

// A bad option is an error naming the field, and no holder.
func TestHolderOptionsValidate(t *testing.T) {
	t.Parallel()
	h, err := NewPolicyHolder("does-not-matter.yaml", &HolderOptions{PollInterval: -1})
	if err == nil || h != nil || !strings.Contains(err.Error(), "HolderOptions.PollInterval") {
		t.Fatalf("NewPolicyHolder: %v, %v; want an error naming HolderOptions.PollInterval", h, err)
	}
}
