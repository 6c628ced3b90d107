// Package llm owns llmq's one way of talking to an LLM provider: the Provider
// interface and its implementations (OpenAI's API and Azure's, Anthropic's
// Messages API), the classification of
// provider errors, the parsing of rate-limit headers, and the validation and
// token estimation of client request bodies.
package llm

import (
	"context"
	"encoding/json"
)

// The endpoints llmq dispatches, as clients name them in jobs and batch lines.
const (
	EndpointChat       = "/v1/chat/completions"
	EndpointEmbeddings = "/v1/embeddings"
	EndpointResponses  = "/v1/responses"
	EndpointMessages   = "/v1/messages" // Anthropic's Messages API
)

// EndpointList names the endpoints for messages.
const EndpointList = "'" + EndpointChat + "', '" + EndpointResponses + "', '" + EndpointEmbeddings + "' or '" + EndpointMessages + "'"

// KnownEndpoint reports whether llmq dispatches endpoint.
func KnownEndpoint(endpoint string) bool {
	return endpoint == EndpointChat || endpoint == EndpointEmbeddings || endpoint == EndpointResponses || endpoint == EndpointMessages
}

// Request is one provider call.
type Request struct {
	Endpoint string
	Upstream string          // the provider's model id, replacing body.model; "" keeps it
	Body     json.RawMessage // the client's request body, as Decode validated it
	// OutputLimit (the output tokens per choice llmq reserved) and
	// MaxToolCalls are written into a body that states none (see wireBody);
	// 0 writes none.
	OutputLimit, MaxToolCalls int64
	// Stream, when set, asks for the answer as Server-Sent Events, with the
	// usage, and is given each event's data as it arrives, "[DONE]" not. An
	// error from Stream ends the call with that error.
	Stream func(data []byte) error
}

// Usage is what the provider says a call consumed.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	CachedTokens     int64 // of PromptTokens, served from the prompt cache
	// CacheWrite5mTokens and CacheWrite1hTokens are of PromptTokens, written
	// to the prompt cache for five minutes and for the hour (Anthropic's).
	CacheWrite5mTokens, CacheWrite1hTokens int64
	ReasoningTokens                        int64 // of CompletionTokens
	ServiceTier                            string
	ToolCalls                              map[string]int64 // a Responses API answer's built-in tool calls, by kind
}

// Response is a provider's successful answer.
type Response struct {
	StatusCode int
	Body       json.RawMessage // byte for byte as the provider sent it
	RequestID  string          // the provider's x-request-id (Anthropic's request-id)
	Usage      Usage
	RateLimit  RateLimit
	Chunks     int // the events a streamed answer relayed
}

// Provider calls one LLM provider. Implementations are safe for concurrent use.
type Provider interface {
	// Name is the provider's name in the policy file.
	Name() string
	// Call sends one request and returns the provider's answer, or an *Error
	// whose Class says whether and how to retry.
	Call(ctx context.Context, req Request) (*Response, error)
}
