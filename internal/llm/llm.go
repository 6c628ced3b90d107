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

// The endpoints llmq dispatches, as clients name them in jobs and batch lines.
const (
	EndpointChat       = "/v1/chat/completions"
	EndpointEmbeddings = "/v1/embeddings"
	EndpointResponses  = "/v1/responses"
)

// EndpointList names the endpoints for messages: "'a', 'b' or 'c'".
const EndpointList = "'" + EndpointChat + "', '" + EndpointResponses + "' or '" + EndpointEmbeddings + "'"

// KnownEndpoint reports whether llmq dispatches endpoint.
func KnownEndpoint(endpoint string) bool {
	return endpoint == EndpointChat || endpoint == EndpointEmbeddings || endpoint == EndpointResponses
}

// Request is one provider call.
type Request struct {
	Endpoint string
	// Upstream is the provider's model id; it replaces body.model. Empty keeps
	// the body's model.
	Upstream string
	Body     json.RawMessage // the client's request body, as Decode validated it
	// OutputLimit is written into a body that names no output limit (in
	// OutputField's member): the output tokens per choice llmq reserved. 0
	// writes none.
	OutputLimit int64
	// MaxToolCalls is written into a Responses API body that names no
	// max_tool_calls. 0 writes none.
	MaxToolCalls int64
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
	ReasoningTokens  int64 // of CompletionTokens
	ServiceTier      string
	// ToolCalls counts a Responses API answer's calls of built-in tools, by
	// kind (see BuiltinTool).
	ToolCalls map[string]int64
}

// Response is a provider's successful answer.
type Response struct {
	StatusCode int
	Body       json.RawMessage // byte for byte as the provider sent it
	RequestID  string          // the provider's x-request-id
	Usage      Usage
	RateLimit  RateLimit
	Chunks     int // the events a streamed answer relayed
}

// Provider calls one LLM provider. Implementations are safe for concurrent use.
type Provider interface {
	// Name is the provider's name in the policy file.
	Name() string
	// Call sends one request and returns the provider's answer, or an *Error
	// whose Class says whether and how to retry, within the provider's
	// timeout.
	Call(ctx context.Context, req Request) (*Response, error)
}
