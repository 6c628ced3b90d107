package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/money"
)

// deploymentsPolicy is the shape docs/DESIGN gives: one model on three
// deployments (two organisations and an Azure deployment) with a fallback.
const deploymentsPolicy = `providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key_env: OPENAI_API_KEY
  - name: openai-b
    base_url: https://api.openai.com/v1
    api_key_env: OPENAI_API_KEY_B
  - name: azure-east
    kind: azure
    base_url: https://east.openai.azure.com
    api_key_env: AZURE_OPENAI_KEY
models:
  - name: gpt-4o
    price: {input_per_mtok: 2.50, output_per_mtok: 10.00}
    deployments:
      - {provider: openai, upstream: gpt-4o, limits: {rpm: 500, tpm: 30000}, order: 1}
      - {provider: openai-b, upstream: gpt-4o, limits: {rpm: 500, tpm: 30000}, order: 1, weight: 2}
      - provider: azure-east
        upstream: my-gpt4o-deployment
        limits: {rpm: 120, tpm: 20000, burst: 1s}
        order: 2
        price: {input_per_mtok: 2.75, output_per_mtok: 11.00}
    fallbacks: [gpt-4o-mini]
  - name: gpt-4o-mini
    provider: openai
    limits: {rpm: 500, tpm: 200000}
tiers:
  - name: standard
    daily_budget_usd: 50
    api_rps: 50
    fallbacks: [gpt-4o-mini, gpt-4o]
`

func TestParsePolicyDeployments(t *testing.T) {
	t.Parallel()
	p := mustParse(t, deploymentsPolicy)
	m, ok := p.Model("gpt-4o")
	if !ok {
		t.Fatal("gpt-4o missing")
	}
	if len(m.Deployments) != 3 {
		t.Fatalf("deployments = %d, want 3", len(m.Deployments))
	}
	model := money.Price{InputPerMTok: 2_500_000, OutputPerMTok: 10_000_000}
	azure := money.Price{InputPerMTok: 2_750_000, OutputPerMTok: 11_000_000}
	want := []struct {
		name          string
		order, weight int
		rpm, tpm      int64
		price         money.Price
	}{
		{"openai/gpt-4o", 1, 1, 500, 30000, model},
		{"openai-b/gpt-4o", 1, 2, 500, 30000, model},
		{"azure-east/my-gpt4o-deployment", 2, 1, 120, 20000, azure},
	}
	routes := m.Routes()
	for i, w := range want {
		d := m.Deployments[i]
		if d.Name() != w.name || d.Order != w.order || d.Weight != w.weight || d.Limits.RPM != w.rpm || d.Limits.TPM != w.tpm || !reflect.DeepEqual(d.Price, w.price) {
			t.Errorf("deployments[%d] = %+v (%s), want %+v", i, d, d.Name(), w)
		}
		r := routes[i]
		if r.Model != m || r.Model.Name != "gpt-4o" || r.Provider+"/"+r.Upstream != w.name || r.Limits != d.Limits || !reflect.DeepEqual(r.Price, w.price) ||
			r.Deployment != &m.Deployments[i] || r.MaxOutputTokens != m.MaxOutputTokens {
			t.Errorf("routes[%d] = %+v, want deployment %s", i, r, w.name)
		}
		if got, ok := m.Route(w.name); !ok || got != r {
			t.Errorf("Route(%q) = %v, %v", w.name, got, ok)
		}
	}
	if m.Deployments[2].Limits.Burst.String() != "1s" || m.Deployments[0].Limits.Burst != DefaultBurst {
		t.Errorf("bursts = %v, %v", m.Deployments[2].Limits.Burst, m.Deployments[0].Limits.Burst)
	}
	// The model is owned, for clients, by its first deployment's provider;
	// its jobs wait in a queue of their own (several deployments).
	if m.OwnedBy() != "openai" || m.Queue() != "model:gpt-4o" {
		t.Errorf("owned by %s, queue %s", m.OwnedBy(), m.Queue())
	}
	if len(m.Fallbacks) != 1 || m.Fallbacks[0] != "gpt-4o-mini" {
		t.Errorf("fallbacks = %v", m.Fallbacks)
	}
	if tier, _ := p.Tier("standard"); len(tier.Fallbacks) != 2 || tier.Fallbacks[1] != "gpt-4o" {
		t.Errorf("tier fallbacks = %v", tier.Fallbacks)
	}
	// The short form is one deployment.
	mini, _ := p.Model("gpt-4o-mini")
	if len(mini.Deployments) != 1 || mini.Deployments[0].Name() != "openai/gpt-4o-mini" || mini.Deployments[0].Weight != 1 ||
		len(mini.Routes()) != 1 || mini.Routes()[0].Limits != mini.Deployments[0].Limits || !reflect.DeepEqual(mini.Deployments[0].Price, money.DefaultPrices["gpt-4o-mini"]) ||
		mini.Queue() != "openai/gpt-4o-mini" {
		t.Errorf("short form = %+v", mini)
	}
	if _, ok := m.Route("openai/gpt-4o-mini"); ok {
		t.Error("Route found a deployment of another model")
	}
}

func TestParsePolicyDeploymentsShared(t *testing.T) {
	t.Parallel()
	// Two models may name one deployment when they agree on its limits:
	// they share its scope.
	yml := strings.Replace(deploymentsPolicy, "  - name: gpt-4o-mini\n", `  - name: gpt-4o-b
    price: {input_per_mtok: 2.50, output_per_mtok: 10.00}
    deployments:
      - {provider: openai-b, upstream: gpt-4o, limits: {rpm: 500, tpm: 30000}}
  - name: gpt-4o-mini
`, 1)
	p := mustParse(t, yml)
	a, _ := p.Model("gpt-4o")
	b, _ := p.Model("gpt-4o-b")
	if a.Deployments[1].Name() != b.Deployments[0].Name() {
		t.Fatalf("not shared: %s, %s", a.Deployments[1].Name(), b.Deployments[0].Name())
	}
}

func TestParsePolicyDeploymentErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, old, new, field, msg string }{
		{"both forms", "    fallbacks: [gpt-4o-mini]\n", "    fallbacks: [gpt-4o-mini]\n    provider: openai\n",
			"models[0].deployments", "either provider, upstream and limits or a list of deployments"},
		{"unknown provider", "{provider: openai, upstream: gpt-4o,", "{provider: opnai, upstream: gpt-4o,", "models[0].deployments[0].provider", `unknown provider "opnai"`},
		{"no provider", "{provider: openai, upstream: gpt-4o,", "{upstream: gpt-4o,", "models[0].deployments[0].provider", "required"},
		{"twice", "{provider: openai-b, upstream: gpt-4o,", "{provider: openai, upstream: gpt-4o,", "models[0].deployments[1].upstream", "already deployments[0]"},
		{"negative order", "order: 1, weight: 2}", "order: -1, weight: 2}", "models[0].deployments[1].order", "must be 0 or more, got -1"},
		{"zero weight", "order: 1, weight: 2}", "order: 1, weight: 0}", "models[0].deployments[1].weight", "must be within 1 and 1000, got 0"},
		{"negative limit", "limits: {rpm: 120, tpm: 20000, burst: 1s}", "limits: {rpm: -1, tpm: 20000}", "models[0].deployments[2].limits.rpm", "must be 0 or more"},
		{"bad burst", "burst: 1s}", "burst: 2m}", "models[0].deployments[2].limits.burst", "within 1ms and 1m"},
		{"output over tpm", "limits: {rpm: 120, tpm: 20000, burst: 1s}", "limits: {rpm: 120, tpm: 2000}", "models[0].deployments[2].limits.tpm",
			"max_output_tokens 4096 is more than limits.tpm (2000) of azure-east/my-gpt4o-deployment"},
		{"negative input limit", "limits: {rpm: 120, tpm: 20000, burst: 1s}", "limits: {rpm: 120, itpm: -5}", "models[0].deployments[2].limits.itpm", "must be 0 or more, got -5"},
		{"output over otpm", "limits: {rpm: 120, tpm: 20000, burst: 1s}", "limits: {rpm: 120, otpm: 4000}", "models[0].deployments[2].limits.otpm",
			"max_output_tokens 4096 is more than limits.otpm (4000) of azure-east/my-gpt4o-deployment"},
		{"cache reads unknown", "limits: {rpm: 120, tpm: 20000, burst: 1s}", "limits: {rpm: 120, cache_reads: cheap}", "models[0].deployments[2].limits.cache_reads",
			`must be "counted" or "free", got "cheap"`},
		{"price without output", "price: {input_per_mtok: 2.75, output_per_mtok: 11.00}", "price: {input_per_mtok: 2.75}",
			"models[0].deployments[2].price.output_per_mtok", "required for a chat model"},
		{"unknown fallback", "fallbacks: [gpt-4o-mini]", "fallbacks: [gpt-5]", "models[0].fallbacks[0]", `unknown model "gpt-5"`},
		{"own fallback", "fallbacks: [gpt-4o-mini]", "fallbacks: [gpt-4o]", "models[0].fallbacks[0]", "its own fallback"},
		{"fallback twice", "fallbacks: [gpt-4o-mini]", "fallbacks: [gpt-4o-mini, gpt-4o-mini]", "models[0].fallbacks[1]", "named twice"},
		{"tier fallback unknown", "fallbacks: [gpt-4o-mini, gpt-4o]", "fallbacks: [gpt-4o-mini, gpt-5]", "tiers[0].fallbacks[1]", `unknown model "gpt-5"`},
		{"fallback of another kind", "    limits: {rpm: 500, tpm: 200000}\n", "    limits: {rpm: 500, tpm: 200000}\n    kind: embedding\n",
			"models[0].fallbacks[0]", `"gpt-4o-mini" is a embedding model`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if strings.Count(deploymentsPolicy, c.old) != 1 {
				t.Fatalf("%q occurs %d times", c.old, strings.Count(deploymentsPolicy, c.old))
			}
			_, err := ParsePolicy([]byte(strings.Replace(deploymentsPolicy, c.old, c.new, 1)))
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

// A deployment's limits are named dimensions: requests per second, minute
// and day, tokens all told, input and output tokens per minute and day,
// each its bucket; cache reads count as the provider's kind documents
// (OpenAI and Azure: counted) unless the deployment says otherwise.
func TestParsePolicyLimitDimensions(t *testing.T) {
	t.Parallel()
	yml := strings.Replace(deploymentsPolicy, "limits: {rpm: 120, tpm: 20000, burst: 1s}",
		"limits: {rpm: 120, rpd: 5000, itpm: 40000, itpd: 900000, otpm: 8000, otpd: 100000, cache_reads: free}", 1)
	p := mustParse(t, yml)
	m, _ := p.Model("gpt-4o")
	want := Limits{RPM: 120, RPD: 5000, ITPM: 40000, ITPD: 900000, OTPM: 8000, OTPD: 100000, CacheReadsFree: true, Burst: DefaultBurst}
	if got := m.Deployments[2].Limits; got != want {
		t.Fatalf("limits = %+v, want %+v", got, want)
	}
	if m.Deployments[0].Limits.CacheReadsFree || m.Deployments[1].Limits.CacheReadsFree {
		t.Fatalf("an openai deployment counts cache reads by default: %+v", m.Deployments[:2])
	}
}
