package llm

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmq/llmq/client"
)

// AnthropicConfig configures a provider of Anthropic's Messages API.
type AnthropicConfig struct {
	Name string // the provider's name in the policy file; defaults to "anthropic"
	// BaseURL is the API root, as Anthropic's SDKs take it (a trailing /v1
	// is dropped). Defaults to Anthropic's.
	BaseURL string
	APIKey  string // sent as x-api-key; never appears in errors
	// Version is the anthropic-version header. Defaults to 2023-06-01.
	Version string
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
	defaultAnthropicBaseURL = "https://api.anthropic.com"
	defaultAnthropicVersion = "2023-06-01"
)

// anthropicProvider implements Provider for Anthropic's Messages API over
// plain HTTP; see NewAnthropic.
type anthropicProvider struct {
	conn
	baseURL, version string
}

// NewAnthropic returns a Provider calling Anthropic's Messages API, whole
// and streamed, with the x-api-key and anthropic-version headers Anthropic
// requires. It serves EndpointMessages only; the client's body is sent as
// it is but for its model (the upstream id) and, for a stream, "stream":
// true.
func NewAnthropic(cfg AnthropicConfig) Provider {
	return &anthropicProvider{
		conn:    newConn(cmp.Or(cfg.Name, "anthropic"), cfg.APIKey, cfg.Timeout, cfg.MaxResponseBytes, cfg.HTTPClient),
		baseURL: strings.TrimSuffix(strings.TrimRight(cmp.Or(cfg.BaseURL, defaultAnthropicBaseURL), "/"), "/v1"),
		version: cmp.Or(cfg.Version, defaultAnthropicVersion),
	}
}

func (p *anthropicProvider) Call(ctx context.Context, req Request) (*Response, error) {
	if req.Endpoint != EndpointMessages {
		return nil, p.refuse(invalid("endpoint", "'endpoint' %q is not served by provider %s, which serves %s only", req.Endpoint, p.name, EndpointMessages))
	}
	wire, _, err := wireBody(req)
	if err != nil {
		return nil, p.refuse(err)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, p.timeout, errTimeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, p.baseURL+EndpointMessages, bytes.NewReader(wire))
	if err != nil {
		return nil, p.refuse(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("anthropic-version", p.version)
	if p.apiKey != "" {
		hr.Header.Set("x-api-key", p.apiKey)
	}
	if req.Stream != nil {
		hr.Header.Set("Accept", "text/event-stream")
	}
	resp, err := p.http.Do(hr)
	if err != nil {
		return nil, p.noAnswer(ctx, err, 0)
	}
	defer resp.Body.Close()
	e := p.answered(resp)
	switch {
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, p.errorAnswer(e, resp.Body)
	case req.Stream != nil:
		return p.stream(ctx, req, resp, e)
	}
	body, err := p.readAnswer(ctx, resp, e)
	if err != nil {
		return nil, err
	}
	var m struct {
		Type  string          `json:"type"`
		Usage *anthropicUsage `json:"usage"`
	}
	if err := unmarshal(body, &m); err != nil || m.Type != "message" || m.Usage == nil {
		return nil, e.serverError(ClassPermanent, client.CodeProviderResponseInvalid,
			"The provider's answer is not a message of Anthropic's Messages API with its usage.")
	}
	return &Response{StatusCode: resp.StatusCode, Body: body, RequestID: e.RequestID, RateLimit: e.RateLimit, Usage: m.Usage.usage()}, nil
}

// anthropicErrorObject is Anthropic's error: {"type": "error", "error":
// {"type", "message"}}, in an answer or a stream's error event.
type anthropicErrorObject struct {
	Type  string `json:"type"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (o *anthropicErrorObject) object() *client.ErrorObject {
	return &client.ErrorObject{Type: o.Error.Type, Message: o.Error.Message}
}

// Anthropic's error type of a 529: its platform, not the account, is busy.
const overloadedError = "overloaded_error"

// errorAnswer makes e, an answer of an error status, the provider's
// error: its type and message, bounded; a prompt longer than the context
// window is CodeContextLengthExceeded, which a model's fallbacks may serve.
func (p *anthropicProvider) errorAnswer(e *Error, body io.Reader) *Error {
	b, _ := io.ReadAll(io.LimitReader(body, 1<<20))
	var o anthropicErrorObject
	if unmarshal(b, &o) == nil && o.Error != nil {
		p.fill(e, o.object())
		if e.Type == "invalid_request_error" && strings.Contains(o.Error.Message, "prompt is too long") {
			e.Code = client.CodeContextLengthExceeded
		}
	} else {
		e.Message = answerMessage(e.StatusCode, "", false, p.scrub)
	}
	classifyAnswer(e)
	return e
}

// Overloaded reports whether e is Anthropic's 529 overloaded_error: the
// platform is busy for every account, so it is retried with backoff
// without pausing the account's limits.
func (e *Error) Overloaded() bool {
	return e.StatusCode == 529 || e.Type == overloadedError
}

// stream relays a streamed answer's events to req.Stream as they come,
// each event's data as sent: message_start (its usage), the content
// blocks, pings, message_delta (the final usage), message_stop, which
// ends it. An error event ends it with the provider's error.
func (p *anthropicProvider) stream(ctx context.Context, req Request, resp *http.Response, e *Error) (*Response, error) {
	var usage anthropicUsage
	started := false
	const unended = "the provider's stream ended before message_stop"
	out, err := p.relay(ctx, req, resp, e, unended, func(data []byte, out *Response) (end, skip bool, err error) {
		var ev struct {
			Type    string `json:"type"`
			Message *struct {
				Usage *anthropicUsage `json:"usage"`
			} `json:"message"`
			Usage *anthropicUsage `json:"usage"`
		}
		if err := unmarshal(data, &ev); err != nil {
			return false, false, e.cut("the provider's stream sent an event that is not JSON", out.Chunks)
		}
		switch ev.Type {
		case "error":
			var o anthropicErrorObject
			if unmarshal(data, &o) != nil || o.Error == nil {
				return false, false, e.cut("the provider's stream ended with an error it does not explain", out.Chunks)
			}
			return false, false, p.streamFailed(e, o.object(), out.Chunks)
		case "message_start":
			if ev.Message == nil || ev.Message.Usage == nil {
				return false, false, e.cut("the provider's stream began with a message without its usage", out.Chunks)
			}
			usage, started = *ev.Message.Usage, true
		case "message_delta":
			if ev.Usage != nil {
				usage.merge(ev.Usage)
			}
			out.Body = bytes.Clone(data)
		case "message_stop":
			return true, false, nil
		}
		return false, false, nil
	})
	if err != nil {
		return nil, err
	}
	if !started {
		return nil, p.unended(ctx, nil, out.Chunks, unended)
	}
	out.Usage = usage.usage()
	return out, nil
}

// anthropicUsage is a Messages API usage object: the input neither read
// from the cache nor written to it, the cache's writes (by lifetime in
// cache_creation) and reads, the output. A stream's message_delta carries
// the counts that changed.
type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreation            *struct {
		Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
	ServiceTier *string `json:"service_tier"`
}

// merge sets the counts o gives.
func (w *anthropicUsage) merge(o *anthropicUsage) {
	w.InputTokens = cmp.Or(o.InputTokens, w.InputTokens)
	w.OutputTokens = cmp.Or(o.OutputTokens, w.OutputTokens)
	w.CacheCreationInputTokens = cmp.Or(o.CacheCreationInputTokens, w.CacheCreationInputTokens)
	w.CacheReadInputTokens = cmp.Or(o.CacheReadInputTokens, w.CacheReadInputTokens)
	w.CacheCreation = cmp.Or(o.CacheCreation, w.CacheCreation)
	w.ServiceTier = cmp.Or(o.ServiceTier, w.ServiceTier)
}

// usage is w as llmq counts a call: the whole prompt (input, cache writes
// and reads), CachedTokens of it read from the cache, the writes by
// lifetime. Writes cache_creation does not place are counted at the
// hour's, the dearer; a breakdown above cache_creation_input_tokens is
// believed over it.
func (w *anthropicUsage) usage() Usage {
	in, out, reads := deref(w.InputTokens), deref(w.OutputTokens), deref(w.CacheReadInputTokens)
	writes := deref(w.CacheCreationInputTokens)
	var w5, w1 int64
	if c := w.CacheCreation; c != nil {
		w5, w1 = c.Ephemeral5m, c.Ephemeral1h
		w1 += max(writes-w5-w1, 0)
	} else {
		w5 = writes
	}
	u := Usage{PromptTokens: in + reads + w5 + w1, CompletionTokens: out, CachedTokens: reads, CacheWrite5mTokens: w5, CacheWrite1hTokens: w1}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if t := w.ServiceTier; t != nil && *t != "standard" && len(*t) <= 64 {
		u.ServiceTier = *t
	}
	return u
}
