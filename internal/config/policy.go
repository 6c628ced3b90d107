package config

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // tier timezones load alike on hosts without zoneinfo

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
)

// Model kinds.
const (
	KindChat      = "chat"
	KindEmbedding = "embedding"
)

// Where a tier's batches run (Tier.BatchOffload): never on the provider's
// Batch API, auto where offered, always (refusing a line where it is not).
const (
	BatchOffloadNever  = "never"
	BatchOffloadAuto   = "auto"
	BatchOffloadAlways = "always"
)

// What happens to a job of a tier whose daily budget is spent.
const (
	OnExhaustedDefer  = "defer"  // wait for the tier's next day
	OnExhaustedReject = "reject" // fail at once
)

// Defaults of optional policy fields.
const (
	DefaultProviderTimeout = 60 * time.Second
	DefaultMaxOutputTokens = 4096
	DefaultMaxToolCalls    = 4
	DefaultSoftLimit       = 0.8
)

const maxToolCalls = 128

// contextWindows are the context windows of models by name prefix, most
// specific first.
var contextWindows = []struct {
	prefix string
	tokens int64
}{
	{"gpt-4o", 128_000}, {"chatgpt-4o", 128_000}, {"gpt-4.1", 1_047_576}, {"gpt-4.5", 128_000},
	{"gpt-4-turbo", 128_000}, {"gpt-4", 8_192}, {"gpt-3.5-turbo", 16_385}, {"gpt-5", 400_000},
	{"gpt-oss", 131_072}, {"o1-mini", 128_000}, {"o1", 200_000}, {"o3", 200_000}, {"o4-mini", 200_000},
	{"claude", 200_000}, {"gemini-1.5", 1_048_576}, {"gemini-2", 1_048_576},
}

// DefaultContextWindow is the context window contextWindows gives the
// model called name, else its upstream; 0 when it knows neither.
func DefaultContextWindow(name, upstream string) int64 {
	for _, n := range []string{name, upstream} {
		n = strings.ToLower(n)
		if i := strings.LastIndexByte(n, '/'); i >= 0 {
			n = n[i+1:]
		}
		n = strings.TrimPrefix(n, "ft:")
		for _, w := range contextWindows {
			if strings.HasPrefix(n, w.prefix) {
				return w.tokens
			}
		}
	}
	return 0
}

var envVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

var encodings = []string{"cl100k_base", "gpt2", "o200k_base", "p50k_base", "p50k_edit", "r50k_base"}

// Policy is the validated policy file: who llmq calls, what each model costs
// and may be sent, and what each tier of tenants may spend. It is shared once
// built and never modified; a reload builds a new one.
type Policy struct {
	Providers []Provider
	Models    []Model
	Tiers     []Tier

	// GlobalDailyBudget caps all tenants' spend per UTC day; 0: no cap.
	GlobalDailyBudget money.Micros
	Retention         Retention
	// AuthFailureLimits are the requests with a missing or wrong key a
	// client address may make. Defaults to DefaultAuthFailureLimits.
	AuthFailureLimits APILimits
	// Digest is the hex SHA-256 of the YAML the policy was parsed from.
	Digest string

	providers map[string]*Provider
	models    map[string]*Model
	tiers     map[string]*Tier
}

// Provider is an API that models are served by: OpenAI's (or one
// compatible with it), Azure OpenAI's or Anthropic's.
type Provider struct {
	Name string
	Kind string // openai, azure or anthropic. Defaults to openai.
	// APIVersion is an Azure provider's api-version (empty for Azure's v1
	// API), or an Anthropic provider's anthropic-version header. Defaults
	// to DefaultAnthropicVersion for kind anthropic.
	APIVersion string
	// BaseURL is e.g. https://api.openai.com/v1, https://<resource>.openai.azure.com
	// for Azure, or Anthropic's API root (its SDKs' base URL; a trailing /v1
	// is dropped). Defaults to DefaultAnthropicBaseURL for kind anthropic.
	BaseURL          string
	APIKeyEnv        string        // the environment variable holding the API key; empty for none
	Timeout          time.Duration // of one call, > 0. Defaults to 60s.
	MaxResponseBytes int64         // one answer's body, within 1 KiB and 1 GiB. Defaults to 16 MiB.
	BatchAPI         bool          // OpenAI's Batch API is offered. Defaults to true for kind openai.
}

// The kinds of provider.
const (
	ProviderOpenAI    = "openai"
	ProviderAzure     = "azure"
	ProviderAnthropic = "anthropic" // Anthropic's Messages API
)

// The defaults of an anthropic provider.
const (
	DefaultAnthropicBaseURL = "https://api.anthropic.com"
	DefaultAnthropicVersion = "2023-06-01"
)

// DefaultMaxResponseBytes is a provider's default MaxResponseBytes.
const DefaultMaxResponseBytes = 16 << 20

// Model is a model clients may name in body.model, served by one or more
// deployments. One call runs on one of them, a Route.
type Model struct {
	Name string // what clients send
	// Kind is chat or embedding. Defaults to embedding when the name or the
	// first upstream contains "embedding".
	Kind string
	// Encoding overrides the tokenizer's pick by model name.
	Encoding string
	// ContextWindow bounds what llmq cannot count; 0 refuses such requests.
	// Defaults to DefaultContextWindow's.
	ContextWindow int64
	// MaxToolCalls is written into a Responses API request naming built-in
	// tools and no max_tool_calls, within 1 and 128. Defaults to 4.
	MaxToolCalls int64
	// MaxOutputTokens is written into a chat request that gives no output
	// limit, ≥ 1. Defaults to 4096; 0 for embedding models.
	MaxOutputTokens int64
	Deployments     []Deployment // at least one, in the policy's order
	// Fallbacks run a job none of the deployments can take, or whose
	// context length the provider refuses. One level.
	Fallbacks []string
	// Anthropic is set when the model's deployments are on anthropic
	// providers, which serve Anthropic's Messages API only; a model's
	// deployments are all on such providers or none.
	Anthropic bool

	routes []Route // one per deployment
}

// Deployment is one place a model is served: a provider's upstream model
// with the provider's limits and its price for it.
type Deployment struct {
	Provider string // a Provider's name
	Upstream string // the provider's id of the model. Defaults to the model's name.
	Limits   Limits
	Order    int // ≥ 0: a job goes to the lowest order that can take it now
	Weight   int // spreads jobs within an order, within 1 and 1000. Defaults to 1.
	// Price is the deployment's own, else the model's, else
	// money.DefaultPrices of the first upstream (then of the model's name).
	Price money.Price
}

// Name is the deployment's name, provider/upstream: the limiter scope,
// breaker and pause of every model deployed there.
func (d *Deployment) Name() string { return d.Provider + "/" + d.Upstream }

// Route is one deployment of a model: what one call is planned, limited,
// priced and sent on.
type Route struct {
	*Model
	*Deployment
}

// Routes returns the model's routes, one per deployment.
func (m *Model) Routes() []Route { return slices.Clone(m.routes) }

// Route returns the route of m whose deployment is called name, if any.
func (m *Model) Route(name string) (Route, bool) {
	for _, r := range m.routes {
		if r.Deployment.Name() == name {
			return r, true
		}
	}
	return Route{}, false
}

// TokenizerModel is the upstream whose tokenizer counts the model's
// prompts: its first deployment's.
func (m *Model) TokenizerModel() string { return m.Deployments[0].Upstream }

// OwnedBy is the provider a client is told serves the model (OpenAI's
// owned_by): its first deployment's.
func (m *Model) OwnedBy() string { return m.Deployments[0].Provider }

// Queue is the fair queue of m's jobs: its deployment's name when it has
// one, else one of its own.
func (m *Model) Queue() string {
	if len(m.Deployments) == 1 {
		return m.Deployments[0].Name()
	}
	return "model:" + m.Name
}

// Limits are the provider's rate limits of one model, each ≥ 0; 0 means no
// such limit. Each is a dimension: a unit (requests, tokens all told, input
// or output tokens) over a window, one bucket of limiter.ModelBuckets.
type Limits struct {
	RPS, RPM, RPD int64 // requests per second, minute and day
	TPM, TPD      int64 // tokens per minute and day, input and output together
	ITPM, ITPD    int64 // input tokens per minute and day
	OTPM, OTPD    int64 // output tokens per minute and day, settled to usage
	// CacheReadsFree: input tokens read from the prompt cache count toward
	// no limit. Defaults by the provider's kind (cacheReadsFree).
	CacheReadsFree bool
	// BatchQueueTokens is the prompt tokens of batches the Batch API holds
	// at once; 0 when learned from its refusals.
	BatchQueueTokens int64
	Burst            time.Duration // the most sent at once, as a time of refill, within 1ms and 1m
}

// ByName returns each limit by its policy key, limiter.ModelBuckets' names.
func (l Limits) ByName() map[string]int64 {
	return map[string]int64{"rps": l.RPS, "rpm": l.RPM, "rpd": l.RPD, "tpm": l.TPM, "tpd": l.TPD,
		"itpm": l.ITPM, "itpd": l.ITPD, "otpm": l.OTPM, "otpd": l.OTPD}
}

// DefaultBurst is half a second of refill, within any provider's window.
const DefaultBurst = 500 * time.Millisecond

// How a deployment's cache reads count (limits.cache_reads).
const (
	CacheReadsCounted = "counted"
	CacheReadsFree    = "free"
)

// cacheReadsFree is how each kind of provider counts the input tokens read
// from its prompt cache toward its limits, as it documents: OpenAI and
// Azure count them; Anthropic counts none toward ITPM on current models.
var cacheReadsFree = map[string]bool{ProviderOpenAI: false, ProviderAzure: false, ProviderAnthropic: true}

// Tier is a class of tenants sharing a daily budget and a priority.
type Tier struct {
	Name        string
	DailyBudget money.Micros // per tenant and day (in Timezone), > 0 unless Unlimited
	Unlimited   bool         // no daily budget: only the global cap applies
	SoftLimit   float64      // of DailyBudget, past which a tenant is warned, in (0, 1]. Defaults to 0.8.
	Priority    string       // critical, default or low. Defaults to default.
	OnExhausted string       // defer or reject. Defaults to defer.
	// APILimits are each API key's, at least one window unless APIExempt.
	APILimits    APILimits
	APIAlgorithm limiter.Algorithm // Defaults to sliding_window.
	// APISoftLimit is the fraction of a window past which responses carry
	// X-RateLimit-Warning, in (0, 1]. Defaults to 0.8.
	APISoftLimit float64
	// APIEndpointLimits are lower limits per key of the APIEndpoints named.
	APIEndpointLimits map[string]APILimits
	// APILease is the slice of a key's windows a dispatcher leases at a
	// time, from 0 (none) to the smallest window.
	APILease  int64
	APIExempt bool     // no per-key API limit
	Fallbacks []string // the models a job of the tier may name as its own fallbacks
	// WebhookHostRPS is the most deliveries per second a tenant sends to
	// one host, in (0, 100000]. Defaults to 10.
	WebhookHostRPS float64
	// Share is a tenant's weight among tenants of one priority waiting for
	// one model, in (0, MaxShare]. Defaults to 1.
	Share        float64
	Timezone     *time.Location // where the tier's day starts and ends. Defaults to UTC.
	BatchOffload string         // never, auto or always. Defaults to never.
	// RequireOutputLimit refuses requests naming no output limit instead of
	// writing the model's max_output_tokens into them.
	RequireOutputLimit bool
	// AllowForeignResponses lets a Responses API request continue what llmq
	// did not see made, bounded by the context window.
	AllowForeignResponses bool
}

// MaxShare bounds a tier's share.
const MaxShare = 1_000_000

// Model returns the model clients call name.
func (p *Policy) Model(name string) (*Model, bool) {
	m, ok := p.models[name]
	return m, ok
}

// BatchRoute returns the route of model name that offloaded batches go to:
// its first deployment, in order, whose provider offers a Batch API.
func (p *Policy) BatchRoute(name string) (route Route, ok bool) {
	m, ok := p.models[name]
	if !ok {
		return Route{}, false
	}
	routes := m.Routes()
	slices.SortStableFunc(routes, func(a, b Route) int { return a.Order - b.Order })
	for _, r := range routes {
		if pr, ok := p.providers[r.Provider]; ok && pr.BatchAPI {
			return r, true
		}
	}
	return Route{}, false
}

// Provider returns the provider called name.
func (p *Policy) Provider(name string) (*Provider, bool) {
	v, ok := p.providers[name]
	return v, ok
}

// Tier returns the tier called name.
func (p *Policy) Tier(name string) (*Tier, bool) {
	t, ok := p.tiers[name]
	return t, ok
}

// CheckAPIKeys reports the first provider serving a model whose API key is
// not in lookup (nor in a readable <variable>_FILE), so a missing key fails
// a worker's start, not every job.
func (p *Policy) CheckAPIKeys(lookup func(string) (string, bool)) error {
	used := map[string]bool{}
	for _, m := range p.Models {
		for _, d := range m.Deployments {
			used[d.Provider] = true
		}
	}
	for i, pr := range p.Providers {
		if !used[pr.Name] || pr.APIKeyEnv == "" {
			continue
		}
		_, ok, err := ReadSecret(lookup, pr.APIKeyEnv)
		if err == nil && !ok {
			err = fmt.Errorf("environment variable %s is not set (nor %s%s, a file holding it)", pr.APIKeyEnv, pr.APIKeyEnv, FileSuffix)
		}
		if err != nil {
			return &PolicyError{Field: fmt.Sprintf("providers[%d].api_key_env", i), Msg: err.Error()}
		}
	}
	return nil
}

// ParsePolicy parses and validates a policy document strictly.
func ParsePolicy(data []byte) (*Policy, error) {
	var raw rawPolicy
	src, err := parseSource(data, &raw)
	if err != nil {
		return nil, err
	}
	p, err := raw.build(src)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	p.Digest = hex.EncodeToString(sum[:])
	return p, nil
}

// The raw* types mirror the YAML; pointers mark fields whose absence differs
// from their zero value.
type rawPolicy struct {
	Providers            []rawProvider `yaml:"providers"`
	Models               []rawModel    `yaml:"models"`
	Tiers                []rawTier     `yaml:"tiers"`
	GlobalDailyBudgetUSD float64       `yaml:"global_daily_budget_usd"`
	AuthFailureLimits    *APILimits    `yaml:"auth_failure_limits"`
	Retention            *rawRetention `yaml:"retention"`
}

type rawRetention struct {
	FinishedJobs *string `yaml:"finished_jobs"`
	Files        *string `yaml:"files"`
	Ledger       *string `yaml:"ledger"`
}

type rawProvider struct {
	Name             string  `yaml:"name"`
	Kind             string  `yaml:"kind"`
	APIVersion       string  `yaml:"api_version"`
	BaseURL          string  `yaml:"base_url"`
	APIKeyEnv        string  `yaml:"api_key_env"`
	Timeout          *string `yaml:"timeout"`
	MaxResponseBytes *int64  `yaml:"max_response_bytes"`
	BatchAPI         *bool   `yaml:"batch_api"`
}

type rawModel struct {
	Name            string          `yaml:"name"`
	Provider        string          `yaml:"provider"`
	Upstream        string          `yaml:"upstream"`
	Kind            string          `yaml:"kind"`
	Encoding        string          `yaml:"encoding"`
	MaxOutputTokens *int64          `yaml:"max_output_tokens"`
	ContextWindow   *int64          `yaml:"context_window"`
	MaxToolCalls    *int64          `yaml:"max_tool_calls"`
	Price           *rawPrice       `yaml:"price"`
	Limits          rawLimits       `yaml:"limits"`
	Deployments     []rawDeployment `yaml:"deployments"`
	Fallbacks       []string        `yaml:"fallbacks"`
}

type rawDeployment struct {
	Provider string    `yaml:"provider"`
	Upstream string    `yaml:"upstream"`
	Limits   rawLimits `yaml:"limits"`
	Order    int       `yaml:"order"`
	Weight   *int64    `yaml:"weight"`
	Price    *rawPrice `yaml:"price"`
}

type rawPrice struct {
	InputPerMTok        *float64                `yaml:"input_per_mtok"`
	OutputPerMTok       *float64                `yaml:"output_per_mtok"`
	CachedInputPerMTok  *float64                `yaml:"cached_input_per_mtok"`
	CacheWrite5mPerMTok *float64                `yaml:"cache_write_5m_per_mtok"`
	CacheWrite1hPerMTok *float64                `yaml:"cache_write_1h_per_mtok"`
	BatchInputPerMTok   *float64                `yaml:"batch_input_per_mtok"`
	BatchOutputPerMTok  *float64                `yaml:"batch_output_per_mtok"`
	ServiceTierPrices   map[string]*rawPrice    `yaml:"service_tier_prices"`
	AutoServiceTier     string                  `yaml:"auto_service_tier"`
	ToolPrices          map[string]rawToolPrice `yaml:"tool_prices"`
}

type rawToolPrice struct {
	PerCallUSD   *float64 `yaml:"per_call_usd"`
	ResultTokens int64    `yaml:"result_tokens"`
}

type rawLimits struct {
	RPS              int64   `yaml:"rps"`
	RPM              int64   `yaml:"rpm"`
	RPD              int64   `yaml:"rpd"`
	TPM              int64   `yaml:"tpm"`
	TPD              int64   `yaml:"tpd"`
	ITPM             int64   `yaml:"itpm"`
	ITPD             int64   `yaml:"itpd"`
	OTPM             int64   `yaml:"otpm"`
	OTPD             int64   `yaml:"otpd"`
	CacheReads       string  `yaml:"cache_reads"`
	BatchQueueTokens int64   `yaml:"batch_queue_tokens"`
	Burst            *string `yaml:"burst"`
}

type rawTier struct {
	Name           string   `yaml:"name"`
	DailyBudgetUSD *float64 `yaml:"daily_budget_usd"`
	Unlimited      bool     `yaml:"unlimited"`
	SoftLimit      *float64 `yaml:"soft_limit"`
	Priority       string   `yaml:"priority"`
	OnExhausted    string   `yaml:"on_exhausted"`
	APIRPS         int      `yaml:"api_rps"`
	APIExempt      bool     `yaml:"api_exempt"`
	Timezone       string   `yaml:"timezone"`

	APILimits         *APILimits           `yaml:"api_limits"`
	APIAlgorithm      string               `yaml:"api_algorithm"`
	APISoftLimit      *float64             `yaml:"api_soft_limit"`
	APIEndpointLimits map[string]APILimits `yaml:"api_endpoint_limits"`
	APILease          int64                `yaml:"api_lease"`
	WebhookHostRPS    *float64             `yaml:"webhook_host_rps"`
	Share             *float64             `yaml:"share"`
	Fallbacks         []string             `yaml:"fallbacks"`
	BatchOffload      string               `yaml:"batch_offload"`

	RequireOutputLimit    bool `yaml:"require_output_limit"`
	AllowForeignResponses bool `yaml:"allow_foreign_responses"`
}

func (raw *rawPolicy) build(src *source) (*Policy, error) {
	p := &Policy{}
	for _, list := range []struct {
		name string
		n    int
	}{{"providers", len(raw.Providers)}, {"models", len(raw.Models)}, {"tiers", len(raw.Tiers)}} {
		if list.n == 0 {
			return nil, src.errorAt(list.name, "must list at least one entry")
		}
	}

	p.Providers, p.providers = buildList(src, "providers", "provider", raw.Providers, rawProvider.build,
		func(pr *Provider) string { return pr.Name }, nil)
	lastModel, limits := map[[2]string]int{}, map[[2]string]Limits{} // by provider and upstream
	buildModel := func(rm rawModel, src *source, path string) Model { return rm.build(src, path, p.providers) }
	// Models sharing a deployment share its scope and its limits.
	checkShared := func(i int, m *Model, path string) {
		for k, d := range m.Deployments {
			key := [2]string{d.Provider, d.Upstream}
			if l, dup := limits[key]; dup && l != d.Limits {
				at := fmt.Sprintf("%s.deployments[%d].limits", path, k)
				if len(raw.Models[i].Deployments) == 0 {
					at = path + ".limits"
				}
				src.fail(at,
					"%q at provider %q is also a deployment of models[%d] with other limits; the provider has one limit for it, so give both the same",
					d.Upstream, d.Provider, lastModel[key])
			}
			lastModel[key], limits[key] = i, d.Limits
		}
	}
	p.Models, p.models = buildList(src, "models", "model", raw.Models, buildModel,
		func(m *Model) string { return m.Name }, checkShared)
	for i := range p.Models {
		m := &p.Models[i] // in place: routes point to the model
		m.routes = make([]Route, len(m.Deployments))
		for k := range m.Deployments {
			m.routes[k] = Route{Model: m, Deployment: &m.Deployments[k]}
		}
	}
	p.Tiers, p.tiers = buildList(src, "tiers", "tier", raw.Tiers, rawTier.build,
		func(t *Tier) string { return t.Name }, nil)
	p.checkFallbacks(src)

	p.GlobalDailyBudget = usd(src, "global_daily_budget_usd", raw.GlobalDailyBudgetUSD)
	if r := raw.Retention; r != nil {
		p.Retention.FinishedJobs = retentionAge(src, "retention.finished_jobs", r.FinishedJobs)
		p.Retention.Files = retentionAge(src, "retention.files", r.Files)
		p.Retention.Ledger = retentionAge(src, "retention.ledger", r.Ledger)
		if l := p.Retention.Ledger; l != 0 && l < MinLedgerRetention {
			src.fail("retention.ledger", "must be 0 (keep) or at least %s: a budget audit and a late delivery read recent rows, got %s",
				MinLedgerRetention, *r.Ledger)
		}
	}
	p.AuthFailureLimits = DefaultAuthFailureLimits
	if raw.AuthFailureLimits != nil {
		p.AuthFailureLimits = raw.AuthFailureLimits.build(src, "auth_failure_limits")
	}
	return p, src.err
}

// buildList builds a list of the policy, refusing a name given twice, runs
// check (if any) on each, and indexes them by name.
func buildList[R, T any](src *source, list, noun string, raws []R, build func(R, *source, string) T,
	name func(*T) string, check func(int, *T, string)) ([]T, map[string]*T) {
	out := make([]T, len(raws))
	seen := map[string]int{}
	for i, r := range raws {
		path := fmt.Sprintf("%s[%d]", list, i)
		v := build(r, src, path)
		if j, dup := seen[name(&v)]; dup {
			src.fail(path+".name", "duplicate %s %q (also %s[%d])", noun, name(&v), list, j)
		}
		seen[name(&v)] = i
		if check != nil {
			check(i, &v, path)
		}
		out[i] = v
	}
	index := make(map[string]*T, len(out))
	for i := range out {
		index[name(&out[i])] = &out[i]
	}
	return out, index
}

func (rp rawProvider) build(src *source, path string) Provider {
	pr := Provider{Name: rp.Name, Kind: rp.Kind, APIVersion: rp.APIVersion, BaseURL: rp.BaseURL, APIKeyEnv: rp.APIKeyEnv,
		Timeout: DefaultProviderTimeout}
	checkIdent(src, path+".name", rp.Name)
	pr.Kind = oneOf(src, path+".kind", rp.Kind, `"openai", "azure" or "anthropic"`, ProviderOpenAI, ProviderAzure, ProviderAnthropic)
	pr.BatchAPI = pr.Kind == ProviderOpenAI
	if rp.BatchAPI != nil {
		pr.BatchAPI = *rp.BatchAPI
	}
	if pr.BatchAPI && pr.Kind == ProviderAnthropic {
		src.fail(path+".batch_api", "is OpenAI's Batch API, which an anthropic provider does not offer")
	}
	date, suffix, _ := strings.Cut(rp.APIVersion, "-preview") // Azure's: a date, optionally with -preview
	_, azureErr := time.Parse(time.DateOnly, date)
	_, anthropicErr := time.Parse(time.DateOnly, rp.APIVersion)
	switch {
	case rp.APIVersion == "":
	case pr.Kind == ProviderOpenAI:
		src.fail(path+".api_version", "is for kind: %s or %s only", ProviderAzure, ProviderAnthropic)
	case pr.Kind == ProviderAnthropic && anthropicErr != nil:
		src.fail(path+".api_version", "must be an anthropic-version such as %s, got %q", DefaultAnthropicVersion, rp.APIVersion)
	case pr.Kind == ProviderAzure && (azureErr != nil || suffix != ""):
		src.fail(path+".api_version", "must be an Azure api-version such as 2024-10-21 or 2025-04-01-preview (leave it out for Azure's v1 API), got %q", rp.APIVersion)
	}
	if pr.Kind == ProviderAnthropic {
		pr.APIVersion = cmp.Or(pr.APIVersion, DefaultAnthropicVersion)
		pr.BaseURL = cmp.Or(pr.BaseURL, DefaultAnthropicBaseURL)
	}
	switch u, err := url.Parse(pr.BaseURL); {
	case pr.BaseURL == "" && pr.Kind == ProviderAzure:
		src.fail(path+".base_url", "required, the resource's endpoint, e.g. https://my-resource.openai.azure.com")
	case pr.BaseURL == "":
		src.fail(path+".base_url", "required, e.g. https://api.openai.com/v1")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		src.fail(path+".base_url", "must be an http or https URL, got %q", rp.BaseURL)
	case u.User != nil:
		src.fail(path+".base_url", "must not hold credentials; name the key's variable in api_key_env")
	}
	if rp.APIKeyEnv != "" && !envVarName.MatchString(rp.APIKeyEnv) {
		src.fail(path+".api_key_env",
			"must be the name of an environment variable (letters, digits and _, not starting with a digit), got %q", rp.APIKeyEnv)
	}
	if rp.Timeout != nil {
		d, err := time.ParseDuration(*rp.Timeout)
		if err != nil {
			src.fail(path+".timeout", "must be a duration such as 60s or 2m, got %q", *rp.Timeout)
		} else if d <= 0 {
			src.fail(path+".timeout", "must be more than 0, got %s", *rp.Timeout)
		}
		pr.Timeout = d
	}
	pr.MaxResponseBytes = bounded(src, path+".max_response_bytes", rp.MaxResponseBytes, DefaultMaxResponseBytes,
		1<<10, 1<<30, "within 1024 (1 KiB) and 1073741824 (1 GiB)")
	return pr
}

func (rm rawModel) build(src *source, path string, providers map[string]*Provider) Model {
	m := Model{Name: rm.Name, Kind: rm.Kind, Encoding: rm.Encoding, Fallbacks: rm.Fallbacks}
	checkModelName(src, path+".name", rm.Name)
	raws := rm.Deployments
	if len(raws) == 0 {
		if rm.Provider == "" {
			src.fail(path+".provider", "required (or a list of deployments)")
			return m
		}
		// The short form: one deployment, the model's price.
		raws = []rawDeployment{{Provider: rm.Provider, Upstream: rm.Upstream, Limits: rm.Limits}}
	} else if rm.Provider != "" || rm.Upstream != "" || rm.Limits != (rawLimits{}) {
		src.fail(path+".deployments", "give either provider, upstream and limits or a list of deployments, not both")
	}
	first := cmp.Or(raws[0].Upstream, m.Name)

	kind := KindChat
	if strings.Contains(m.Name, "embedding") || strings.Contains(first, "embedding") {
		kind = KindEmbedding
	}
	m.Kind = oneOf(src, path+".kind", rm.Kind, "chat or embedding", kind, KindChat, KindEmbedding)
	if rm.Encoding != "" && !slices.Contains(encodings, rm.Encoding) {
		src.fail(path+".encoding", "must be one of %s, got %q", strings.Join(encodings, ", "), rm.Encoding)
	}

	if m.Kind == KindEmbedding && rm.MaxOutputTokens != nil {
		src.fail(path+".max_output_tokens", "must not be set on an embedding model, which produces no output tokens")
	}
	if m.Kind == KindChat {
		m.MaxOutputTokens = bounded(src, path+".max_output_tokens", rm.MaxOutputTokens, DefaultMaxOutputTokens, 1, math.MaxInt64, "at least 1")
	}
	window := DefaultContextWindow(m.Name, first)
	m.ContextWindow = bounded(src, path+".context_window", rm.ContextWindow, window, 1, math.MaxInt64, "at least 1 (tokens)")
	m.MaxToolCalls = bounded(src, path+".max_tool_calls", rm.MaxToolCalls, DefaultMaxToolCalls, 1, maxToolCalls, fmt.Sprintf("within 1 and %d", maxToolCalls))

	price := buildPrice(src, path+".price", rm.Price, m.Kind, first, m.Name)
	for i, rd := range raws {
		dpath := fmt.Sprintf("%s.deployments[%d]", path, i)
		if len(rm.Deployments) == 0 {
			dpath = path // the short form's fields are the model's
		}
		d := rd.build(src, dpath, len(rm.Deployments) == 0, m, price, providers)
		if j := slices.IndexFunc(m.Deployments, func(o Deployment) bool { return o.Name() == d.Name() }); j >= 0 {
			src.fail(dpath+".upstream", "%q at provider %q is already deployments[%d] of this model", d.Upstream, d.Provider, j)
		}
		anthropic := providers[d.Provider] != nil && providers[d.Provider].Kind == ProviderAnthropic
		switch {
		case i == 0:
			m.Anthropic = anthropic
		case anthropic != m.Anthropic:
			src.fail(dpath+".provider", "%q speaks another API than the model's first deployment (%q): a model's deployments are all on anthropic providers or none",
				d.Provider, m.Deployments[0].Provider)
		}
		if anthropic && m.Kind == KindEmbedding {
			src.fail(dpath+".provider", "%q is an anthropic provider, which serves no embedding model", d.Provider)
		}
		m.Deployments = append(m.Deployments, d)
	}
	return m
}

// build checks one deployment of m, whose price defaults to price.
func (rd rawDeployment) build(src *source, path string, short bool, m Model, price money.Price, providers map[string]*Provider) Deployment {
	d := Deployment{Provider: rd.Provider, Upstream: rd.Upstream, Order: rd.Order, Price: price}
	if _, ok := providers[rd.Provider]; rd.Provider == "" {
		src.fail(path+".provider", "required")
	} else if !ok {
		src.fail(path+".provider", "unknown provider %q", rd.Provider)
	}
	if d.Upstream == "" {
		d.Upstream = m.Name
	} else {
		checkModelName(src, path+".upstream", rd.Upstream)
	}
	if rd.Order < 0 {
		src.fail(path+".order", "must be 0 or more, got %d", rd.Order)
	}
	d.Weight = int(bounded(src, path+".weight", rd.Weight, 1, 1, 1000, "within 1 and 1000"))
	if rd.Price != nil {
		d.Price = buildPrice(src, path+".price", rd.Price, m.Kind, d.Upstream, m.Name)
	}
	var kind string
	if pr, ok := providers[rd.Provider]; ok {
		kind = pr.Kind
	}
	if kind == ProviderAnthropic {
		d.Price = d.Price.Anthropic() // its cache writes and reads where the price gives none
	}
	d.Limits = rd.Limits.build(src, path+".limits", kind)
	// A request that cannot fit in a bucket would wait forever.
	byName := d.Limits.ByName()
	for _, b := range limiter.ModelBuckets {
		v := byName[b.Name]
		if (b.Unit == limiter.UnitTokens || b.Unit == limiter.UnitOutputTokens) && v > 0 && m.MaxOutputTokens > v {
			at := path + ".limits." + b.Name
			if short {
				at = path + ".max_output_tokens"
			}
			src.fail(at, "max_output_tokens %d is more than limits.%s (%d) of %s, so a request without max_tokens could never run there",
				m.MaxOutputTokens, b.Name, v, d.Name())
		}
	}
	return d
}

// build checks a model's or a deployment's limits at a provider of kind.
func (rl rawLimits) build(src *source, path, kind string) Limits {
	out := Limits{RPS: rl.RPS, RPM: rl.RPM, RPD: rl.RPD, TPM: rl.TPM, TPD: rl.TPD, ITPM: rl.ITPM, ITPD: rl.ITPD,
		OTPM: rl.OTPM, OTPD: rl.OTPD, BatchQueueTokens: rl.BatchQueueTokens, Burst: DefaultBurst}
	byName := out.ByName()
	for _, b := range limiter.ModelBuckets {
		if v := byName[b.Name]; v < 0 {
			src.fail(path+"."+b.Name, "must be 0 or more, got %d", v)
		}
	}
	if rl.BatchQueueTokens < 0 {
		src.fail(path+".batch_queue_tokens", "must be 0 or more, got %d", rl.BatchQueueTokens)
	}
	out.CacheReadsFree = cacheReadsFree[kind]
	if rl.CacheReads != "" {
		out.CacheReadsFree = oneOf(src, path+".cache_reads", rl.CacheReads, `"counted" or "free"`, CacheReadsCounted, CacheReadsFree) == CacheReadsFree
	}
	if b := rl.Burst; b != nil {
		d, err := time.ParseDuration(*b)
		if err != nil {
			src.fail(path+".burst", "must be a duration such as 500ms or 10s, got %q", *b)
		} else if d < time.Millisecond || d > time.Minute {
			src.fail(path+".burst", "must be within 1ms and 1m (a whole minute's limit at once), got %s", *b)
		}
		out.Burst = d
	}
	return out
}

// checkFallbacks checks each model's and tier's fallbacks.
func (p *Policy) checkFallbacks(src *source) {
	for i, m := range p.Models {
		for k, name := range m.Fallbacks {
			path := fmt.Sprintf("models[%d].fallbacks[%d]", i, k)
			f, ok := p.models[name]
			switch {
			case !ok:
				src.fail(path, "unknown model %q", name)
			case name == m.Name:
				src.fail(path, "a model cannot be its own fallback")
			case slices.Contains(m.Fallbacks[:k], name):
				src.fail(path, "%q is named twice", name)
			case f.Kind != m.Kind:
				src.fail(path, "%q is a %s model and %q a %s one", name, f.Kind, m.Name, m.Kind)
			case f.Anthropic != m.Anthropic:
				src.fail(path, "%q and %q are served by different APIs (Anthropic's Messages API and OpenAI's); a job cannot move between them", name, m.Name)
			}
		}
	}
	for i := range p.Tiers {
		for k, name := range p.Tiers[i].Fallbacks {
			if _, ok := p.models[name]; !ok {
				src.fail(fmt.Sprintf("tiers[%d].fallbacks[%d]", i, k), "unknown model %q", name)
			}
		}
	}
}

// buildPrice checks a price at path; none is money.DefaultPrices of
// upstream, else of name.
func buildPrice(src *source, path string, rp *rawPrice, kind, upstream, name string) money.Price {
	if rp == nil {
		if p, ok := money.DefaultPrices[upstream]; ok {
			return p
		}
		if p, ok := money.DefaultPrices[name]; ok {
			return p
		}
		src.fail(path, "required: llmq knows no default price for %q (give input_per_mtok and output_per_mtok in USD per 1M tokens)", upstream)
		return money.Price{}
	}
	var p money.Price
	outputNeeded := "" // why an absent output price is refused
	if kind == KindChat {
		outputNeeded = "required for a chat model (USD per 1M output tokens)"
	}
	for _, f := range []struct {
		name, needed string
		v            *float64
		to           *money.Micros
	}{
		{"input_per_mtok", "required (USD per 1M input tokens)", rp.InputPerMTok, &p.InputPerMTok},
		{"output_per_mtok", outputNeeded, rp.OutputPerMTok, &p.OutputPerMTok},
		{"cached_input_per_mtok", "", rp.CachedInputPerMTok, &p.CachedInputPerMTok},
		{"cache_write_5m_per_mtok", "", rp.CacheWrite5mPerMTok, &p.CacheWrite5mPerMTok},
		{"cache_write_1h_per_mtok", "", rp.CacheWrite1hPerMTok, &p.CacheWrite1hPerMTok},
		{"batch_input_per_mtok", "", rp.BatchInputPerMTok, &p.BatchInputPerMTok},
		{"batch_output_per_mtok", "", rp.BatchOutputPerMTok, &p.BatchOutputPerMTok},
	} {
		if f.v == nil && f.needed != "" {
			src.fail(path+"."+f.name, "%s", f.needed)
		}
		if f.v != nil {
			*f.to = usd(src, path+"."+f.name, *f.v)
		}
	}
	for _, name := range sortedKeys(rp.ServiceTierPrices) {
		at := path + ".service_tier_prices." + name
		checkIdent(src, at, name)
		if name == money.StandardTier || name == "auto" {
			src.fail(at, "the %s tier is the standard price (input_per_mtok, output_per_mtok); name the tiers sold beside it (flex, priority, scale)", name)
		}
		raw := rp.ServiceTierPrices[name]
		if raw == nil || raw.ServiceTierPrices != nil || raw.ToolPrices != nil || raw.AutoServiceTier != "" {
			src.fail(at, "must be a price of input_per_mtok and output_per_mtok (and cached_input_per_mtok)")
			continue
		}
		if p.ServiceTiers == nil {
			p.ServiceTiers = map[string]money.Price{}
		}
		p.ServiceTiers[name] = buildPrice(src, at, raw, kind, upstream, name)
	}
	switch t := rp.AutoServiceTier; {
	case t == "" || t == money.StandardTier:
	case p.ServiceTiers[t].InputPerMTok == 0 && p.ServiceTiers[t].OutputPerMTok == 0:
		src.fail(path+".auto_service_tier", "must be default or a tier of service_tier_prices, got %q", t)
	default:
		p.AutoTier = t
	}
	for _, name := range sortedKeys(rp.ToolPrices) {
		at := path + ".tool_prices." + name
		checkIdent(src, at, name)
		raw := rp.ToolPrices[name]
		if raw.PerCallUSD == nil {
			src.fail(at+".per_call_usd", "required (USD per call of the tool; 0 for a tool billed in tokens only)")
			continue
		}
		perCall := usd(src, at+".per_call_usd", *raw.PerCallUSD)
		if raw.ResultTokens < 0 {
			src.fail(at+".result_tokens", "must be 0 or more, got %d", raw.ResultTokens)
		}
		if p.Tools == nil {
			p.Tools = map[string]money.ToolPrice{}
		}
		p.Tools[name] = money.ToolPrice{PerCall: perCall, ResultTokens: raw.ResultTokens}
	}
	return p
}

// sortedKeys are m's keys in order, so errors are the same at every load.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func (rt rawTier) build(src *source, path string) Tier {
	t := Tier{Name: rt.Name, Unlimited: rt.Unlimited, APIExempt: rt.APIExempt, Fallbacks: rt.Fallbacks, Timezone: time.UTC,
		RequireOutputLimit: rt.RequireOutputLimit, AllowForeignResponses: rt.AllowForeignResponses}
	checkIdent(src, path+".name", rt.Name)
	switch {
	case rt.Unlimited && rt.DailyBudgetUSD != nil:
		src.fail(path+".daily_budget_usd", "must not be set together with unlimited: true")
	case rt.Unlimited:
	case rt.DailyBudgetUSD == nil:
		src.fail(path+".daily_budget_usd", "required (or unlimited: true for a tier without a budget)")
	default:
		if t.DailyBudget = usd(src, path+".daily_budget_usd", *rt.DailyBudgetUSD); t.DailyBudget == 0 {
			src.fail(path+".daily_budget_usd", "must be more than 0, got %v (for no budget set unlimited: true)", *rt.DailyBudgetUSD)
		}
	}
	if rt.SoftLimit != nil && rt.Unlimited {
		src.fail(path+".soft_limit", "has no effect on an unlimited tier; remove it")
	}
	t.SoftLimit = positive(src, path+".soft_limit", rt.SoftLimit, DefaultSoftLimit, 1, "1")
	t.Priority = oneOf(src, path+".priority", rt.Priority, "critical, default or low", queue.Default, queue.Critical, queue.Low)
	t.OnExhausted = oneOf(src, path+".on_exhausted", rt.OnExhausted, "defer or reject", OnExhaustedDefer, OnExhaustedReject)
	t.BatchOffload = oneOf(src, path+".batch_offload", rt.BatchOffload, "never, auto or always", BatchOffloadNever, BatchOffloadAuto, BatchOffloadAlways)
	rt.buildAPI(src, path, &t)
	t.Share = positive(src, path+".share", rt.Share, 1, MaxShare, fmt.Sprintf("%d (a weight against the other tiers' shares)", MaxShare))
	if rt.Timezone != "" {
		loc, err := time.LoadLocation(rt.Timezone)
		if err != nil || rt.Timezone == "Local" {
			src.fail(path+".timezone", "must be an IANA time zone such as UTC or Europe/Paris, got %q", rt.Timezone)
		} else {
			t.Timezone = loc
		}
	}
	return t
}

// oneOf returns v, or def when v is empty, refusing a value that is neither
// def nor one of others; want lists the values for the error.
func oneOf(src *source, path, v, want, def string, others ...string) string {
	if v != "" && v != def && !slices.Contains(others, v) {
		src.fail(path, "must be %s, got %q", want, v)
	}
	return cmp.Or(v, def)
}

// bounded is *v, or def when v is nil, refusing one out of [lo, hi] (want).
func bounded(src *source, path string, v *int64, def, lo, hi int64, want string) int64 {
	if v == nil {
		return def
	}
	if *v < lo || *v > hi {
		src.fail(path, "must be %s, got %d", want, *v)
	}
	return *v
}

// positive is *v, or def when v is nil, refusing one out of (0, most] (want).
func positive(src *source, path string, v *float64, def, most float64, want string) float64 {
	if v == nil {
		return def
	}
	if math.IsNaN(*v) || *v <= 0 || *v > most {
		src.fail(path, "must be more than 0 and at most %s, got %v", want, *v)
	}
	return *v
}

// usd converts a dollar amount of the policy to Micros.
func usd(src *source, path string, v float64) money.Micros {
	if v < 0 {
		src.fail(path, "must be 0 or more, got %v", v)
		return 0
	}
	m, err := money.FromUSD(v)
	if err != nil {
		src.fail(path, "must be an amount of US dollars: %v", err)
	}
	return m
}

// checkIdent checks a provider or tier name, part of queue names, Redis
// keys and metric labels.
func checkIdent(src *source, path, s string) {
	checkName(src, path, s, 64, ident.MatchString(s),
		"must be lower-case letters, digits, '-' and '_', starting with a letter or digit")
}

var ident = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// checkModelName checks a model name or upstream id: only what would break
// a Redis hash tag or a log line is refused.
func checkModelName(src *source, path, s string) {
	refused := func(r rune) bool { return isSpaceOrControl(r) || r == '{' || r == '}' }
	checkName(src, path, s, 256, !strings.ContainsFunc(s, refused), "must not contain spaces, control characters or braces")
}

// checkName refuses s when empty, longer than most bytes, or not ok: it
// must be as must says.
func checkName(src *source, path, s string, most int, ok bool, must string) {
	switch {
	case s == "":
		src.fail(path, "required")
	case len(s) > most:
		src.fail(path, "must be at most %d characters, got %d", most, len(s))
	case !ok:
		src.fail(path, "%s, got %q", must, s)
	}
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Retention is how long finished work keeps what it no longer needs: each 0
// (for ever, the default) or at least MinRetention.
type Retention struct {
	// FinishedJobs is how long a finished job keeps its request and response.
	FinishedJobs time.Duration
	// Files is how long a file no running batch uses is kept.
	Files time.Duration
	// Ledger is how long a job's ledger row is kept before it is folded into
	// daily totals; 0 or at least MinLedgerRetention.
	Ledger time.Duration
}

// MinRetention is the shortest retention the policy accepts.
const MinRetention = time.Hour

// MinLedgerRetention is the shortest retention.ledger.
const MinLedgerRetention = 72 * time.Hour

func retentionAge(src *source, path string, v *string) time.Duration {
	if v == nil {
		return 0
	}
	d, err := time.ParseDuration(*v)
	if err != nil {
		src.fail(path, "must be a duration such as 720h (30 days), or 0 to keep for ever, got %q", *v)
	} else if d != 0 && d < MinRetention {
		src.fail(path, "must be 0 (keep) or at least %s, got %s", MinRetention, *v)
	}
	return d
}
