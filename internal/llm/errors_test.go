package llm_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/llm"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	cases := map[int]llm.Class{
		200: llm.ClassNone, 201: llm.ClassNone,
		301: llm.ClassPermanent, 400: llm.ClassPermanent, 401: llm.ClassPermanent, 403: llm.ClassPermanent,
		404: llm.ClassPermanent, 413: llm.ClassPermanent, 422: llm.ClassPermanent,
		408: llm.ClassRetryable, 409: llm.ClassRetryable, 500: llm.ClassRetryable, 502: llm.ClassRetryable,
		503: llm.ClassRetryable, 504: llm.ClassRetryable,
		429: llm.ClassRateLimited,
	}
	for status, want := range cases {
		if got := llm.Classify(status); got != want {
			t.Errorf("Classify(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestErrorTextHidesKeys(t *testing.T) {
	t.Parallel()
	e := &llm.Error{
		Class: llm.ClassPermanent, Provider: "openai", StatusCode: 401, Code: client.CodeInvalidAPIKey,
		Message: "Incorrect API key provided: sk-proj-abcdefghijklmnop1234.",
		Err:     errors.New("dial with sk-live_ABCDEFGH12345678 failed"),
	}
	s := e.Error()
	for _, secret := range []string{"abcdefghijklmnop1234", "ABCDEFGH12345678"} {
		if strings.Contains(s, secret) {
			t.Errorf("Error() = %q holds a key", s)
		}
	}
	if !strings.Contains(s, "401") || !strings.Contains(s, string(client.CodeInvalidAPIKey)) || !strings.Contains(s, "openai") {
		t.Errorf("Error() = %q lacks status, code or provider", s)
	}
}
