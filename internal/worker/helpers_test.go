package worker_test

import (
	"context"
	"testing"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
)

var costOne = limiter.Cost{Requests: 1}

func limiterCost(requests, tokens int64) limiter.Cost {
	return limiter.Cost{Requests: requests, Tokens: tokens}
}

func scopeOf(m *config.Model) limiter.Scope { return admission.Scope(m.Routes()[0]) }

// clearPenalty forgets the chat model's limiter state (its penalty and
// probe), as if the announced reset had passed.
func clearPenalty(t *testing.T, a *apptest.App) {
	t.Helper()
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	if err := a.Redis.Del(context.Background(), a.Keys.LimiterScope(m.Routes()[0].Deployment.Name())).Err(); err != nil {
		t.Fatal(err)
	}
}
