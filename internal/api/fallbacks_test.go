package api_test

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
)

// fallbacksPolicy adds gpt-4o, which the standard tier allows jobs to name
// as their fallback; the free tier allows none.
var fallbacksPolicy = strings.NewReplacer(
	"  - name: text-embedding-3-small\n", `  - name: gpt-4o
    provider: sim
    price: {input_per_mtok: 2.50, output_per_mtok: 10.00}
    limits: {rpm: 3000, tpm: 300000}
    max_output_tokens: 1024
  - name: text-embedding-3-small
`,
	"  - name: standard\n    daily_budget_usd: 50\n", "  - name: standard\n    daily_budget_usd: 50\n    fallbacks: [gpt-4o, text-embedding-3-small]\n",
).Replace(apptest.PolicyYAML)

// A job may name its own fallbacks from those its tier allows; its worst
// case is the dearest of them. Anything else is a 400 naming fallbacks,
// and nothing is queued.
func TestJobFallbacks(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: fallbacksPolicy})
	_, key := a.Tenant("standard")
	plain := a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("hi", "", 100)}).Map(t)
	r := a.Do("POST", "/v1/jobs", key, map[string]any{"body": apptest.ChatBody("hi", "", 100), "fallbacks": []string{"gpt-4o"}})
	if r.Status != 202 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	j := r.Map(t)
	if fb, _ := j["fallbacks"].([]any); len(fb) != 1 || fb[0] != "gpt-4o" {
		t.Fatalf("fallbacks = %v", j["fallbacks"])
	}
	// gpt-4o costs about 17 times gpt-4o-mini: the estimate holds the dearer.
	if got, base := j["estimate"].(map[string]any)["cost_usd"].(float64), plain["estimate"].(map[string]any)["cost_usd"].(float64); got < 10*base {
		t.Fatalf("estimate $%v with a gpt-4o fallback, $%v without", got, base)
	}
	if got := a.Do("GET", "/v1/jobs/"+j["id"].(string), key, nil).Map(t)["fallbacks"].([]any); len(got) != 1 {
		t.Fatalf("stored fallbacks = %v", got)
	}

	freeTenant, freeKey := a.Tenant("free")
	stdTenant, stdKey := a.Tenant("standard")
	for _, c := range []struct {
		name, key string
		fallbacks []string
		code      client.Code
	}{
		{"unknown", stdKey, []string{"gpt-5"}, client.CodeModelNotFound},
		{"tier allows none", freeKey, []string{"gpt-4o"}, client.CodeFallbackNotAllowed},
		{"other kind", stdKey, []string{"text-embedding-3-small"}, client.CodeModelNotSupported},
		{"itself", stdKey, []string{"gpt-4o-mini"}, client.CodeFallbackNotAllowed},
		{"twice", stdKey, []string{"gpt-4o", "gpt-4o"}, client.CodeInvalidValue},
		{"too many", stdKey, []string{"gpt-4o", "gpt-4o", "gpt-4o", "gpt-4o", "gpt-4o"}, client.CodeInvalidValue},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkError(t, a.Do("POST", "/v1/jobs", c.key, map[string]any{"body": apptest.ChatBody("hi", "", 10), "fallbacks": c.fallbacks}),
				400, c.code, "fallbacks")
		})
	}
	nothingQueuedFor(t, a, freeTenant)
	nothingQueuedFor(t, a, stdTenant)
}
