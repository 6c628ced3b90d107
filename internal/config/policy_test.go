package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
)

// basePolicy is valid; each error case below changes one thing in it.
const basePolicy = `providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key_env: OPENAI_API_KEY
    timeout: 30s
  - name: local
    base_url: http://127.0.0.1:9000/v1
models:
  - name: gpt-4o-mini
    provider: openai
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 500, tpm: 200000, tpd: 0}
  - name: fast
    provider: local
    upstream: llama-3-8b
    price: {input_per_mtok: 0, output_per_mtok: 0}
    limits: {rps: 5}
  - name: text-embedding-3-small
    provider: openai
    limits: {tpm: 1000000}
tiers:
  - name: standard
    daily_budget_usd: 50
    soft_limit: 0.8
    priority: default
    on_exhausted: defer
    api_rps: 50
  - name: internal
    unlimited: true
    api_exempt: true
global_daily_budget_usd: 100
`

// edit replaces old by new in basePolicy, exactly once.
func edit(t *testing.T, old, new string) string {
	t.Helper()
	if n := strings.Count(basePolicy, old); n != 1 {
		t.Fatalf("edit: %q occurs %d times in basePolicy, want 1", old, n)
	}
	return strings.Replace(basePolicy, old, new, 1)
}

func mustParse(t *testing.T, yml string) *Policy {
	t.Helper()
	p, err := ParsePolicy([]byte(yml))
	if err != nil {
		t.Fatalf("ParsePolicy: %v", err)
	}
	return p
}

// loadPolicy reads the policy file at path as a process does.
func loadPolicy(path string) (*Policy, error) {
	h, err := NewPolicyHolder(path, nil)
	if err != nil {
		return nil, err
	}
	return h.Current(), nil
}

func TestParsePolicyValid(t *testing.T) {
	t.Parallel()
	p := mustParse(t, basePolicy)
	if len(p.Providers) != 2 || len(p.Models) != 3 || len(p.Tiers) != 2 {
		t.Fatalf("got %d providers, %d models, %d tiers; want 2, 3, 2", len(p.Providers), len(p.Models), len(p.Tiers))
	}
	if p.GlobalDailyBudget != 100*money.PerDollar {
		t.Errorf("GlobalDailyBudget = %v, want 100", p.GlobalDailyBudget)
	}
	m, ok := onlyRoute(p, "gpt-4o-mini")
	if !ok {
		t.Fatal("Model(gpt-4o-mini) not found")
	}
	wantPrice := money.Price{InputPerMTok: 150_000, OutputPerMTok: 600_000}
	if !reflect.DeepEqual(m.Price, wantPrice) {
		t.Errorf("gpt-4o-mini price = %+v, want %+v", m.Price, wantPrice)
	}
	if m.Limits != (Limits{RPM: 500, TPM: 200000, Burst: DefaultBurst}) {
		t.Errorf("gpt-4o-mini limits = %+v", m.Limits)
	}
	if pr, _ := p.Provider("openai"); pr.Timeout != 30*time.Second || pr.APIKeyEnv != "OPENAI_API_KEY" || pr.MaxResponseBytes != DefaultMaxResponseBytes {
		t.Errorf("openai = %+v", pr)
	}
	fast, _ := onlyRoute(p, "fast")
	if fast.Upstream != "llama-3-8b" || !reflect.DeepEqual(fast.Price, (money.Price{})) || fast.Limits.RPS != 5 {
		t.Errorf("fast = %+v; want upstream llama-3-8b, free, 5 rps", fast)
	}
	if len(p.Digest) != 64 {
		t.Errorf("Digest = %q, want 64 hex digits", p.Digest)
	}
}

func TestParsePolicyDefaults(t *testing.T) {
	t.Parallel()
	p := mustParse(t, basePolicy)

	local, _ := p.Provider("local")
	if local.Timeout != DefaultProviderTimeout || local.APIKeyEnv != "" {
		t.Errorf("local provider = %+v; want timeout %v and no key", local, DefaultProviderTimeout)
	}

	mini, _ := onlyRoute(p, "gpt-4o-mini")
	if mini.Upstream != "gpt-4o-mini" {
		t.Errorf("upstream = %q, want the name", mini.Upstream)
	}
	if mini.Kind != KindChat || mini.MaxOutputTokens != DefaultMaxOutputTokens || mini.Encoding != "" {
		t.Errorf("gpt-4o-mini kind %q, max output %d, encoding %q; want chat, %d, none",
			mini.Kind, mini.MaxOutputTokens, mini.Encoding, DefaultMaxOutputTokens)
	}

	emb, _ := onlyRoute(p, "text-embedding-3-small")
	if emb.Kind != KindEmbedding || emb.MaxOutputTokens != 0 {
		t.Errorf("embedding model kind %q, max output %d; want embedding, 0", emb.Kind, emb.MaxOutputTokens)
	}
	if !reflect.DeepEqual(emb.Price, money.DefaultPrices["text-embedding-3-small"]) {
		t.Errorf("embedding price = %+v, want the default table's", emb.Price)
	}

	std, _ := p.Tier("standard")
	if std.DailyBudget != 50*money.PerDollar || std.Unlimited || std.Timezone != time.UTC || std.APILimits != (APILimits{Second: 50}) {
		t.Errorf("standard = %+v", std)
	}
	in, _ := p.Tier("internal")
	if !in.Unlimited || in.DailyBudget != 0 || !in.APIExempt || !in.APILimits.IsZero() {
		t.Errorf("internal = %+v; want unlimited, exempt", in)
	}
	if std.APIAlgorithm != limiter.AlgSlidingWindow || std.APISoftLimit != DefaultAPISoftLimit || std.APILease != 0 ||
		std.APIEndpointLimits != nil || std.WebhookHostRPS != DefaultWebhookHostRPS || in.WebhookHostRPS != DefaultWebhookHostRPS {
		t.Errorf("standard's API defaults: %s, soft %v, lease %d, endpoints %v, webhooks %v/s",
			std.APIAlgorithm, std.APISoftLimit, std.APILease, std.APIEndpointLimits, std.WebhookHostRPS)
	}
	if p.AuthFailureLimits != DefaultAuthFailureLimits || DefaultAuthFailureLimits != (APILimits{Minute: 20}) {
		t.Errorf("AuthFailureLimits = %+v, want 20 a minute", p.AuthFailureLimits)
	}
	if in.SoftLimit != DefaultSoftLimit || in.Priority != queue.Default || in.OnExhausted != OnExhaustedDefer || in.Timezone != time.UTC {
		t.Errorf("internal defaults: soft %v, priority %q, on_exhausted %q, tz %v",
			in.SoftLimit, in.Priority, in.OnExhausted, in.Timezone)
	}

	noGlobal := mustParse(t, edit(t, "global_daily_budget_usd: 100\n", ""))
	if noGlobal.GlobalDailyBudget != 0 {
		t.Errorf("GlobalDailyBudget without the field = %v, want 0 (none)", noGlobal.GlobalDailyBudget)
	}
}

func TestParsePolicyOptionalFields(t *testing.T) {
	t.Parallel()
	yml := edit(t, "    limits: {rpm: 500, tpm: 200000, tpd: 0}\n", `    limits: {rps: 10, rpm: 500, tpm: 200000, tpd: 0, burst: 10s}
    kind: chat
    encoding: o200k_base
    max_output_tokens: 1000
`)
	yml = strings.Replace(yml, "output_per_mtok: 0.60}", "output_per_mtok: 0.60, cached_input_per_mtok: 0.075}", 1)
	yml = strings.Replace(yml, "    api_rps: 50\n", "    api_rps: 50\n    timezone: Europe/Paris\n    soft_limit: 0.5\n", 1)
	yml = strings.Replace(yml, "    soft_limit: 0.8\n", "", 1)
	p := mustParse(t, yml)

	m, _ := onlyRoute(p, "gpt-4o-mini")
	if m.Limits.RPS != 10 || m.Limits.Burst != 10*time.Second || m.Kind != KindChat || m.Encoding != "o200k_base" || m.MaxOutputTokens != 1000 {
		t.Errorf("model = %+v", m)
	}
	if m.Price.CachedInputPerMTok != 75_000 {
		t.Errorf("cached price = %v, want 0.075", m.Price.CachedInputPerMTok)
	}
	std, _ := p.Tier("standard")
	if std.Timezone.String() != "Europe/Paris" || std.SoftLimit != 0.5 {
		t.Errorf("tier timezone %v, soft limit %v; want Europe/Paris, 0.5", std.Timezone, std.SoftLimit)
	}

	// An explicit kind wins over the name.
	p = mustParse(t, edit(t, "    limits: {tpm: 1000000}\n", "    limits: {tpm: 1000000}\n    kind: chat\n    price: {input_per_mtok: 1, output_per_mtok: 2}\n"))
	if m, _ := p.Model("text-embedding-3-small"); m.Kind != KindChat || m.MaxOutputTokens != DefaultMaxOutputTokens {
		t.Errorf("kind override: %+v", m)
	}
	// An upstream that names an embedding model makes an embedding model.
	p = mustParse(t, edit(t, "    upstream: llama-3-8b\n", "    upstream: nomic-embedding-v1\n"))
	if m, _ := p.Model("fast"); m.Kind != KindEmbedding {
		t.Errorf("kind from upstream = %q, want embedding", m.Kind)
	}

	// Providers are OpenAI's kind unless they say azure; an Azure one may
	// name its api-version.
	if pr, _ := p.Provider("openai"); pr.Kind != ProviderOpenAI || pr.APIVersion != "" {
		t.Errorf("default provider kind %q, api-version %q", pr.Kind, pr.APIVersion)
	}
	for _, v := range []string{"2024-10-21", "2025-04-01-preview", ""} {
		line := "    kind: azure\n"
		if v != "" {
			line += "    api_version: " + v + "\n"
		}
		p = mustParse(t, edit(t, "    base_url: http://127.0.0.1:9000/v1\n", "    base_url: https://east.openai.azure.com\n"+line))
		if pr, _ := p.Provider("local"); pr.Kind != ProviderAzure || pr.APIVersion != v || pr.BaseURL != "https://east.openai.azure.com" {
			t.Errorf("azure provider %+v, want api-version %q", pr, v)
		}
	}
}

// The API's limits: windows per tier with their algorithm, soft limit,
// lease and per-endpoint limits, the webhook pace, and the per-address
// limit of failed authentications.
func TestParsePolicyAPILimits(t *testing.T) {
	t.Parallel()
	p := mustParse(t, edit(t, "    api_rps: 50\n", `    api_limits: {second: 50, minute: 0, hour: 0, day: 200000}
    api_algorithm: fixed_window
    api_soft_limit: 0.9
    api_lease: 10
    api_endpoint_limits:
      files.create: {minute: 10}
      batches.create: {second: 2, day: 100}
    webhook_host_rps: 2.5
    share: 3
`)+"auth_failure_limits: {minute: 5, hour: 50}\n")
	std, _ := p.Tier("standard")
	if std.APILimits != (APILimits{Second: 50, Day: 200000}) || std.APIAlgorithm != limiter.AlgFixedWindow ||
		std.APISoftLimit != 0.9 || std.APILease != 10 || std.WebhookHostRPS != 2.5 || std.Share != 3 {
		t.Fatalf("standard = %+v", std)
	}
	if len(std.APIEndpointLimits) != 2 || std.APIEndpointLimits["files.create"] != (APILimits{Minute: 10}) ||
		std.APIEndpointLimits["batches.create"] != (APILimits{Second: 2, Day: 100}) {
		t.Fatalf("endpoint limits = %v", std.APIEndpointLimits)
	}
	if p.AuthFailureLimits != (APILimits{Minute: 5, Hour: 50}) {
		t.Fatalf("auth_failure_limits = %+v", p.AuthFailureLimits)
	}
	ws := std.APIEndpointLimits["batches.create"].Windows("batches.create:")
	if len(ws) != 2 || ws[0].Name != "batches.create:second" || ws[0].Limit != 2 || ws[0].Period != time.Second ||
		ws[1].Name != "batches.create:day" || ws[1].Period != 24*time.Hour {
		t.Fatalf("windows = %+v", ws)
	}
	if s := std.APILimits.String(); s != "50/second, 200000/day" {
		t.Fatalf("String = %q", s)
	}
	// No window at all turns the per-address limit off.
	p = mustParse(t, basePolicy+"auth_failure_limits: {minute: 0}\n")
	if !p.AuthFailureLimits.IsZero() {
		t.Fatalf("auth_failure_limits {minute: 0} = %+v, want none", p.AuthFailureLimits)
	}
}

// TestParsePolicyAnchors: anchors, aliases and merge keys are plain YAML
// that operators use to share settings; strict checking must not refuse them.
func TestParsePolicyAnchors(t *testing.T) {
	t.Parallel()
	yml := edit(t, "    limits: {rpm: 500, tpm: 200000, tpd: 0}\n", "    limits: &lim {rpm: &rpm 500, tpm: 200000, tpd: 0}\n")
	yml = strings.Replace(yml, "    limits: {rps: 5}\n", "    limits: {rps: 5, rpm: *rpm}\n", 1)
	yml = strings.Replace(yml, "    limits: {tpm: 1000000}\n", "    limits: *lim\n", 1)
	yml = strings.Replace(yml, "  - name: internal\n    unlimited: true\n", "  - name: internal\n    <<: {unlimited: true, priority: low}\n", 1)
	p := mustParse(t, yml)
	if m, _ := onlyRoute(p, "fast"); m.Limits.RPM != 500 {
		t.Errorf("aliased rpm = %d, want 500", m.Limits.RPM)
	}
	if m, _ := onlyRoute(p, "text-embedding-3-small"); m.Limits.TPM != 200000 {
		t.Errorf("aliased limits = %+v", m.Limits)
	}
	if tr, _ := p.Tier("internal"); !tr.Unlimited || tr.Priority != queue.Low {
		t.Errorf("merged tier = %+v", tr)
	}
}

func TestParsePolicyLookups(t *testing.T) {
	t.Parallel()
	p := mustParse(t, basePolicy)
	if m, ok := p.Model("gpt-4o-mini"); !ok || m != &p.Models[0] {
		t.Error("Model does not return the entry of Models")
	}
	if pr, ok := p.Provider("local"); !ok || pr != &p.Providers[1] {
		t.Error("Provider does not return the entry of Providers")
	}
	if tr, ok := p.Tier("internal"); !ok || tr != &p.Tiers[1] {
		t.Error("Tier does not return the entry of Tiers")
	}
	// Lookups go by the name clients use, never by the upstream id.
	if _, ok := p.Model("llama-3-8b"); ok {
		t.Error("Model found an upstream id")
	}
	if _, ok := p.Provider("azure"); ok {
		t.Error("Provider found an unknown name")
	}
	if _, ok := p.Tier("gold"); ok {
		t.Error("Tier found an unknown name")
	}
}

// TestParsePolicyErrors holds one case per validation rule. Each asserts the
// field path the error names, part of the reason, and a line number.
func TestParsePolicyErrors(t *testing.T) {
	t.Parallel()
	type tc struct {
		name      string
		old, new  string // edit of basePolicy
		yml       string // or a whole document
		field     string
		msg       string
		wantNoPos bool
	}
	cases := []tc{
		// Strict decoding: nothing unknown is ignored.
		{name: "unknown tier field", old: "    daily_budget_usd: 50", new: "    daly_budget_usd: 50",
			field: "tiers[0].daly_budget_usd", msg: `unknown field (did you mean "daily_budget_usd"?)`},
		{name: "unknown top-level field", old: "global_daily_budget_usd: 100", new: "global_budget: 100",
			field: "global_budget", msg: "unknown field"},
		{name: "unknown limit", old: "{rps: 5}", new: "{rps: 5, rph: 9}", field: "models[1].limits.rph", msg: "unknown field"},
		{name: "unknown price field", old: "{input_per_mtok: 0, output_per_mtok: 0}", new: "{input_per_mtok: 0, output_per_mtok: 0, cache_per_mtok: 0}",
			field: "models[1].price.cache_per_mtok", msg: "unknown field"},
		{name: "unknown provider field", old: "    timeout: 30s", new: "    timeout: 30s\n    api_key: sk-123",
			field: "providers[0].api_key", msg: "unknown field"},
		{name: "duplicate key", old: "    priority: default\n", new: "    priority: default\n    priority: low\n",
			field: "tiers[0].priority", msg: "given twice"},
		{name: "unknown field through merge key", old: "    api_exempt: true\n", new: "    <<: {api_exempt: true, burst: 3}\n",
			field: "tiers[1].burst", msg: "unknown field"},

		// Types.
		{name: "limit not a number", old: "{rps: 5}", new: "{rps: fast}", field: "models[1].limits.rps", msg: `must be a whole number, got "fast"`},
		{name: "fractional limit", old: "{rps: 5}", new: "{rps: 1.5}", field: "models[1].limits.rps", msg: `must be a whole number, got "1.5"`},
		{name: "limit too large", old: "{rps: 5}", new: "{rps: 99999999999999999999}", field: "models[1].limits.rps", msg: "99999999999999999999 is too large"},
		{name: "budget not a number", old: "daily_budget_usd: 50", new: "daily_budget_usd: fifty", field: "tiers[0].daily_budget_usd", msg: "must be a number"},
		{name: "providers not a list", yml: "providers: {name: openai}\n", field: "providers", msg: "must be a list, got a mapping"},
		{name: "document not a mapping", yml: "- providers\n", msg: "must be a mapping"},

		// Lists.
		{name: "no providers", yml: "providers: []\n" + basePolicy[strings.Index(basePolicy, "models:"):],
			field: "providers", msg: "at least one"},
		{name: "no models", yml: basePolicy[:strings.Index(basePolicy, "models:")] + "models: []\n" + basePolicy[strings.Index(basePolicy, "tiers:"):],
			field: "models", msg: "at least one"},
		{name: "no tiers", yml: basePolicy[:strings.Index(basePolicy, "tiers:")] + "global_daily_budget_usd: 1\n",
			field: "tiers", msg: "at least one", wantNoPos: true},

		// Providers.
		{name: "provider without name", old: "  - name: local\n", new: "  - base_url_note: x\n", field: "providers[1].base_url_note", msg: "unknown field"},
		{name: "provider name empty", old: "  - name: local\n", new: "  - name: ''\n", field: "providers[1].name", msg: "required"},
		{name: "provider name invalid", old: "  - name: local\n", new: "  - name: Local AI\n", field: "providers[1].name", msg: "lower-case letters"},
		{name: "duplicate provider", old: "  - name: local\n", new: "  - name: openai\n", field: "providers[1].name", msg: `duplicate provider "openai" (also providers[0])`},
		{name: "base_url missing", old: "    base_url: http://127.0.0.1:9000/v1\n", new: "", field: "providers[1].base_url", msg: "required"},
		{name: "base_url not http", old: "http://127.0.0.1:9000/v1", new: "ftp://127.0.0.1/v1", field: "providers[1].base_url", msg: "must be an http or https URL"},
		{name: "base_url without host", old: "http://127.0.0.1:9000/v1", new: "https:///v1", field: "providers[1].base_url", msg: "must be an http or https URL"},
		{name: "base_url with credentials", old: "http://127.0.0.1:9000/v1", new: "https://user:pw@example.com/v1", field: "providers[1].base_url", msg: "must not hold credentials"},
		{name: "api_key_env not a name", old: "OPENAI_API_KEY", new: "sk-abc123", field: "providers[0].api_key_env", msg: "must be the name of an environment variable"},
		{name: "provider kind unknown", old: "  - name: local\n", new: "  - name: local\n    kind: gemini\n", field: "providers[1].kind",
			msg: `must be "openai", "azure" or "anthropic", got "gemini"`},
		{name: "api_version of an openai provider", old: "  - name: local\n", new: "  - name: local\n    api_version: 2024-10-21\n",
			field: "providers[1].api_version", msg: "is for kind: azure or anthropic only"},
		{name: "api_version not a version", old: "  - name: local\n", new: "  - name: local\n    kind: azure\n    api_version: latest\n",
			field: "providers[1].api_version", msg: `must be an Azure api-version such as 2024-10-21`},
		{name: "azure without base_url", old: "  - name: local\n    base_url: http://127.0.0.1:9000/v1\n", new: "  - name: local\n    kind: azure\n",
			field: "providers[1].base_url", msg: "the resource's endpoint"},
		{name: "api_key_env starts with digit", old: "OPENAI_API_KEY", new: "1KEY", field: "providers[0].api_key_env", msg: "environment variable"},
		{name: "timeout without unit", old: "timeout: 30s", new: "timeout: 30", field: "providers[0].timeout", msg: `must be a duration such as 60s or 2m, got "30"`},
		{name: "timeout garbage", old: "timeout: 30s", new: "timeout: soon", field: "providers[0].timeout", msg: "must be a duration"},
		{name: "timeout zero", old: "timeout: 30s", new: "timeout: 0s", field: "providers[0].timeout", msg: "must be more than 0"},
		{name: "timeout negative", old: "timeout: 30s", new: "timeout: -5s", field: "providers[0].timeout", msg: "must be more than 0"},

		// Models.
		{name: "model name empty", old: "  - name: fast\n", new: "  - name: ''\n", field: "models[1].name", msg: "required"},
		{name: "model name with brace", old: "  - name: fast\n", new: "  - name: 'fa{st}'\n", field: "models[1].name", msg: "braces"},
		{name: "model name with space", old: "  - name: fast\n", new: "  - name: 'fa st'\n", field: "models[1].name", msg: "spaces"},
		{name: "duplicate model", old: "  - name: fast\n", new: "  - name: gpt-4o-mini\n", field: "models[1].name", msg: `duplicate model "gpt-4o-mini" (also models[0])`},
		{name: "provider missing", old: "    provider: local\n", new: "", field: "models[1].provider", msg: "required"},
		{name: "unknown provider", old: "    provider: local\n", new: "    provider: opnai\n", field: "models[1].provider", msg: `unknown provider "opnai"`},
		{name: "upstream with space", old: "upstream: llama-3-8b", new: "upstream: 'llama 3'", field: "models[1].upstream", msg: "spaces"},
		{name: "same upstream twice", old: "    provider: local\n    upstream: llama-3-8b\n", new: "    provider: openai\n    upstream: gpt-4o-mini\n",
			field: "models[1].limits", msg: `"gpt-4o-mini" at provider "openai" is also a deployment of models[0] with other limits`},
		{name: "unknown kind", old: "    upstream: llama-3-8b\n", new: "    upstream: llama-3-8b\n    kind: completion\n", field: "models[1].kind", msg: `must be chat or embedding, got "completion"`},
		{name: "unknown encoding", old: "    upstream: llama-3-8b\n", new: "    upstream: llama-3-8b\n    encoding: cl100k\n", field: "models[1].encoding", msg: `got "cl100k"`},
		{name: "max_output_tokens zero", old: "    upstream: llama-3-8b\n", new: "    upstream: llama-3-8b\n    max_output_tokens: 0\n", field: "models[1].max_output_tokens", msg: "must be at least 1, got 0"},
		{name: "max_output_tokens on embedding", old: "    limits: {tpm: 1000000}\n", new: "    limits: {tpm: 1000000}\n    max_output_tokens: 10\n",
			field: "models[2].max_output_tokens", msg: "must not be set on an embedding model"},
		{name: "max_output_tokens over tpm", old: "{rpm: 500, tpm: 200000, tpd: 0}", new: "{rpm: 500, tpm: 4000, tpd: 0}",
			field: "models[0].max_output_tokens", msg: "4096 is more than limits.tpm (4000)"},
		{name: "max_output_tokens over tpd", old: "{rpm: 500, tpm: 200000, tpd: 0}", new: "{rpm: 500, tpm: 200000, tpd: 1000}",
			field: "models[0].max_output_tokens", msg: "more than limits.tpd (1000)"},
		{name: "no price and no default", old: "    price: {input_per_mtok: 0, output_per_mtok: 0}\n", new: "",
			field: "models[1].price", msg: `no default price for "llama-3-8b"`},
		{name: "price without input", old: "{input_per_mtok: 0, output_per_mtok: 0}", new: "{output_per_mtok: 0}", field: "models[1].price.input_per_mtok", msg: "required"},
		{name: "chat price without output", old: "{input_per_mtok: 0, output_per_mtok: 0}", new: "{input_per_mtok: 0}", field: "models[1].price.output_per_mtok", msg: "required for a chat model"},
		{name: "negative input price", old: "{input_per_mtok: 0, output_per_mtok: 0}", new: "{input_per_mtok: -1, output_per_mtok: 0}", field: "models[1].price.input_per_mtok", msg: "must be 0 or more, got -1"},
		{name: "negative output price", old: "{input_per_mtok: 0, output_per_mtok: 0}", new: "{input_per_mtok: 0, output_per_mtok: -2}", field: "models[1].price.output_per_mtok", msg: "must be 0 or more"},
		{name: "negative cached price", old: "{input_per_mtok: 0, output_per_mtok: 0}", new: "{input_per_mtok: 0, output_per_mtok: 0, cached_input_per_mtok: -1}", field: "models[1].price.cached_input_per_mtok", msg: "must be 0 or more"},
		{name: "price not finite", old: "{input_per_mtok: 0, output_per_mtok: 0}", new: "{input_per_mtok: .inf, output_per_mtok: 0}", field: "models[1].price.input_per_mtok", msg: "must be an amount of US dollars"},
		{name: "negative rps", old: "{rps: 5}", new: "{rps: -1}", field: "models[1].limits.rps", msg: "must be 0 or more, got -1"},
		{name: "negative rpm", old: "{rpm: 500, tpm: 200000, tpd: 0}", new: "{rpm: -500, tpm: 200000, tpd: 0}", field: "models[0].limits.rpm", msg: "must be 0 or more, got -500"},
		{name: "negative tpm", old: "{tpm: 1000000}", new: "{tpm: -5}", field: "models[2].limits.tpm", msg: "must be 0 or more, got -5"},
		{name: "negative tpd", old: "{rpm: 500, tpm: 200000, tpd: 0}", new: "{rpm: 500, tpm: 200000, tpd: -1}", field: "models[0].limits.tpd", msg: "must be 0 or more, got -1"},
		{name: "max_response_bytes too small", old: "    timeout: 30s\n", new: "    timeout: 30s\n    max_response_bytes: 10\n", field: "providers[0].max_response_bytes", msg: "within 1024"},
		{name: "burst not a duration", old: "{rpm: 500, tpm: 200000, tpd: 0}", new: "{rpm: 500, tpm: 200000, burst: 10}", field: "models[0].limits.burst", msg: "must be a duration such as 500ms or 10s"},
		{name: "burst too short", old: "{rpm: 500, tpm: 200000, tpd: 0}", new: "{rpm: 500, tpm: 200000, burst: 0s}", field: "models[0].limits.burst", msg: "within 1ms and 1m"},
		{name: "burst too long", old: "{rpm: 500, tpm: 200000, tpd: 0}", new: "{rpm: 500, tpm: 200000, burst: 2m}", field: "models[0].limits.burst", msg: "within 1ms and 1m"},

		// Tiers.
		{name: "tier name empty", old: "  - name: internal\n", new: "  - name: ''\n", field: "tiers[1].name", msg: "required"},
		{name: "tier name invalid", old: "  - name: internal\n", new: "  - name: Internal!\n", field: "tiers[1].name", msg: "lower-case letters"},
		{name: "tier name too long", old: "  - name: internal\n", new: "  - name: " + strings.Repeat("a", 65) + "\n", field: "tiers[1].name", msg: "at most 64 characters"},
		{name: "duplicate tier", old: "  - name: internal\n", new: "  - name: standard\n", field: "tiers[1].name", msg: `duplicate tier "standard" (also tiers[0])`},
		{name: "budget missing", old: "    daily_budget_usd: 50\n", new: "", field: "tiers[0].daily_budget_usd", msg: "required (or unlimited: true"},
		{name: "budget zero", old: "daily_budget_usd: 50", new: "daily_budget_usd: 0", field: "tiers[0].daily_budget_usd", msg: "must be more than 0"},
		{name: "budget negative", old: "daily_budget_usd: 50", new: "daily_budget_usd: -5", field: "tiers[0].daily_budget_usd", msg: "must be 0 or more, got -5"},
		{name: "budget absurd", old: "daily_budget_usd: 50", new: "daily_budget_usd: 1e12", field: "tiers[0].daily_budget_usd", msg: "must be an amount of US dollars"},
		{name: "budget and unlimited", old: "    unlimited: true\n", new: "    unlimited: true\n    daily_budget_usd: 5\n", field: "tiers[1].daily_budget_usd", msg: "must not be set together with unlimited: true"},
		{name: "unlimited false without budget", old: "    unlimited: true\n", new: "    unlimited: false\n", field: "tiers[1].daily_budget_usd", msg: "required"},
		{name: "soft_limit zero", old: "soft_limit: 0.8", new: "soft_limit: 0", field: "tiers[0].soft_limit", msg: "must be more than 0 and at most 1, got 0"},
		{name: "soft_limit over one", old: "soft_limit: 0.8", new: "soft_limit: 1.5", field: "tiers[0].soft_limit", msg: "got 1.5"},
		{name: "soft_limit on unlimited", old: "    unlimited: true\n", new: "    unlimited: true\n    soft_limit: 0.5\n", field: "tiers[1].soft_limit", msg: "no effect on an unlimited tier"},
		{name: "unknown priority", old: "priority: default", new: "priority: urgent", field: "tiers[0].priority", msg: `must be critical, default or low, got "urgent"`},
		{name: "unknown on_exhausted", old: "on_exhausted: defer", new: "on_exhausted: wait", field: "tiers[0].on_exhausted", msg: `must be defer or reject, got "wait"`},
		{name: "api_rps missing", old: "    api_rps: 50\n", new: "", field: "tiers[0].api_limits", msg: "required: at least one window above 0"},
		{name: "api_rps negative", old: "api_rps: 50", new: "api_rps: -1", field: "tiers[0].api_rps", msg: "must be at least 1, got -1"},
		{name: "api_rps and api_exempt", old: "    api_exempt: true\n", new: "    api_exempt: true\n    api_rps: 10\n", field: "tiers[1].api_rps", msg: "must not be set together with api_exempt: true"},
		{name: "api_limits and api_exempt", old: "    api_exempt: true\n", new: "    api_exempt: true\n    api_limits: {day: 10}\n", field: "tiers[1].api_limits", msg: "must not be set together with api_exempt: true"},
		{name: "api_lease and api_exempt", old: "    api_exempt: true\n", new: "    api_exempt: true\n    api_lease: 5\n", field: "tiers[1].api_lease", msg: "must not be set together with api_exempt: true"},
		{name: "api_rps and api_limits.second", old: "api_rps: 50", new: "api_rps: 50\n    api_limits: {second: 10}", field: "tiers[0].api_rps", msg: "is short for api_limits.second, which is set too"},
		{name: "api_limits all zero", old: "api_rps: 50", new: "api_limits: {second: 0, day: 0}", field: "tiers[0].api_limits", msg: "required: at least one window above 0"},
		{name: "api_limits negative", old: "api_rps: 50", new: "api_limits: {second: 5, hour: -2}", field: "tiers[0].api_limits.hour", msg: "must be 0 or more (0 = no such window), got -2"},
		{name: "api_limits unknown window", old: "api_rps: 50", new: "api_limits: {second: 5, minut: 9}", field: "tiers[0].api_limits.minut", msg: `unknown field (did you mean "minute"?)`},
		{name: "api_limits fraction", old: "api_rps: 50", new: "api_limits: {second: 5.5}", field: "tiers[0].api_limits.second", msg: "must be a whole number"},
		{name: "api_algorithm unknown", old: "api_rps: 50", new: "api_rps: 50\n    api_algorithm: sliding_windw", field: "tiers[0].api_algorithm",
			msg: `must be sliding_window, fixed_window, sliding_log or token_bucket, got "sliding_windw" (did you mean "sliding_window"?)`},
		{name: "api_algorithm leaky", old: "api_rps: 50", new: "api_rps: 50\n    api_algorithm: leaky_bucket", field: "tiers[0].api_algorithm", msg: `got "leaky_bucket"`},
		{name: "sliding_log too large", old: "api_rps: 50", new: "api_limits: {second: 50, day: 200000}\n    api_algorithm: sliding_log", field: "tiers[0].api_limits.day",
			msg: "200000 is more than sliding_log allows (10000)"},
		{name: "api_soft_limit zero", old: "api_rps: 50", new: "api_rps: 50\n    api_soft_limit: 0", field: "tiers[0].api_soft_limit", msg: "must be more than 0 and at most 1, got 0"},
		{name: "api_soft_limit over 1", old: "api_rps: 50", new: "api_rps: 50\n    api_soft_limit: 1.5", field: "tiers[0].api_soft_limit", msg: "got 1.5"},
		{name: "api_lease negative", old: "api_rps: 50", new: "api_rps: 50\n    api_lease: -1", field: "tiers[0].api_lease", msg: "must be from 0"},
		{name: "api_lease above a window", old: "api_rps: 50", new: "api_limits: {second: 50, minute: 20}\n    api_lease: 30", field: "tiers[0].api_lease",
			msg: "to the smallest api_limits window, 20, got 30"},
		{name: "unknown endpoint", old: "api_rps: 50", new: "api_rps: 50\n    api_endpoint_limits: {file.create: {minute: 5}}", field: "tiers[0].api_endpoint_limits.file.create",
			msg: `unknown endpoint (did you mean "files.create"?)`},
		{name: "unknown endpoint far off", old: "api_rps: 50", new: "api_rps: 50\n    api_endpoint_limits: {uploads: {minute: 5}}", field: "tiers[0].api_endpoint_limits.uploads",
			msg: "unknown endpoint (known endpoints: jobs.create,"},
		{name: "endpoint above the key's limit", old: "api_rps: 50", new: "api_rps: 50\n    api_endpoint_limits: {files.create: {second: 60}}",
			field: "tiers[0].api_endpoint_limits.files.create.second", msg: "60 is more than api_limits.second (50): a request counts against both"},
		{name: "endpoint without windows", old: "api_rps: 50", new: "api_rps: 50\n    api_endpoint_limits: {files.create: {}}",
			field: "tiers[0].api_endpoint_limits.files.create", msg: "must set at least one window above 0"},
		{name: "endpoint unknown window", old: "api_rps: 50", new: "api_rps: 50\n    api_endpoint_limits: {files.create: {mintue: 5}}",
			field: "tiers[0].api_endpoint_limits.files.create.mintue", msg: `unknown field (did you mean "minute"?)`},
		{name: "endpoint negative", old: "api_rps: 50", new: "api_rps: 50\n    api_endpoint_limits: {files.create: {minute: -5}}",
			field: "tiers[0].api_endpoint_limits.files.create.minute", msg: "must be 0 or more"},
		{name: "share zero", old: "api_rps: 50", new: "api_rps: 50\n    share: 0", field: "tiers[0].share", msg: "must be more than 0 and at most 1000000"},
		{name: "share negative", old: "api_rps: 50", new: "api_rps: 50\n    share: -2", field: "tiers[0].share", msg: "got -2"},
		{name: "webhook_host_rps zero", old: "api_rps: 50", new: "api_rps: 50\n    webhook_host_rps: 0", field: "tiers[0].webhook_host_rps", msg: "must be more than 0 and at most 100000 deliveries per second, got 0"},
		{name: "auth_failure_limits negative", old: "global_daily_budget_usd: 100", new: "global_daily_budget_usd: 100\nauth_failure_limits: {minute: -1}",
			field: "auth_failure_limits.minute", msg: "must be 0 or more"},
		{name: "auth_failure_limits unknown", old: "global_daily_budget_usd: 100", new: "global_daily_budget_usd: 100\nauth_failure_limits: {per_minute: 3}",
			field: "auth_failure_limits.per_minute", msg: "unknown field"},
		{name: "unknown timezone", old: "    api_rps: 50\n", new: "    api_rps: 50\n    timezone: Mars/Olympus\n", field: "tiers[0].timezone", msg: `got "Mars/Olympus"`},
		{name: "Local timezone", old: "    api_rps: 50\n", new: "    api_rps: 50\n    timezone: Local\n", field: "tiers[0].timezone", msg: `got "Local"`},

		// Global cap.
		{name: "global negative", old: "global_daily_budget_usd: 100", new: "global_daily_budget_usd: -1", field: "global_daily_budget_usd", msg: "must be 0 or more, got -1"},

		// Whole file.
		{name: "empty file", yml: "# nothing\n", msg: "the file is empty", wantNoPos: true},
		{name: "two documents", yml: basePolicy + "---\n" + basePolicy, msg: "must be one YAML document, found 2", wantNoPos: true},
		{name: "syntax error", yml: "providers: [\n", msg: "not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			yml := c.yml
			if yml == "" {
				yml = edit(t, c.old, c.new)
			}
			p, err := ParsePolicy([]byte(yml))
			if err == nil {
				t.Fatalf("ParsePolicy accepted it: %+v", p)
			}
			var pe *PolicyError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %q is not a *PolicyError", err, err)
			}
			if pe.Field != c.field {
				t.Errorf("Field = %q, want %q (error: %v)", pe.Field, c.field, err)
			}
			if !strings.Contains(pe.Msg, c.msg) {
				t.Errorf("Msg = %q, want it to contain %q", pe.Msg, c.msg)
			}
			if c.wantNoPos != (pe.Line == 0) {
				t.Errorf("Line = %d (error: %v)", pe.Line, err)
			}
			msg := err.Error()
			prefix := "policy: "
			if c.field != "" {
				prefix += c.field + ": "
			}
			if !strings.HasPrefix(msg, prefix) || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line starting %q", msg, prefix)
			}
		})
	}
}

// TestPolicyErrorText pins the wording operators see for the rules DESIGN
// cites.
func TestPolicyErrorText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ old, new, want string }{
		{"{tpm: 1000000}", "{tpm: -5}", "policy: models[2].limits.tpm: must be 0 or more, got -5 (line 20:19)"},
		{"    provider: local\n", "    provider: opnai\n", `policy: models[1].provider: unknown provider "opnai" (line 14:15)`},
		{"  - name: internal\n    unlimited: true\n", "  - name: internal\n    unlimited: true\n    priority: urgent\n",
			`policy: tiers[1].priority: must be critical, default or low, got "urgent" (line 30:15)`},
		{"    daily_budget_usd: 50", "    daly_budget_usd: 50", `policy: tiers[0].daly_budget_usd: unknown field (did you mean "daily_budget_usd"?) (line 23:5)`},
		{"    api_rps: 50\n", "    api_rps: 50\n    api_endpoint_limits:\n      files.create: {minute: 60, second: 51}\n",
			`policy: tiers[0].api_endpoint_limits.files.create.second: 51 is more than api_limits.second (50): a request counts against both, so it would never bind (line 29:42)`},
	} {
		_, err := ParsePolicy([]byte(edit(t, c.old, c.new)))
		if err == nil || err.Error() != c.want {
			t.Errorf("error = %v\nwant    %s", err, c.want)
		}
	}
}

func TestLoadPolicy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "llmq.yaml")
	if err := os.WriteFile(path, []byte(basePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := loadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Tier("standard"); !ok {
		t.Error("tier standard missing")
	}

	if err := os.WriteFile(path, []byte(edit(t, "soft_limit: 0.8", "soft_limit: 2")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = loadPolicy(path)
	want := "policy: tiers[0].soft_limit: must be more than 0 and at most 1, got 2 (" + path + ":24:17)"
	if err == nil || err.Error() != want {
		t.Errorf("error = %v\nwant    %s", err, want)
	}

	missing := filepath.Join(dir, "nope.yaml")
	_, err = loadPolicy(missing)
	var pe *PolicyError
	if !errors.As(err, &pe) || pe.File != missing || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: error = %v", err)
	}
}

func TestCheckAPIKeys(t *testing.T) {
	t.Parallel()
	p := mustParse(t, basePolicy)
	env := map[string]string{}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	err := p.CheckAPIKeys(lookup)
	if err == nil || !strings.HasPrefix(err.Error(), "policy: providers[0].api_key_env: environment variable OPENAI_API_KEY is not set") {
		t.Errorf("unset key: error = %v", err)
	}
	env["OPENAI_API_KEY"] = ""
	if err := p.CheckAPIKeys(lookup); err == nil {
		t.Error("empty key accepted")
	}
	env["OPENAI_API_KEY"] = "sk-secret-value"
	if err := p.CheckAPIKeys(lookup); err != nil {
		t.Errorf("set key: %v", err)
	}

	// A provider no model uses needs no key.
	p = mustParse(t, strings.ReplaceAll(basePolicy, "provider: openai", "provider: local"))
	if err := p.CheckAPIKeys(func(string) (string, bool) { return "", false }); err != nil {
		t.Errorf("unused provider: %v", err)
	}
}

// The example's commented providers and model of several deployments parse
// once uncommented, as its comments tell a reader to do.
func TestExamplePolicyDeployments(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../llmq.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// A commented entry starts "  #- " and goes on with "  #  " lines.
	var b strings.Builder
	inEntry := false
	for line := range strings.Lines(string(raw)) {
		if rest, ok := strings.CutPrefix(line, "  #- "); ok {
			line, inEntry = "  - "+rest, true
		} else if rest, ok := strings.CutPrefix(line, "  #  "); ok && inEntry {
			line = "    " + rest
		} else {
			inEntry = false
		}
		b.WriteString(line)
	}
	p := mustParse(t, b.String())
	m, ok := p.Model("gpt-4o-multi")
	if !ok || len(m.Deployments) != 3 || len(m.Fallbacks) != 1 {
		t.Fatalf("gpt-4o-multi = %+v", m)
	}
	want := []string{"openai/gpt-4o-2024-11-20", "openai-b/gpt-4o-2024-11-20", "azure-east/my-gpt4o-deployment"}
	for i, d := range m.Deployments {
		if d.Name() != want[i] {
			t.Errorf("deployments[%d] = %s, want %s", i, d.Name(), want[i])
		}
	}
	if az, _ := p.Provider("azure-east"); az.Kind != ProviderAzure {
		t.Errorf("azure-east = %+v", az)
	}
}

func TestExamplePolicy(t *testing.T) {
	t.Parallel()
	p, err := loadPolicy("../../llmq.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	openai, ok := p.Provider("openai")
	if !ok || openai.BaseURL != "https://api.openai.com/v1" || openai.APIKeyEnv != "OPENAI_API_KEY" || openai.Timeout != 60*time.Second {
		t.Errorf("openai = %+v", openai)
	}
	for _, name := range []string{"gpt-4o-mini", "gpt-4o", "text-embedding-3-small"} {
		m, ok := onlyRoute(p, name)
		if !ok {
			t.Errorf("model %s missing", name)
			continue
		}
		if m.Provider != "openai" || m.Upstream != name || m.Limits.RPM == 0 || m.Limits.TPM == 0 {
			t.Errorf("model %s = %+v", name, m)
		}
		// The example's prices are today's list prices, the same as the
		// built-in table (which has no service tiers or tools); if either
		// changes, both should.
		tokens := m.Price
		tokens.ServiceTiers, tokens.Tools = nil, nil
		if !reflect.DeepEqual(tokens, money.DefaultPrices[name]) {
			t.Errorf("model %s price %+v, built-in table says %+v", name, m.Price, money.DefaultPrices[name])
		}
	}
	if m, _ := onlyRoute(p, "gpt-4o"); m.Price.ServiceTiers["priority"].OutputPerMTok != 17_000_000 ||
		m.Price.Tools["web_search"] != (money.ToolPrice{PerCall: 10_000, ResultTokens: 8000}) || m.ContextWindow != 128_000 || m.MaxToolCalls != DefaultMaxToolCalls {
		t.Errorf("gpt-4o's tiers, tools, window: %+v, %d, %d", m.Price, m.ContextWindow, m.MaxToolCalls)
	}
	if m, _ := p.Model("text-embedding-3-small"); m.Kind != KindEmbedding {
		t.Errorf("text-embedding-3-small kind = %q", m.Kind)
	}
	want := map[string]struct {
		budget   money.Micros
		priority string
		onExh    string
		rps      int64
	}{
		"free":     {1 * money.PerDollar, queue.Low, OnExhaustedReject, 2},
		"standard": {50 * money.PerDollar, queue.Default, OnExhaustedDefer, 50},
		"premium":  {500 * money.PerDollar, queue.Critical, OnExhaustedDefer, 200},
	}
	for name, w := range want {
		tr, ok := p.Tier(name)
		if !ok {
			t.Errorf("tier %s missing", name)
			continue
		}
		if tr.DailyBudget != w.budget || tr.Priority != w.priority || tr.OnExhausted != w.onExh || tr.APILimits.Second != w.rps || tr.Unlimited {
			t.Errorf("tier %s = %+v", name, tr)
		}
	}
	in, ok := p.Tier("internal")
	if !ok || !in.Unlimited || !in.APIExempt || in.DailyBudget != 0 {
		t.Errorf("internal = %+v; want unlimited and api-exempt", in)
	}
	if prem, _ := p.Tier("premium"); prem.Timezone.String() != "America/New_York" {
		t.Errorf("premium timezone = %v", prem.Timezone)
	}
	std, _ := p.Tier("standard")
	prem, _ := p.Tier("premium")
	if std.APILimits != (APILimits{Second: 50, Day: 200000}) || std.APIEndpointLimits["files.create"] != (APILimits{Minute: 10}) ||
		prem.APIAlgorithm != limiter.AlgTokenBucket || prem.APILease != 20 || p.AuthFailureLimits != DefaultAuthFailureLimits {
		t.Errorf("the example's API limits: standard %+v %v, premium %s lease %d, auth failures %+v",
			std.APILimits, std.APIEndpointLimits, prem.APIAlgorithm, prem.APILease, p.AuthFailureLimits)
	}
	if p.GlobalDailyBudget != 0 {
		t.Errorf("GlobalDailyBudget = %v, want 0 (the example leaves the cap commented out)", p.GlobalDailyBudget)
	}
}

// onlyRoute is the route of model name's one deployment (the first of
// several): what its tests read its price, limits and upstream on.
func onlyRoute(p *Policy, name string) (Route, bool) {
	m, ok := p.Model(name)
	if !ok {
		return Route{}, false
	}
	return m.Routes()[0], true
}
