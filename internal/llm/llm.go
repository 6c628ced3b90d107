// Package llm owns llmq's one way of talking to an LLM provider: the Provider
// interface and its OpenAI-compatible implementation (over go-openai), the
// classification of provider errors into rate-limited, retryable and permanent,
// the parsing of OpenAI's rate-limit headers, and the validation and token
// estimation of client request bodies that the HTTP API, batch validation, the
// limiter and the budget rely on. The simulated provider lives in llm/sim.
package llm

import (
	"context"
	"encoding/json"
)

// The endpoints llmq dispatches. They are the paths clients use in jobs and in
// batch input lines; a provider's BaseURL already ends in "/v1".
const (
	EndpointChat       = "/v1/chat/completions"
	EndpointEmbeddings = "/v1/embeddings"
	EndpointResponses  = "/v1/responses"
)

// EndpointList names the endpoints for messages: "'a', 'b' or 'c'".
const EndpointList = "'" + EndpointChat + "', '" + EndpointResponses + "' or '" + EndpointEmbeddings + "'"

// KnownEndpoint reports whether llmq dispatches endpoint.
func KnownEndpoint(endpoint string) bool {
	switch endpoint {
	case EndpointChat, EndpointEmbeddings, EndpointResponses:
		return true
	}
	return false
}

// Request is one provider call.
type Request struct {
	// Endpoint is EndpointChat, EndpointResponses or EndpointEmbeddings.
	Endpoint string
	// Upstream is the provider's model id; it replaces body.model. Empty keeps
	// the body's model.
	Upstream string
	// Body is the client's request body, as validated by Decode.
	Body json.RawMessage
	// OutputLimit is written into a body that names no output limit: the
	// output tokens per choice llmq reserved, as max_tokens (as
	// max_completion_tokens for a reasoning model; max_output_tokens on
	// the Responses API). 0 writes none.
	OutputLimit int64
	// MaxToolCalls is written into a Responses API body that names no
	// max_tool_calls: the built-in tool calls llmq reserved. 0 writes none.
	MaxToolCalls int64
	// Stream, when set, asks for a chat completion as Server-Sent Events
	// ("stream": true, with stream_options.include_usage, so the usage
	// always comes) and is given the data of each event as it arrives, the
	// usage chunk included, "[DONE]" not. Call returns when the stream ends;
	// an error from Stream ends the call with that error.
	Stream func(data []byte) error
}

// Usage is what the provider says a call consumed.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	// CachedTokens is the part of PromptTokens served from the provider's
	// prompt cache (billed at the cached price).
	CachedTokens int64
	// ReasoningTokens is the part of CompletionTokens the model spent
	// reasoning (billed as output).
	ReasoningTokens int64
	// ServiceTier is the service tier the answer says served the call
	// (its service_tier); "" when it says none.
	ServiceTier string
	// ToolCalls counts a Responses API answer's calls of built-in tools,
	// by kind (see BuiltinTool): billed per call.
	ToolCalls map[string]int64
}

// Response is a provider's successful answer.
type Response struct {
	StatusCode int
	// Body is the provider's response JSON, byte for byte as it was sent, so
	// fields this code does not model (and base64 embeddings) reach clients.
	Body json.RawMessage
	// RequestID is the provider's x-request-id, for support tickets.
	RequestID string
	Usage     Usage
	// RateLimit is what the response headers say about the provider's buckets.
	RateLimit RateLimit
	// Chunks counts the events a streamed answer relayed; 0 unstreamed.
	Chunks int
}

// Provider calls one LLM provider. Implementations are safe for concurrent use.
type Provider interface {
	// Name is the provider's name in the policy file, for logs and metrics.
	Name() string
	// Call sends one request and returns the provider's answer, or an *Error
	// whose Class says whether and how to retry. It never waits longer than the
	// provider's timeout, whatever ctx allows.
	Call(ctx context.Context, req Request) (*Response, error)
}
