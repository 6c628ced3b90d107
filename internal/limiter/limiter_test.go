package limiter

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// must is testutil.Must.
func must[T any](v T, err error) T { return testutil.Must(v, err) }

// A bad option is an error naming the field, from every constructor, and no
// limiter.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	bad := Options{Keys: rkeys.New("x"), ProbeTimeout: -1}
	if tb, err := NewTokenBucket(nil, bad); err == nil || tb != nil || !strings.Contains(err.Error(), "Options.ProbeTimeout") {
		t.Errorf("NewTokenBucket: %v, %v; want an error naming Options.ProbeTimeout", tb, err)
	}
	if _, err := NewWindows(nil, Options{Jitter: -1}); err == nil || !strings.Contains(err.Error(), "Options.Jitter") {
		t.Errorf("NewWindows: %v; want an error naming Options.Jitter", err)
	}
	if _, err := must(NewWindows(nil, Options{})).NewLease(WindowSet{}, WindowLeaseOptions{Size: -1}); err == nil ||
		!strings.Contains(err.Error(), "WindowLeaseOptions.Size") {
		t.Errorf("Windows.NewLease: %v; want an error naming WindowLeaseOptions.Size", err)
	}
}
