package worker_test

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/worker"
)

// A negative option is an error naming the field, and no Handler; the zero
// value builds one.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		opts  worker.Options
	}{
		{"Options.MaxInlineWait", worker.Options{MaxInlineWait: -1}},
		{"Options.MaxRateLimited", worker.Options{MaxRateLimited: -1}},
		{"Options.TenantCacheTTL", worker.Options{TenantCacheTTL: -1}},
		{"BreakerOptions.Failures", worker.Options{Breakers: worker.BreakerOptions{Failures: -1}}},
	} {
		h, err := worker.NewHandler(worker.Deps{}, tc.opts)
		if err == nil || h != nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("NewHandler: %v, %v; want an error naming %s", h, err, tc.field)
		}
	}
	if h, err := worker.NewHandler(worker.Deps{}, worker.Options{}); err != nil || h == nil {
		t.Errorf("NewHandler with the zero Options: %v, %v", h, err)
	}
}

// A negative option is an error naming the field, and no Breakers; the zero
// value builds them.
func TestBreakerOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		opts  worker.BreakerOptions
	}{
		{"BreakerOptions.Failures", worker.BreakerOptions{Failures: -1}},
		{"BreakerOptions.Cooldown", worker.BreakerOptions{Cooldown: -1}},
		{"BreakerOptions.MaxCooldown", worker.BreakerOptions{MaxCooldown: -1}},
	} {
		bs, err := worker.NewBreakers(tc.opts, nil, nil)
		if err == nil || bs != nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("NewBreakers: %v, %v; want an error naming %s", bs, err, tc.field)
		}
	}
	if bs, err := worker.NewBreakers(worker.BreakerOptions{}, nil, nil); err != nil || bs == nil {
		t.Errorf("NewBreakers with the zero BreakerOptions: %v, %v", bs, err)
	}
}
