package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/money"
)

// anthropicPolicy deploys one Claude model on Anthropic beside an OpenAI
// model.
const anthropicPolicy = `providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key_env: OPENAI_API_KEY
  - name: anthropic
    kind: anthropic
    api_key_env: ANTHROPIC_API_KEY
models:
  - name: claude
    provider: anthropic
    upstream: claude-sonnet-4-5
    limits: {rpm: 50, tpm: 100000}
  - name: haiku
    provider: anthropic
    upstream: claude-haiku-4-5
    price: {input_per_mtok: 1, output_per_mtok: 5, cache_write_1h_per_mtok: 1.5}
    limits: {rpm: 50}
  - name: gpt-4o-mini
    provider: openai
    limits: {rpm: 500}
tiers:
  - name: standard
    daily_budget_usd: 50
    api_rps: 50
`

// An anthropic provider defaults its base URL and anthropic-version and
// offers no OpenAI Batch API; its models serve the Messages API, priced
// with Anthropic's cache writes and reads where the policy gives none.
func TestParsePolicyAnthropic(t *testing.T) {
	t.Parallel()
	p := mustParse(t, anthropicPolicy)
	pr, _ := p.Provider("anthropic")
	if pr.Kind != ProviderAnthropic || pr.BaseURL != "https://api.anthropic.com" || pr.APIVersion != "2023-06-01" || pr.BatchAPI {
		t.Errorf("provider = %+v, want Anthropic's base URL, version 2023-06-01, no Batch API", pr)
	}
	claude, _ := p.Model("claude")
	if !claude.Anthropic {
		t.Error("claude is not served by the Messages API")
	}
	if want := money.DefaultPrices["claude-sonnet-4-5"]; claude.Deployments[0].Price.InputPerMTok != 3_000_000 ||
		claude.Deployments[0].Price.CacheWrite5mPerMTok != 3_750_000 || claude.Deployments[0].Price.CacheWrite1hPerMTok != 6_000_000 ||
		claude.Deployments[0].Price.CachedInputPerMTok != 300_000 || want.CacheWrite5mPerMTok != 3_750_000 {
		t.Errorf("claude's price = %+v", claude.Deployments[0].Price)
	}
	haiku, _ := p.Model("haiku")
	if got := haiku.Deployments[0].Price; got.CacheWrite1hPerMTok != 1_500_000 || got.CacheWrite5mPerMTok != 1_250_000 || got.CachedInputPerMTok != 100_000 {
		t.Errorf("haiku's price = %+v, want its 1h write kept, 5m write and read Anthropic's", got)
	}
	if gpt, _ := p.Model("gpt-4o-mini"); gpt.Anthropic || gpt.Deployments[0].Price.CacheWrite5mPerMTok != 0 {
		t.Errorf("gpt-4o-mini = %+v, want OpenAI's API and price", gpt)
	}
	withVersion := strings.Replace(anthropicPolicy, "    kind: anthropic\n", "    kind: anthropic\n    api_version: 2024-01-01\n    base_url: http://127.0.0.1:9000\n", 1)
	pr, _ = mustParse(t, withVersion).Provider("anthropic")
	if pr.APIVersion != "2024-01-01" || pr.BaseURL != "http://127.0.0.1:9000" {
		t.Errorf("provider = %+v, want the policy's version and base URL", pr)
	}
}

func TestParsePolicyAnthropicErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, old, new, field, msg string }{
		{"batch api", "    kind: anthropic\n", "    kind: anthropic\n    batch_api: true\n", "providers[1].batch_api", "does not offer"},
		{"version", "    kind: anthropic\n", "    kind: anthropic\n    api_version: latest\n", "providers[1].api_version",
			`must be an anthropic-version such as 2023-06-01, got "latest"`},
		{"mixed deployments", "    provider: anthropic\n    upstream: claude-haiku-4-5\n    price: {input_per_mtok: 1, output_per_mtok: 5, cache_write_1h_per_mtok: 1.5}\n    limits: {rpm: 50}\n",
			"    price: {input_per_mtok: 1, output_per_mtok: 5}\n    deployments:\n      - {provider: anthropic, upstream: claude-haiku-4-5}\n      - {provider: openai, upstream: gpt-4o-mini}\n",
			"models[1].deployments[1].provider", "a model's deployments are all on anthropic providers or none"},
		{"embedding", "  - name: haiku\n", "  - name: haiku\n    kind: embedding\n", "models[1].provider", "serves no embedding model"},
		{"fallback across APIs", "    limits: {rpm: 500}\n", "    limits: {rpm: 500}\n    fallbacks: [claude]\n", "models[2].fallbacks[0]",
			"served by different APIs"},
		{"negative cache write", "cache_write_1h_per_mtok: 1.5}", "cache_write_1h_per_mtok: -1}", "models[1].price.cache_write_1h_per_mtok", "must be 0 or more"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if n := strings.Count(anthropicPolicy, c.old); n != 1 {
				t.Fatalf("%q occurs %d times", c.old, n)
			}
			_, err := ParsePolicy([]byte(strings.Replace(anthropicPolicy, c.old, c.new, 1)))
			var pe *PolicyError
			if !errors.As(err, &pe) {
				t.Fatalf("error = %v, want a *PolicyError", err)
			}
			if pe.Field != c.field || !strings.Contains(pe.Msg, c.msg) {
				t.Errorf("error = %v; want field %q and %q", err, c.field, c.msg)
			}
		})
	}
}
