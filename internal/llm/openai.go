package llm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/wire"
)

// OpenAIConfig configures a provider that speaks OpenAI's API.
type OpenAIConfig struct {
	Name    string // the provider's name in the policy file; defaults to "openai"
	BaseURL string // the API root, ending in /v1; defaults to OpenAI's
	APIKey  string // never appears in errors
	// Azure makes the provider Azure OpenAI: BaseURL is the resource's
	// endpoint, the key goes in the api-key header, and a request's Upstream
	// is a deployment's name. With APIVersion, calls go to the deployment's
	// path; without, to Azure's v1 API.
	Azure      bool
	APIVersion string
	// Timeout bounds every call, whatever the caller's context allows.
	// Defaults to 60s.
	Timeout time.Duration
	// MaxResponseBytes bounds an answer's body (a stream's, all its events).
	// Defaults to DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// HTTPClient sends the requests; it is copied, its Transport wrapped.
	// Defaults to a client keeping 256 idle connections per host.
	HTTPClient *http.Client
}

const (
	defaultOpenAIBaseURL    = "https://api.openai.com/v1"
	defaultTimeout          = 60 * time.Second
	DefaultMaxResponseBytes = 16 << 20 // when the configuration names no bound
)

var errResponseTooLarge = errors.New("the provider's answer is larger than its max_response_bytes")

// conn is what every Provider of this package holds alike: its name, its
// key (never in errors), the bounds of a call and the HTTP client, and the
// errors it makes of a call alike.
type conn struct {
	name        string
	apiKey      string
	timeout     time.Duration
	maxResponse int64
	http        *http.Client
}

// newConn is the conn of a provider: timeout and maxResponse defaulted,
// hc copied with its Transport wrapped in a captureTransport (a client
// keeping 256 idle connections per host when hc is nil).
func newConn(name, apiKey string, timeout time.Duration, maxResponse int64, hc *http.Client) conn {
	var c http.Client
	var base http.RoundTripper = http.DefaultTransport
	if hc != nil {
		c = *hc
		if c.Transport != nil {
			base = c.Transport
		}
	} else {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 256
		base = t
	}
	c.Transport = &captureTransport{base: base}
	return conn{name: name, apiKey: apiKey, timeout: cmp.Or(max(timeout, 0), defaultTimeout),
		maxResponse: cmp.Or(max(maxResponse, 0), DefaultMaxResponseBytes), http: &c}
}

// openAIProvider implements Provider over go-openai; see NewOpenAI. Its
// conn's client sends streams and the Responses API, which go-openai's
// typed chunks would rewrite or lacks.
type openAIProvider struct {
	conn
	baseURL    string
	azure      bool
	apiVersion string // Azure's, or ""
	client     *openai.Client
}

// NewOpenAI returns a Provider for OpenAI or any server compatible with its
// API, built on go-openai for URLs, authentication and decoding answers.
// go-openai's typed requests and responses drop what they do not model and
// its errors carry no headers, so a capturing transport sends the client's
// own body (wireBody) and keeps each answer's bytes and headers. An
// embeddings body go-openai cannot decode is refused: its decoding of the
// answer depends on the request's encoding_format.
func NewOpenAI(cfg OpenAIConfig) Provider {
	cfg.Name = cmp.Or(cfg.Name, "openai")
	cfg.BaseURL = cmp.Or(cfg.BaseURL, defaultOpenAIBaseURL)
	c := newConn(cfg.Name, cfg.APIKey, cfg.Timeout, cfg.MaxResponseBytes, cfg.HTTPClient)
	oc := openai.DefaultConfig(cfg.APIKey)
	oc.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	if cfg.Azure {
		oc = azureConfig(cfg)
	}
	oc.HTTPClient = c.http
	return &openAIProvider{
		conn:       c,
		baseURL:    oc.BaseURL,
		azure:      cfg.Azure,
		apiVersion: oc.APIVersion,
		client:     openai.NewClientWithConfig(oc),
	}
}

// azureConfig is go-openai's configuration for Azure OpenAI: its Azure type
// with an api-version; for Azure's v1 API (OpenAI's paths under /openai/v1,
// the api-key header, no api-version) its Cloudflare-Azure type, which sends
// exactly that.
func azureConfig(cfg OpenAIConfig) openai.ClientConfig {
	base := strings.TrimRight(cfg.BaseURL, "/")
	oc := openai.DefaultAzureConfig(cfg.APIKey, base)
	// go-openai's default mapper drops dots and colons from some names.
	oc.AzureModelMapperFunc = func(model string) string { return model }
	if cfg.APIVersion != "" {
		oc.APIVersion = cfg.APIVersion
		return oc
	}
	oc.APIType, oc.APIVersion, oc.BaseURL = openai.APITypeCloudflareAzure, "", base+"/openai/v1"
	return oc
}

func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }

func (p *conn) Name() string { return p.name }

func (p *openAIProvider) Call(ctx context.Context, req Request) (*Response, error) {
	wire, model, err := wireBody(req)
	switch {
	case err != nil:
		return nil, p.refuse(err)
	case req.Stream != nil:
		return p.stream(ctx, req, wire)
	case req.Endpoint == EndpointResponses:
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
	u := Usage{PromptTokens: int64(usage.PromptTokens), CompletionTokens: int64(usage.CompletionTokens), TotalTokens: int64(usage.TotalTokens)}
	if usage.PromptTokensDetails != nil {
		u.CachedTokens = int64(usage.PromptTokensDetails.CachedTokens)
	}
	return &Response{StatusCode: c.status, Body: c.body, RequestID: requestID(c.header), RateLimit: ParseRateLimit(c.header), Usage: u}, nil
}

// wireBody is the client's body as llmq sends it, and its model: model set
// to the upstream id; the output limit llmq reserved written in when the
// body states none, so the provider's default (maybe the model's whole
// output window) never applies; max_tool_calls written in when a Responses
// body names none; for req.Stream, a stream that ends with the usage.
// Nothing else changes.
//
// go-openai is handed a request holding only the model: a body its types
// cannot hold is sent as it is, and its reasoning-model checks see no
// parameters, so the provider judges them.
func wireBody(req Request) (wire []byte, model string, err error) {
	if req.Stream != nil && req.Endpoint == EndpointEmbeddings {
		return nil, "", invalid("stream", "'stream' is not supported for %s", EndpointEmbeddings)
	}
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
	// The body's own limit, by exact names: admission refused their case variants.
	statesLimit := !isNull(fields["max_tokens"]) || !isNull(fields["max_completion_tokens"])
	if req.Endpoint == EndpointResponses {
		statesLimit = !isNull(fields["max_output_tokens"])
	}
	if req.OutputLimit > 0 && !statesLimit {
		if name := OutputField(req.Endpoint, model); name != "" {
			fields[name], changed = json.RawMessage(strconv.FormatInt(req.OutputLimit, 10)), true
		}
	}
	if _, ok := fields["max_tool_calls"]; req.MaxToolCalls > 0 && req.Endpoint == EndpointResponses && !ok {
		fields["max_tool_calls"], changed = json.RawMessage(strconv.FormatInt(req.MaxToolCalls, 10)), true
	}
	if req.Stream != nil {
		fields["stream"], changed = json.RawMessage("true"), true
		if req.Endpoint == EndpointChat {
			fields["stream_options"] = json.RawMessage(`{"include_usage":true}`)
		}
	}
	if !changed {
		return req.Body, model, nil
	}
	wire, err = json.Marshal(fields)
	return wire, model, err
}

// reasoningPrefixes are the model families that refuse max_tokens and take
// their output limit as max_completion_tokens.
var reasoningPrefixes = []string{"o1", "o3", "o4", "gpt-5"}

// OutputField is the member that states an output limit in a body for
// endpoint to model: on chat completions max_completion_tokens for a
// reasoning model, which refuses max_tokens, else max_tokens, which every
// server takes; the Messages API's max_tokens. "" for embeddings.
func OutputField(endpoint, model string) string {
	switch endpoint {
	case EndpointResponses:
		return "max_output_tokens"
	case EndpointMessages:
		return "max_tokens"
	case EndpointChat:
		m := normalizeModel(model)
		if slices.ContainsFunc(reasoningPrefixes, func(p string) bool { return strings.HasPrefix(m, p) }) {
			return "max_completion_tokens"
		}
		return "max_tokens"
	}
	return ""
}

// refuse is a request that was never sent.
func (p *conn) refuse(err error) *Error {
	e := &Error{Class: ClassPermanent, Provider: p.name, Type: "invalid_request_error", Message: p.scrub(err.Error())}
	var ir *wire.Error
	if errors.As(err, &ir) {
		e.Param = ir.Param
	}
	return e
}

// failure turns go-openai's error into an *Error, with the captured headers.
func (p *openAIProvider) failure(ctx context.Context, c *capture, err error) *Error {
	e := &Error{Provider: p.name, StatusCode: c.status, RateLimit: ParseRateLimit(c.header), RequestID: requestID(c.header)}
	var apiErr *openai.APIError
	var reqErr *openai.RequestError
	switch {
	case errors.Is(err, errResponseTooLarge):
		return p.tooLarge(e, "answer")
	case errors.As(err, &apiErr): // its message is the error; go-openai's text repeats it
		e.StatusCode = apiErr.HTTPStatusCode // 0 for one wrapped in a RequestError
		o := &client.ErrorObject{Message: apiErr.Message, Type: apiErr.Type}
		if apiErr.Code != nil { // a string or a number
			o.Code = client.Code(fmt.Sprint(apiErr.Code))
		}
		if apiErr.Param != nil {
			o.Param = *apiErr.Param
		}
		p.fill(e, o)
	case errors.As(err, &reqErr):
		e.Message = answerMessage(e.StatusCode, "", false, p.scrub)
	case c.status >= 200 && c.status < 300 && json.Valid(c.body):
		// Billed, and another try would get the same.
		return p.notOpenAIShape(e, err)
	case c.status >= 200 && c.status < 300:
		e.Err = err
		return e.serverError(ClassRetryable, client.CodeProviderResponseUnreadable, msgUnreadable)
	case c.status != 0:
		// A redirect or another unexpected status: a misconfigured base URL.
		e.Class, e.Message, e.Err = Classify(c.status), "unexpected HTTP status "+strconv.Itoa(c.status), err
		return e
	case !c.sent:
		// Refused by go-openai's own checks.
		e.Class, e.Type, e.Message = ClassPermanent, "invalid_request_error", p.scrub(err.Error())
		return e
	default:
		return p.noAnswer(ctx, err, 0)
	}
	classifyAnswer(e)
	return e
}

const msgUnreadable = "The provider's answer could not be read (truncated or not JSON)."

// tooLarge makes e the refusal of an answer (what: "answer", "stream")
// past max_response_bytes.
func (p *conn) tooLarge(e *Error, what string) *Error {
	return e.serverError(ClassPermanent, client.CodeProviderResponseTooLarge,
		fmt.Sprintf("The provider's %s is larger than its max_response_bytes (%d bytes).", what, p.maxResponse))
}

// notOpenAIShape makes e the refusal of a JSON answer that is not of an
// OpenAI answer's shape (a usage of 1.5 tokens).
func (p *openAIProvider) notOpenAIShape(e *Error, err error) *Error {
	return e.serverError(ClassPermanent, client.CodeProviderResponseInvalid,
		answerMessage(e.StatusCode, "The provider's answer is not of the shape of an OpenAI answer: "+err.Error(), true, p.scrub))
}

// classifyAnswer sets the class of an error the provider answered. A 429 of
// an exhausted quota is permanent: no bucket's refill will help.
func classifyAnswer(e *Error) {
	e.Class = Classify(e.StatusCode)
	if e.Class == ClassRateLimited && (e.Code == "insufficient_quota" || e.Type == "insufficient_quota") {
		e.Class = ClassPermanent
	}
}

// scrub removes the configured API key, and what redact masks, from s.
func (p *conn) scrub(s string) string {
	if p.apiKey != "" && strings.Contains(s, p.apiKey) {
		s = strings.ReplaceAll(s, p.apiKey, "[redacted]")
	}
	return redact(s)
}

// scrubbedError keeps an error's chain under a scrubbed text.
type scrubbedError struct {
	err  error
	text string
}

func (s scrubbedError) Error() string { return s.text }
func (s scrubbedError) Unwrap() error { return s.err }

// errTimeout is the cause of a call's own deadline, told apart from the
// caller's.
var errTimeout = fmt.Errorf("provider timeout: %w", context.DeadlineExceeded)

type captureKey struct{}

// capture is one call's view of its HTTP exchange, reached through the
// request's context, so one client serves concurrent calls.
type capture struct {
	wire   []byte // the body to send instead of go-openai's
	limit  int64
	sent   bool
	status int
	header http.Header
	body   []byte // a 2xx answer's body
}

// captureTransport sends the call's own body and fills its capture.
type captureTransport struct {
	base http.RoundTripper
}

func (t *captureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, _ := req.Context().Value(captureKey{}).(*capture)
	if c == nil {
		return t.base.RoundTrip(req)
	}
	if c.wire != nil && req.Body != nil {
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
