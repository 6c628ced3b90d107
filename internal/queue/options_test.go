package queue

import (
	"strings"
	"testing"
)

// A bad option is an error naming the field, and no Client.
func TestClientOptionsValidate(t *testing.T) {
	t.Parallel()
	c, err := NewClient(nil, ClientOptions{EnqueueConcurrency: -1})
	if err == nil || c != nil || !strings.Contains(err.Error(), "ClientOptions.EnqueueConcurrency") {
		t.Fatalf("NewClient: %v, %v; want an error naming ClientOptions.EnqueueConcurrency", c, err)
	}
}
