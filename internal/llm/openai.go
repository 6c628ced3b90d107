package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/wire"
)

// OpenAIConfig configures a provider that speaks OpenAI's API.
type OpenAIConfig struct {
	// Name is the provider's name in the policy file. Defaults to "openai".
	Name string
	// BaseURL is the API root, ending in /v1, of OpenAI or any compatible
	// server. Defaults to "https://api.openai.com/v1".
	BaseURL string
	// APIKey is sent as a bearer token (Azure: in the api-key header). It
	// never appears in errors.
	APIKey string
	// Azure makes the provider Azure OpenAI: BaseURL is the resource's
	// endpoint (https://<resource>.openai.azure.com), the key goes in the
	// api-key header, and a request's Upstream is a deployment's name. With
	// APIVersion, calls go to the deployment's path with that api-version;
	// without, to Azure's v1 API (BaseURL/openai/v1, OpenAI's paths, the
	// deployment named in the body's model).
	Azure      bool
	APIVersion string
	// Timeout bounds every call, whatever the caller's context allows.
	// Defaults to 60s.
	Timeout time.Duration
	// MaxResponseBytes bounds an answer's body (a stream's, all its events
	// together): past it the call fails with
	// client.CodeProviderResponseTooLarge. Defaults to DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// HTTPClient sends the requests. It is copied, never modified; its
	// Transport is wrapped to capture response headers and bodies. Defaults to
	// a client whose transport keeps up to 256 idle connections per host, so
	// a busy worker does not reconnect for every call.
	HTTPClient *http.Client
}

const (
	defaultOpenAIBaseURL = "https://api.openai.com/v1"
	defaultTimeout       = 60 * time.Second
	// DefaultMaxResponseBytes bounds a provider's answer when its
	// configuration names no bound: a chat completion of 100,000 tokens is
	// under 1 MiB, 2048 embeddings of 1536 floats as JSON about 35 MiB (as
	// base64, 12 MiB).
	DefaultMaxResponseBytes = 16 << 20
)

// errResponseTooLarge is the transport's refusal of an answer past the
// provider's bound.
var errResponseTooLarge = errors.New("the provider's answer is larger than its max_response_bytes")

// openAIProvider implements Provider over go-openai; see NewOpenAI.
type openAIProvider struct {
	name        string
	apiKey      string
	baseURL     string // OpenAI's paths go under it; for Azure with an api-version, /openai/deployments/… does
	azure       bool
	apiVersion  string // Azure's, or ""
	timeout     time.Duration
	maxResponse int64
	client      *openai.Client
	http        *http.Client // for streams, which go-openai's typed chunks would rewrite
}

// NewOpenAI returns a Provider for OpenAI or any server compatible with its
// chat completions and embeddings API, built on go-openai.
//
// What go-openai v1.43.0 would lose, and what is done about it:
//   - Request fields. Its typed requests drop every field they do not model
//     (modalities, audio, prompt_cache_key, web_search_options, vendor
//     extensions such as top_k), drop zero values that are not defaults
//     (temperature 0 and top_p 0 are omitted, so the provider would sample at
//     temperature 1), keep only text and image_url content parts (the data of
//     input_audio and file parts is lost), keep only the type and function of
//     tools, and put only the fields they model in embeddings requests. So a
//     chat request holding only the model (an embeddings request decoded from
//     the body) drives go-openai's URL, authentication and decoding of the
//     answer, and the wire body is the client's own with "model" set to
//     Upstream: the capturing transport swaps it in.
//   - Response fields. The typed responses drop fields they do not model
//     (message annotations and audio, usage details beyond cached tokens) and
//     turn base64 embeddings (encoding_format "base64") into float arrays, so
//     re-encoding them would change what the client asked for. Response.Body
//     is the provider's bytes as captured by the transport; the typed response
//     gives the usage.
//   - Headers of errors. *openai.APIError carries none, so a 429's
//     retry-after would be lost; the transport keeps the headers of every
//     response.
//   - Client-side checks. go-openai refuses max_tokens, n, temperature and
//     tools for the reasoning models it knows; the fields those checks read
//     are cleared in the typed request (the wire body keeps them), so the
//     provider judges. Chat bodies its types cannot
//     hold are sent all the same. Embeddings bodies it cannot decode (a
//     dimensions that is not a number) are refused as permanent errors, since
//     its decoding of the answer depends on the request's encoding_format.
func NewOpenAI(cfg OpenAIConfig) Provider {
	if cfg.Name == "" {
		cfg.Name = "openai"
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = defaultOpenAIBaseURL
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	var hc http.Client
	if cfg.HTTPClient != nil {
		hc = *cfg.HTTPClient
	}
	base := hc.Transport
	if base == nil {
		if cfg.HTTPClient != nil {
			base = http.DefaultTransport
		} else {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.MaxIdleConns = 1024
			t.MaxIdleConnsPerHost = 256
			base = t
		}
	}
	hc.Transport = &captureTransport{base: base}
	oc := openai.DefaultConfig(cfg.APIKey)
	oc.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	if cfg.Azure {
		oc = azureConfig(cfg)
	}
	oc.HTTPClient = &hc
	return &openAIProvider{
		name:        cfg.Name,
		apiKey:      cfg.APIKey,
		baseURL:     oc.BaseURL,
		azure:       cfg.Azure,
		apiVersion:  oc.APIVersion,
		timeout:     cfg.Timeout,
		maxResponse: cfg.MaxResponseBytes,
		client:      openai.NewClientWithConfig(oc),
		http:        &hc,
	}
}

// azureConfig is go-openai's configuration for Azure OpenAI. With an
// api-version it is go-openai's Azure type, which puts the deployment in the
// path. Azure's v1 API takes OpenAI's paths under /openai/v1 with the
// api-key header and no api-version: go-openai's Cloudflare-Azure type is
// the one that sends exactly that.
func azureConfig(cfg OpenAIConfig) openai.ClientConfig {
	base := strings.TrimRight(cfg.BaseURL, "/")
	oc := openai.DefaultAzureConfig(cfg.APIKey, base)
	// The deployment's name as the policy gives it (go-openai's default
	// drops dots and colons from some names).
	oc.AzureModelMapperFunc = func(model string) string { return model }
	if cfg.APIVersion != "" {
		oc.APIVersion = cfg.APIVersion
		return oc
	}
	oc.APIType, oc.APIVersion, oc.BaseURL = openai.APITypeCloudflareAzure, "", base+"/openai/v1"
	return oc
}

// chatURL is where a chat completion of upstream is sent (streams; go-openai
// builds the same URLs for the other calls).
func (p *openAIProvider) chatURL(upstream string) string {
	if p.azure && p.apiVersion != "" {
		return p.baseURL + "/openai/deployments/" + url.PathEscape(upstream) + "/chat/completions?api-version=" +
			url.QueryEscape(p.apiVersion)
	}
	return p.baseURL + "/chat/completions"
}

// authorize puts the API key on h as the provider takes it.
func (p *openAIProvider) authorize(h http.Header) {
	switch {
	case p.apiKey == "":
	case p.azure:
		h.Set(openai.AzureAPIKeyHeader, p.apiKey)
	default:
		h.Set("Authorization", "Bearer "+p.apiKey)
	}
}

func (p *openAIProvider) Name() string { return p.name }

func (p *openAIProvider) Call(ctx context.Context, req Request) (*Response, error) {
	if req.Stream != nil {
		return p.stream(ctx, req)
	}
	wire, model, err := wireBody(req)
	if err != nil {
		return nil, p.refuse(err)
	}
	if req.Endpoint == EndpointResponses {
		return p.respond(ctx, wire)
	}
	c := &capture{wire: wire, limit: p.maxResponse}
	ctx, cancel := context.WithTimeoutCause(context.WithValue(ctx, captureKey{}, c), p.timeout, errTimeout)
	defer cancel()

	var usage openai.Usage
	switch req.Endpoint {
	case EndpointChat:
		resp, cerr := p.client.CreateChatCompletion(ctx, openai.ChatCompletionRequest{Model: model})
		err, usage = cerr, resp.Usage
	case EndpointEmbeddings:
		var er openai.EmbeddingRequest
		if err := unmarshal(wire, &er); err != nil {
			return nil, p.refuse(fmt.Errorf("the request cannot be represented: %w", err))
		}
		resp, cerr := p.client.CreateEmbeddings(ctx, er)
		err, usage = cerr, resp.Usage
	default:
		return nil, p.refuse(invalid("endpoint", "'endpoint' %q is not supported", req.Endpoint))
	}
	if err != nil {
		return nil, p.failure(ctx, c, err)
	}
	out := &Response{
		StatusCode: c.status,
		Body:       c.body,
		RequestID:  requestID(c.header),
		RateLimit:  ParseRateLimit(c.header),
		Usage: Usage{
			PromptTokens:     int64(usage.PromptTokens),
			CompletionTokens: int64(usage.CompletionTokens),
			TotalTokens:      int64(usage.TotalTokens),
		},
	}
	if usage.PromptTokensDetails != nil {
		out.Usage.CachedTokens = int64(usage.PromptTokensDetails.CachedTokens)
	}
	return out, nil
}

// wireBody is the client's body as llmq sends it, and its model: model set
// to the upstream id; the output limit llmq reserved written in when the
// body states none (req.OutputLimit, in OutputField's member), so the
// provider's default, which may be its model's whole output window, never
// applies; max_tool_calls written in when a Responses body names none
// (req.MaxToolCalls). Nothing else of the body changes; a body that needs
// none of these is sent as it came.
//
// go-openai is handed a request that holds only the model (for the URL and
// its model checks): the wire body is what is sent (the capture transport
// puts it in). Its typed request is never filled from the body: a body the
// typed request cannot hold (a stop given as a string, a metadata value that
// is not a string) is still sent as it is, and go-openai's reasoning-model
// checks, a library's snapshot of what models accepted when it was written
// (no max_tokens, n or temperature for o1, o3, o4 and gpt-5), see no
// parameters: the provider judges them, and its 400 names them.
func wireBody(req Request) (wire []byte, model string, err error) {
	var fields map[string]json.RawMessage
	if err := unmarshal(req.Body, &fields); err != nil || fields == nil {
		return nil, "", invalid("body", "'body' must be a JSON object")
	}
	if s, ok := fields["stream"]; ok && string(bytes.TrimSpace(s)) == "true" && req.Stream == nil {
		return nil, "", invalid("stream", "'stream' is not supported")
	}
	changed := false
	if req.Upstream == "" {
		_ = unmarshal(fields["model"], &model)
	} else if m, _ := json.Marshal(req.Upstream); !bytes.Equal(bytes.TrimSpace(fields["model"]), m) {
		fields["model"], model, changed = m, req.Upstream, true
	} else {
		model = req.Upstream
	}
	if req.OutputLimit > 0 && !statesOutputLimit(req.Endpoint, fields) {
		if name := OutputField(req.Endpoint, model); name != "" {
			fields[name], changed = json.RawMessage(strconv.FormatInt(req.OutputLimit, 10)), true
		}
	}
	if _, ok := fields["max_tool_calls"]; req.MaxToolCalls > 0 && req.Endpoint == EndpointResponses && !ok {
		fields["max_tool_calls"], changed = json.RawMessage(strconv.FormatInt(req.MaxToolCalls, 10)), true
	}
	if !changed {
		return req.Body, model, nil
	}
	wire, err = json.Marshal(fields)
	return wire, model, err
}

// statesOutputLimit reports whether a body's members state its output
// limit for endpoint (with exact names: admission refused their case
// variants).
func statesOutputLimit(endpoint string, fields map[string]json.RawMessage) bool {
	if endpoint == EndpointResponses {
		return !isNull(fields["max_output_tokens"])
	}
	return !isNull(fields["max_tokens"]) || !isNull(fields["max_completion_tokens"])
}

// reasoningPrefixes are the model families that refuse max_tokens and take
// their output limit as max_completion_tokens.
var reasoningPrefixes = []string{"o1", "o3", "o4", "gpt-5"}

// OutputField is the member that states an output limit in a body for
// endpoint to model: max_output_tokens on the Responses API; on chat
// completions max_completion_tokens for a reasoning model, which refuses
// max_tokens, and max_tokens for the others, which every server of
// OpenAI's API takes. "" for embeddings.
func OutputField(endpoint, model string) string {
	switch endpoint {
	case EndpointResponses:
		return "max_output_tokens"
	case EndpointChat:
		m := normalizeModel(model)
		for _, p := range reasoningPrefixes {
			if strings.HasPrefix(m, p) {
				return "max_completion_tokens"
			}
		}
		return "max_tokens"
	}
	return ""
}

// refuse is a request that was never sent.
func (p *openAIProvider) refuse(err error) *Error {
	e := &Error{Class: ClassPermanent, Provider: p.name, Type: "invalid_request_error", Message: p.scrub(err.Error())}
	var ir *wire.Error
	if errors.As(err, &ir) {
		e.Param = ir.Param
	}
	return e
}

// failure turns go-openai's error into an *Error, with the headers the
// transport captured.
func (p *openAIProvider) failure(ctx context.Context, c *capture, err error) *Error {
	e := &Error{Provider: p.name, Err: err}
	if c.header != nil {
		e.RateLimit = ParseRateLimit(c.header)
		e.RequestID = requestID(c.header)
	}
	var apiErr *openai.APIError
	var reqErr *openai.RequestError
	switch {
	case errors.Is(err, errResponseTooLarge):
		e.StatusCode = c.status
		e.Class, e.Code, e.Type = ClassPermanent, client.CodeProviderResponseTooLarge, "server_error"
		e.Message = fmt.Sprintf("The provider's answer is larger than its max_response_bytes (%d bytes).", p.maxResponse)
		e.Err = nil
		return e
	case errors.As(err, &apiErr):
		e.StatusCode = apiErr.HTTPStatusCode
		o := &client.ErrorObject{Message: apiErr.Message, Type: apiErr.Type, Code: client.Code(codeString(apiErr.Code))}
		if apiErr.Param != nil {
			o.Param = *apiErr.Param
		}
		fill(e, o)
		e.Message = answerMessage(apiErr.HTTPStatusCode, e.Message, true, p.scrub)
		e.Err = nil // the message is the error; go-openai's text repeats it
	case errors.As(err, &reqErr):
		e.StatusCode = reqErr.HTTPStatusCode
		e.Message = answerMessage(reqErr.HTTPStatusCode, "", false, p.scrub)
		e.Err = nil
	case c.status >= 200 && c.status < 300 && json.Valid(c.body):
		// JSON, but not of an OpenAI answer's shape (a usage of 1.5
		// tokens): the provider answered and bills it; another try would
		// get the same.
		e.StatusCode = c.status
		e.Class, e.Code, e.Type = ClassPermanent, client.CodeProviderResponseInvalid, "server_error"
		e.Message = answerMessage(c.status, "The provider's answer is not of the shape of an OpenAI answer: "+err.Error(), true, p.scrub)
		e.Err = nil
		return e
	case c.status >= 200 && c.status < 300:
		// The provider said yes but its body did not decode: a truncated or
		// mangled answer, worth another try.
		e.StatusCode = c.status
		e.Class, e.Code, e.Type = ClassRetryable, client.CodeProviderResponseUnreadable, "server_error"
		e.Message = "The provider's answer could not be read (truncated or not JSON)."
		return e
	case c.status != 0:
		// An answer go-openai took for success but could not decode: a
		// redirect or another unexpected status, from a misconfigured base URL.
		e.StatusCode = c.status
		e.Class = Classify(c.status)
		e.Message = "unexpected HTTP status " + strconv.Itoa(c.status)
		return e
	case !c.sent:
		// Refused by go-openai's own checks before anything was sent.
		e.Class = ClassPermanent
		e.Type = "invalid_request_error"
		e.Message = p.scrub(err.Error())
		e.Err = nil
		return e
	default:
		// No answer: a timeout, a cancellation or a connection error.
		e.Class = ClassRetryable
		switch {
		case errors.Is(context.Cause(ctx), errTimeout):
			e.Message = "no answer within " + p.timeout.String()
		case errors.Is(err, context.Canceled):
			e.Message = "the call was cancelled"
		default:
			e.Message = "the provider could not be reached"
		}
		e.Err = scrubbedError{err, p.scrub(err.Error())}
		return e
	}
	classifyAnswer(e)
	return e
}

// classifyAnswer sets the class of an error the provider answered.
func classifyAnswer(e *Error) {
	e.Class = Classify(e.StatusCode)
	// OpenAI answers 429 when the account's quota or credit is exhausted:
	// waiting for a bucket to refill will not help, so it is permanent.
	if e.Class == ClassRateLimited && (e.Code == client.CodeInsufficientQuota || e.Type == "insufficient_quota") {
		e.Class = ClassPermanent
	}
}

// scrub removes the configured API key from text that may echo it.
func (p *openAIProvider) scrub(s string) string {
	if p.apiKey != "" && strings.Contains(s, p.apiKey) {
		s = strings.ReplaceAll(s, p.apiKey, "[redacted]")
	}
	return redact(s)
}

// scrubbedError keeps the chain of an error (for errors.Is) under a text that
// has been scrubbed.
type scrubbedError struct {
	err  error
	text string
}

func (s scrubbedError) Error() string { return s.text }
func (s scrubbedError) Unwrap() error { return s.err }

func codeString(code any) string {
	switch c := code.(type) {
	case nil:
		return ""
	case string:
		return c
	case int:
		return strconv.Itoa(c)
	default:
		return fmt.Sprint(c)
	}
}

// errTimeout is the cause of a call's own deadline, told apart from the
// caller's; it is still a context.DeadlineExceeded for errors.Is.
var errTimeout = fmt.Errorf("provider timeout: %w", context.DeadlineExceeded)

type captureKey struct{}

// capture is one call's view of its HTTP exchange. Each call has its own,
// reached through the request's context, so one client serves concurrent
// calls; the transport fills it on the caller's goroutine before go-openai
// returns.
type capture struct {
	wire   []byte // the body to send instead of go-openai's
	limit  int64  // the most an answer's body may hold
	sent   bool
	status int
	header http.Header
	body   []byte // a 2xx answer's body
}

// captureTransport sends the call's own body, and keeps the status, headers
// and (for 2xx answers) the body of the response.
type captureTransport struct {
	base http.RoundTripper
}

func (t *captureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, _ := req.Context().Value(captureKey{}).(*capture)
	if c == nil {
		return t.base.RoundTrip(req)
	}
	if c.wire != nil && req.Body != nil {
		// RoundTrippers must not modify the request they are given.
		wire := c.wire
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(wire))
		req.ContentLength = int64(len(wire))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(wire)), nil }
	}
	c.sent = true
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	c.status, c.header = resp.StatusCode, resp.Header
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, c.limit+1))
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if int64(len(body)) > c.limit {
			return nil, errResponseTooLarge
		}
		c.body = body
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	return resp, nil
}
