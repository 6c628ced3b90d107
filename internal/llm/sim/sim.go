// Package sim is a simulated provider for tests, benchmarks and llmq's
// embedded default. It plays OpenAI (and Azure OpenAI): chat completions,
// the Responses API (plain and streamed, stored responses,
// previous_response_id), embeddings, the model list, and the Files and
// Batches endpoints (BatchConfig) with OpenAI's shapes, and enforces
// requests- and tokens-per-minute (and optionally per-day) limits the way
// OpenAI does: continuously refilled token buckets that charge prompt tokens
// plus max_tokens at admission and get the unused part back when the call
// completes, 429s with OpenAI's error body and rate-limit headers. It plays
// Anthropic too, on POST /v1/messages (EndpointMessages): the Messages API's
// request and response shapes, whole and streamed as Anthropic's event
// sequence, its errors, its limits per model (Limits.ITPM and OTPM: cache
// reads free of ITPM, OTPM charged max_tokens and corrected when the call
// ends), its anthropic-ratelimit-* headers on every answer, its prompt cache
// (cache_control breakpoints, written and read on the simulator's clock),
// its 529 overloaded_error (Faults.Rate529) and its acceleration limits
// (Config.Ramp). Latency, spurious 429s, 500s, 529s and hung requests are
// configurable and deterministic for a seed, and every request that reaches
// the limiter is logged, so tests can check that a client never pushed the
// provider past its limits and waited for the resets it was told. Every call
// it serves is billed in a log of its own (Bill; priced when its model has a
// Model.Price, Anthropic's cache writes and reads at their own prices), and
// in worst-case mode (Config.WorstCase) it bills each call the most a
// provider may, reading what decides the bill from the body itself, as
// OpenAI does, so tests can check llmq's reservations and charges against an
// independent reader.
package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
)

// Limits are one model's rate limits. 0 means no such limit.
type Limits struct {
	RPM int64 `json:"rpm"`
	TPM int64 `json:"tpm"`
	RPD int64 `json:"rpd"`
	TPD int64 `json:"tpd"`
	// ITPM and OTPM are Anthropic's input and output tokens per minute,
	// charged by its Messages API only: ITPM the uncached input and the
	// cache writes (cache reads are free of it), OTPM max_tokens at
	// admission, corrected to the real output when the call ends.
	ITPM int64 `json:"itpm"`
	OTPM int64 `json:"otpm"`
}

func (l Limits) isZero() bool { return l == Limits{} }

func (l Limits) validate(name string) error {
	if l.RPM < 0 || l.TPM < 0 || l.RPD < 0 || l.TPD < 0 || l.ITPM < 0 || l.OTPM < 0 {
		return fmt.Errorf("sim: %s must not be negative, got %+v", name, l)
	}
	return nil
}

// External is an application outside the simulator's clients that uses the
// same account: it sends calls of CallTokens tokens (one request each) at TPM
// tokens per minute, ahead of anyone else whenever the buckets hold one.
type External struct {
	TPM int64 `json:"tpm"`
	// CallTokens is the size of each of its calls. Defaults to 500.
	CallTokens int64 `json:"call_tokens"`
}

// The values of Config.HeadersAt, Config.RateHeaders and Config.RetryAfter.
const (
	HeadersAtAdmission  = "admission"
	HeadersAtCompletion = "completion"

	// HeadersAll is OpenAI's full set: x-ratelimit-limit-, -remaining- and
	// -reset-requests|tokens.
	HeadersAll = "all"
	// HeadersLimitsOnly sends x-ratelimit-limit-* only.
	HeadersLimitsOnly = "limits"
	// HeadersNone sends no rate-limit header at all.
	HeadersNone = "none"
	// HeadersAzure is Azure OpenAI's pay-as-you-go set:
	// x-ratelimit-remaining-requests and -tokens only, no limit, no reset.
	HeadersAzure = "azure"
	// HeadersAzurePTU is a provisioned Azure deployment's:
	// azure-openai-deployment-utilization (the share of the token bucket in
	// use, in percent) and x-ratelimit-remaining-requests.
	HeadersAzurePTU = "azure-ptu"
	// HeadersAnthropic is Anthropic's set:
	// anthropic-ratelimit-requests|tokens-limit|remaining|reset, the
	// remaining tokens rounded down to the thousand, the reset an RFC 3339
	// time.
	HeadersAnthropic = "anthropic"

	// RetryAfterMS sends retry-after-ms and retry-after (whole seconds,
	// rounded up) on a 429, as OpenAI does; with HeadersAzure and
	// HeadersAzurePTU, x-ms-retry-after-ms too.
	RetryAfterMS = "ms"
	// RetryAfterSeconds sends retry-after in whole seconds only.
	RetryAfterSeconds = "seconds"
	// RetryAfterDate sends retry-after as an HTTP date only.
	RetryAfterDate = "date"
	// RetryAfterNone sends no wait at all.
	RetryAfterNone = "none"
)

// Ramp limits how fast a provider lets usage grow (Anthropic's
// "acceleration limits" on sharp increases): in each 10 s window of its
// clock it admits at most Growth times the tokens it admitted in the window
// before, and never less than Floor of the TPM's share of 10 s (of ITPM +
// OTPM for a model with no TPM: Anthropic's limits). A sharp ramp thus meets
// 429s although under the per-minute limits.
type Ramp struct {
	// Growth is the most one window's tokens may be of the previous one's.
	// 0 means no ramp limit.
	Growth float64 `json:"growth"`
	// Floor is the share of a window's tokens always admitted, however
	// quiet the window before. Defaults to 0.25.
	Floor float64 `json:"floor"`
}

// rampWindow is the window of Ramp.
const rampWindow = 10 * time.Second

// Model configures one model.
type Model struct {
	// Limits replace Config.Limits for this model when any of them is set.
	Limits Limits
	// DefaultMaxTokens replaces Config.DefaultMaxTokens when set.
	DefaultMaxTokens int64
	// ContextWindow, when set, is the model's context length: a chat or
	// Responses API request whose prompt and max_tokens (max_output_tokens)
	// exceed it is refused with OpenAI's 400 context_length_exceeded,
	// before admission.
	ContextWindow int64
	// Price, when set, prices each of the model's calls in its bill
	// (Bill.Cost): OpenAI's calls by money.Price.Cost, Anthropic's with
	// cache writes at 1.25 times the input price (2 times for the hour's
	// cache) and reads at a tenth (CachedInputPerMTok when set); batch
	// lines at Price.Batch(). Defaults to no price: Bill.Cost is 0.
	Price money.Price
}

// Faults are the failures the simulator injects, each decided per request
// from the seed before admission, so none of them consumes the buckets.
type Faults struct {
	// Rate429 is the fraction of requests answered with a 429 (with headers)
	// even when the buckets would admit them. Defaults to 0.
	Rate429 float64 `json:"rate_429"`
	// Rate500 is the fraction answered with a 500 and OpenAI's error body.
	// Defaults to 0.
	Rate500 float64 `json:"rate_500"`
	// Rate529 is the fraction answered as a platform too busy for anyone,
	// not the account: Anthropic's 529 overloaded_error on its Messages
	// API, OpenAI's 503 elsewhere. Like every fault it charges nothing.
	// Defaults to 0.
	Rate529 float64 `json:"rate_529"`
	// RateHang is the fraction that get no answer until the client gives up
	// or HangFor passes. Defaults to 0.
	RateHang float64 `json:"rate_hang"`
	// HangFor is how long a hung request waits before a 504; 0 waits until
	// the client gives up or the server closes. Defaults to 0.
	HangFor time.Duration `json:"hang_for"`
	// RetryAfter429 is the retry-after of spurious 429s. Defaults to 1s.
	RetryAfter429 time.Duration `json:"retry_after_429"`
	// OmitUsage is the fraction of admitted answers that carry no usage (a
	// stream's, no usage chunk). Defaults to 0.
	OmitUsage float64 `json:"omit_usage"`
	// StreamError is the fraction of admitted streamed answers that fail
	// after their first content: a chat stream with an {"error": …} chunk,
	// a Responses API stream with an error or a response.failed event (half
	// of each), then the end of the stream, without [DONE] or the final
	// response. The call was admitted and counted, as a provider bills it.
	// Defaults to 0.
	StreamError float64 `json:"stream_error"`
}

func (f Faults) validate() error {
	for _, r := range []struct {
		name string
		v    float64
	}{{"Rate429", f.Rate429}, {"Rate500", f.Rate500}, {"Rate529", f.Rate529}, {"RateHang", f.RateHang}, {"OmitUsage", f.OmitUsage}, {"StreamError", f.StreamError}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("sim: Faults.%s must be within [0, 1], got %v", r.name, r.v)
		}
	}
	if s := f.Rate429 + f.Rate500 + f.Rate529 + f.RateHang; s > 1+1e-9 {
		return fmt.Errorf("sim: Faults.Rate429 + Rate500 + Rate529 + RateHang must be at most 1, got %v", s)
	}
	if f.HangFor < 0 {
		return fmt.Errorf("sim: Faults.HangFor must not be negative, got %v", f.HangFor)
	}
	if f.RetryAfter429 < 0 {
		return fmt.Errorf("sim: Faults.RetryAfter429 must not be negative, got %v", f.RetryAfter429)
	}
	return nil
}

// Config configures a simulator.
type Config struct {
	// Limits apply to every model without limits of its own. Defaults to no
	// limits.
	Limits Limits
	// Models configures models by name. Defaults to none.
	Models map[string]Model
	// SharedBuckets makes all models draw on one set of buckets, sized by
	// Limits; by default each model has its own, as at OpenAI.
	SharedBuckets bool
	// OnlyKnownModels answers 404 model_not_found for models not in Models
	// (or added since by SetModelLimits). Defaults to false: any model name
	// is served.
	OnlyKnownModels bool
	// DefaultMaxTokens is what a chat request without max_tokens (a
	// Responses API request without max_output_tokens) is charged per
	// choice at admission. Defaults to 4096.
	DefaultMaxTokens int64
	// Refund gives the unused part of max_tokens back to the token buckets
	// RefundDelay after a call completes. Defaults to false: as OpenAI
	// documents its limits, prompt + max_tokens stay charged.
	Refund bool
	// RefundDelay is how long after completion a refund comes. Defaults to 0.
	RefundDelay time.Duration
	// PromptFactor is how many tokens the provider counts, at admission and
	// in usage, per prompt token of llmq's estimator: a model whose
	// tokenizer is not tiktoken's. Defaults to 1.
	PromptFactor float64
	// External is another application drawing on the same account's
	// limits. Defaults to none.
	External External
	// HeadersAt is when x-ratelimit-remaining-* and -reset-* are computed:
	// HeadersAtAdmission (after the call is charged) or HeadersAtCompletion
	// (when the answer is sent, after any refund). Defaults to admission.
	HeadersAt string
	// RateHeaders is which rate-limit headers are sent: HeadersAll,
	// HeadersLimitsOnly, HeadersNone, HeadersAzure, HeadersAzurePTU or
	// HeadersAnthropic. Defaults to all.
	RateHeaders string
	// HeaderNoise is the share of answers whose rate-limit headers say
	// nothing meaningful, as some Azure deployments send: each remaining
	// count is "-1" or "0" beside a limit of "-1". Defaults to 0.
	HeaderNoise float64
	// RetryAfter is how a 429 says when to try again: RetryAfterMS,
	// RetryAfterSeconds, RetryAfterDate or RetryAfterNone. Defaults to ms.
	RetryAfter string
	// ShortWindow enforces the per-minute limits over a shorter window too.
	// Defaults to none.
	ShortWindow ShortWindow
	// Ramp limits how fast usage may grow. Defaults to none.
	Ramp Ramp
	// Latency is the base time to answer an admitted request. Defaults to 0.
	Latency time.Duration
	// Jitter adds a uniform [0, Jitter) to Latency. Defaults to 0.
	Jitter time.Duration
	// LatencyPerToken adds this much per completion token. Defaults to 0.
	LatencyPerToken time.Duration
	// LatencyDist, when set, replaces Latency and Jitter: it maps a uniform
	// draw in [0, 1) to a latency, for any distribution. Defaults to nil.
	LatencyDist func(u float64) time.Duration
	// Faults are the injected failures. Defaults to none.
	Faults Faults
	// Seed makes faults, latencies, completion lengths and embeddings
	// reproducible: the n-th request of a run draws the same numbers for the
	// same seed. Defaults to 0 (itself a seed).
	Seed uint64
	// CompletionMin and CompletionMax bound completion_tokens as fractions
	// of max_tokens: it is drawn uniformly between them and kept within
	// [1, max_tokens]. Default to 0 and 1.
	CompletionMin, CompletionMax float64
	// Echo starts every chat completion's content with the request's "user"
	// field, so tests can tell which answer belongs to which request.
	// Defaults to false.
	Echo bool
	// EmbeddingDim is the length of embeddings when the request does not ask
	// for dimensions. Defaults to 64.
	EmbeddingDim int
	// WorstCase bills every admitted call (plain, streamed, a batch line)
	// the most a provider may: each choice produces its whole output limit
	// (max_tokens or max_completion_tokens, the larger; max_output_tokens;
	// else the model's default max tokens), a Responses API call offering
	// built-in tools makes max_tool_calls calls (10 when it sets none) and
	// is billed the input of the multi-turn run they make, a chat call with
	// web_search_options one web search; no input token is cached. Server.
	// SetWorstCase and POST /sim/mode change it while serving. Defaults to
	// false: completions are drawn within CompletionMin and CompletionMax,
	// and no built-in tool is called.
	WorstCase bool
	// ToolResultTokens is what the result of one built-in tool call adds to
	// the context of the turns after it, in worst-case mode. Defaults to
	// 1000.
	ToolResultTokens int64
	// APIKey, when set, must be the key of every request, to every path
	// (the control API's too): as a bearer token, or in Azure's api-key
	// header; others get OpenAI's 401. Defaults to "" (any key, or none).
	APIKey string
	// RandomIDs draws the ids of responses, completions, files, batches and
	// requests from crypto/rand. Defaults to false: they follow from Seed
	// and a counter, so a run with one seed repeats byte for byte (and a
	// client can guess them: use RandomIDs wherever the simulator is
	// reachable by more than one client).
	RandomIDs bool
	// Now is the clock of the buckets and the log; tests inject one so that
	// refills need no sleeping. Defaults to time.Now.
	Now func() time.Time
	// Logger receives the simulator's few log lines (never request content).
	// Defaults to discarding them.
	Logger *slog.Logger
	// LogSize is how many admission log entries are kept; older ones are
	// dropped. Defaults to 100000.
	LogSize int
	// MaxBodyBytes bounds a request body. Defaults to 32 MiB.
	MaxBodyBytes int64
	// StoredResponses is how many Responses API responses are kept for GET
	// /v1/responses/{id} and previous_response_id, the most recent ones.
	// Defaults to 10000.
	StoredResponses int
	// CacheMinTokens is the shortest prompt prefix Anthropic's Messages API
	// caches at a cache_control breakpoint; shorter prefixes are neither
	// written nor read. Defaults to 1024, the minimum Anthropic documents
	// for most of its models.
	CacheMinTokens int64
	// Batch configures the Files and Batches endpoints (OpenAI's Batch
	// API): how fast batches run, their queue limits, and how they expire
	// or fail. Its defaults complete a batch of a few thousand lines within
	// about a second.
	Batch BatchConfig
}

// Validate reports the first invalid field of c, by name.
func (c Config) Validate() error {
	if err := c.Limits.validate("Config.Limits"); err != nil {
		return err
	}
	for name, m := range c.Models {
		if err := m.Limits.validate("Config.Models[" + name + "].Limits"); err != nil {
			return err
		}
		if m.DefaultMaxTokens < 0 {
			return fmt.Errorf("sim: Config.Models[%s].DefaultMaxTokens must not be negative", name)
		}
	}
	if err := c.Faults.validate(); err != nil {
		return err
	}
	if err := c.Batch.validate(); err != nil {
		return err
	}
	switch {
	case c.DefaultMaxTokens < 0:
		return fmt.Errorf("sim: Config.DefaultMaxTokens must not be negative, got %d", c.DefaultMaxTokens)
	case c.ToolResultTokens < 0 || c.ToolResultTokens > maxToolResultTokens:
		return fmt.Errorf("sim: Config.ToolResultTokens must be within [0, %d], got %d", maxToolResultTokens, c.ToolResultTokens)
	case c.Latency < 0 || c.Jitter < 0 || c.LatencyPerToken < 0:
		return errors.New("sim: Config.Latency, Jitter and LatencyPerToken must not be negative")
	case c.CompletionMin < 0 || c.CompletionMin > 1 || c.CompletionMax < 0 || c.CompletionMax > 1 || c.CompletionMin > c.CompletionMax && c.CompletionMax != 0:
		return fmt.Errorf("sim: Config.CompletionMin and CompletionMax must satisfy 0 ≤ min ≤ max ≤ 1, got %v and %v", c.CompletionMin, c.CompletionMax)
	case c.EmbeddingDim < 0 || c.EmbeddingDim > maxEmbeddingDim:
		return fmt.Errorf("sim: Config.EmbeddingDim must be within [1, %d], got %d", maxEmbeddingDim, c.EmbeddingDim)
	case c.CacheMinTokens < 0:
		return fmt.Errorf("sim: Config.CacheMinTokens must not be negative, got %d", c.CacheMinTokens)
	case c.LogSize < 0:
		return fmt.Errorf("sim: Config.LogSize must not be negative, got %d", c.LogSize)
	case c.StoredResponses < 0:
		return fmt.Errorf("sim: Config.StoredResponses must not be negative, got %d", c.StoredResponses)
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("sim: Config.MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes)
	case c.RefundDelay < 0:
		return fmt.Errorf("sim: Config.RefundDelay must not be negative, got %v", c.RefundDelay)
	case c.PromptFactor < 0 || math.IsNaN(c.PromptFactor) || c.PromptFactor > 100:
		return fmt.Errorf("sim: Config.PromptFactor must be within (0, 100], got %v", c.PromptFactor)
	case c.External.TPM < 0 || c.External.CallTokens < 0:
		return fmt.Errorf("sim: Config.External must not be negative, got %+v", c.External)
	case c.HeadersAt != "" && c.HeadersAt != HeadersAtAdmission && c.HeadersAt != HeadersAtCompletion:
		return fmt.Errorf("sim: Config.HeadersAt must be %q or %q, got %q", HeadersAtAdmission, HeadersAtCompletion, c.HeadersAt)
	case c.RateHeaders != "" && !slices.Contains(rateHeaderModes, c.RateHeaders):
		return fmt.Errorf("sim: Config.RateHeaders must be one of %s, got %q", strings.Join(rateHeaderModes, ", "), c.RateHeaders)
	case c.HeaderNoise < 0 || c.HeaderNoise > 1 || math.IsNaN(c.HeaderNoise):
		return fmt.Errorf("sim: Config.HeaderNoise must be within [0, 1], got %v", c.HeaderNoise)
	case c.RetryAfter != "" && !slices.Contains(retryAfterForms, c.RetryAfter):
		return fmt.Errorf("sim: Config.RetryAfter must be one of %s, got %q", strings.Join(retryAfterForms, ", "), c.RetryAfter)
	case c.Ramp.Growth < 0 || math.IsNaN(c.Ramp.Growth) || c.Ramp.Floor < 0 || c.Ramp.Floor > 1 || math.IsNaN(c.Ramp.Floor):
		return fmt.Errorf("sim: Config.Ramp must have Growth ≥ 0 and Floor within [0, 1], got %+v", c.Ramp)
	}
	return c.ShortWindow.validate()
}

const maxEmbeddingDim = 8192

// maxToolResultTokens bounds Config.ToolResultTokens, so that the worst
// multi-turn input stays far within an int64.
const maxToolResultTokens = 1 << 30

var (
	rateHeaderModes = []string{HeadersAll, HeadersLimitsOnly, HeadersNone, HeadersAzure, HeadersAzurePTU, HeadersAnthropic}
	retryAfterForms = []string{RetryAfterMS, RetryAfterSeconds, RetryAfterDate, RetryAfterNone}
)

func (c *Config) setDefaults() {
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = 4096
	}
	if c.ToolResultTokens == 0 {
		c.ToolResultTokens = 1000
	}
	if c.CompletionMax == 0 {
		c.CompletionMax = 1
	}
	if c.EmbeddingDim == 0 {
		c.EmbeddingDim = 64
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.LogSize == 0 {
		c.LogSize = 100_000
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.StoredResponses == 0 {
		c.StoredResponses = 10_000
	}
	if c.Faults.RetryAfter429 == 0 {
		c.Faults.RetryAfter429 = time.Second
	}
	if c.PromptFactor == 0 {
		c.PromptFactor = 1
	}
	if c.External.CallTokens == 0 {
		c.External.CallTokens = 500
	}
	if c.HeadersAt == "" {
		c.HeadersAt = HeadersAtAdmission
	}
	if c.RateHeaders == "" {
		c.RateHeaders = HeadersAll
	}
	if c.RetryAfter == "" {
		c.RetryAfter = RetryAfterMS
	}
	if c.CacheMinTokens == 0 {
		c.CacheMinTokens = 1024
	}
	if c.Ramp.Growth > 0 && c.Ramp.Floor == 0 {
		c.Ramp.Floor = 0.25
	}
	c.Batch.setDefaults()
}

// Server is a simulated provider. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config // fixed after New, except what the setters change under mu
	est     *llm.Estimator
	arrival atomic.Uint64 // numbers requests for the seeded draws
	flight  atomic.Int64
	// worstCase is Config.WorstCase, changed by SetWorstCase.
	worstCase atomic.Bool

	closeOnce sync.Once
	closed    chan struct{}

	mu      sync.Mutex
	limits  Limits
	models  map[string]Model
	faults  Faults
	buckets map[string]*buckets // by model; "" when shared
	log     *ring[Admission]
	bills   *ring[Bill]
	stats   Stats

	bat       *batchStore    // files and batches, under their own lock
	responses *responseStore // stored responses, under their own lock
	prompts   *promptCache   // Anthropic's cached prompt prefixes, under their own lock
}

// buckets are one model's (or, shared, every model's) limits, with the
// refunds still to come and the external application's backlog.
type buckets struct {
	rpm, tpm, rpd, tpd bucket
	// itpm and otpm are Anthropic's input and output token buckets.
	itpm, otpm bucket
	// shortReq and shortTok count the per-minute limits over
	// Config.ShortWindow; nil when there is none.
	shortReq, shortTok *window
	ramp               rampState
	refunds            []refund // by time
	ext                externalState
}

// rampState counts the tokens admitted in Ramp's current window and the one
// before.
type rampState struct {
	index     int64
	now, prev float64
}

// New returns a simulator. It panics, naming the field, if cfg is invalid;
// call cfg.Validate first for configuration that comes from users.
func New(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg.setDefaults()
	// The caller keeps its map; the server's copy changes only under mu.
	models := make(map[string]Model, len(cfg.Models))
	for k, v := range cfg.Models {
		models[k] = v
	}
	cfg.Models = nil
	s := &Server{
		cfg:       cfg,
		est:       llm.NewEstimator(),
		closed:    make(chan struct{}),
		limits:    cfg.Limits,
		models:    models,
		faults:    cfg.Faults,
		buckets:   make(map[string]*buckets),
		log:       newRing[Admission](cfg.LogSize),
		bills:     newRing[Bill](cfg.LogSize),
		bat:       newBatchStore(cfg.Batch),
		responses: newResponseStore(cfg.StoredResponses),
		prompts:   newPromptCache(),
	}
	s.worstCase.Store(cfg.WorstCase)
	return s
}

// Close ends hung and slow requests at once, so a server in front of the
// handler can shut down. The handler answers 503 afterwards.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closed) })
}

// SetLimits sets the requests and tokens per minute of every model that has
// no limits of its own (keeping per-day limits), effective at once: buckets
// keep what they hold, up to their new capacity.
func (s *Server) SetLimits(rpm, tpm int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limits
	l.RPM, l.TPM = max(rpm, 0), max(tpm, 0)
	s.setLimitsLocked("", l)
}

// SetModelLimits sets the limits of one model ("" for the defaults of every
// model without limits of its own).
func (s *Server) SetModelLimits(model string, l Limits) error {
	if err := l.validate("limits"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLimitsLocked(model, l)
	return nil
}

// SetContextWindow sets the context length of model (0: none).
func (s *Server) SetContextWindow(model string, tokens int64) error {
	if tokens < 0 {
		return fmt.Errorf("sim: context window must not be negative, got %d", tokens)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[model]
	m.ContextWindow = tokens
	s.models[model] = m
	return nil
}

func (s *Server) setLimitsLocked(model string, l Limits) {
	if model == "" {
		s.limits = l
	} else {
		m := s.models[model]
		m.Limits = l
		s.models[model] = m
	}
	now := s.cfg.Now()
	for name, b := range s.buckets {
		if model != "" && name != model {
			continue
		}
		nl := s.limitsLocked(name)
		b.rpm.setLimit(nl.RPM, now)
		b.tpm.setLimit(nl.TPM, now)
		b.rpd.setLimit(nl.RPD, now)
		b.tpd.setLimit(nl.TPD, now)
		b.itpm.setLimit(nl.ITPM, now)
		b.otpm.setLimit(nl.OTPM, now)
		b.shortReq, b.shortTok = s.shortWindows(nl, now)
	}
}

// SetFaults replaces the injected failures.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	if f.RetryAfter429 == 0 {
		f.RetryAfter429 = time.Second
	}
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
	return nil
}

// Limits returns the limits that apply to model.
func (s *Server) Limits(model string) Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limitsLocked(model)
}

func (s *Server) limitsLocked(model string) Limits {
	if s.cfg.SharedBuckets {
		return s.limits
	}
	if m, ok := s.models[model]; ok && !m.Limits.isZero() {
		return m.Limits
	}
	return s.limits
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	// Refunds and the external application's calls that are due by now
	// count, as the buckets would show them.
	now := s.cfg.Now()
	for _, b := range s.buckets {
		s.advanceLocked(b, now)
	}
	st := s.stats
	st.LogDropped = s.log.dropped
	st.BillsDropped = s.bills.dropped
	s.mu.Unlock()
	st.InFlight = s.flight.Load()
	return st
}

// Admissions returns the admission log entries after seq after (0 for all
// that are kept), oldest first.
func (s *Server) Admissions(after int64) []Admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.since(after)
}

// Reset clears the counters (the batch counters too), the admission log and
// the bill log, and refills every bucket. Files, batches and stored
// responses stay.
func (s *Server) Reset() {
	s.resetBatchStats()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = Stats{}
	s.log = newRing[Admission](s.cfg.LogSize)
	s.bills = newRing[Bill](s.cfg.LogSize)
	s.buckets = make(map[string]*buckets)
}

// TestServer is a simulator listening on a loopback port.
type TestServer struct {
	*Server
	// URL is the server's root, e.g. http://127.0.0.1:41234.
	URL string
	// BaseURL is URL + "/v1", the BaseURL of an OpenAI client.
	BaseURL string

	listening sync.Mutex
	hs        *httptest.Server // nil while down
}

// Start serves a new simulator on a loopback port. Close it when done.
func Start(cfg Config) *TestServer {
	s := New(cfg)
	hs := httptest.NewServer(s.Handler())
	return &TestServer{Server: s, URL: hs.URL, BaseURL: hs.URL + "/v1", hs: hs}
}

// Down makes the simulator a provider that went down: new connections are
// refused and open ones dropped (their calls fail), until Up.
func (t *TestServer) Down() {
	t.listening.Lock()
	defer t.listening.Unlock()
	if t.hs != nil {
		t.hs.CloseClientConnections()
		t.hs.Close()
		t.hs = nil
	}
}

// Up serves again, on the address the simulator had, with what it had
// counted and learned; it does nothing while it serves.
func (t *TestServer) Up() error {
	t.listening.Lock()
	defer t.listening.Unlock()
	if t.hs != nil {
		return nil
	}
	l, err := net.Listen("tcp", strings.TrimPrefix(t.URL, "http://"))
	if err != nil {
		return fmt.Errorf("sim: listen again on %s: %w", t.URL, err)
	}
	t.hs = &httptest.Server{Listener: l, Config: &http.Server{Handler: t.Server.Handler()}}
	t.hs.Start()
	return nil
}

// Close ends hung requests and stops the listener.
func (t *TestServer) Close() {
	t.Server.Close()
	t.Down()
}
