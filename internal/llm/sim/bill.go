package sim

import (
	"maps"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
)

// Bill is what the simulator billed for one call: every admitted call,
// plain or streamed (a stream that failed midway too, and one whose usage
// was left out of its answer: the provider bills what it served), and every
// answered line of a batch on its Batch API. An answer's usage, when it
// carries one, is exactly its bill, so a test can compare what llmq charged
// each job with what the provider billed, call by call.
type Bill struct {
	// Seq is the call's admission log entry; 0 for a batch line, which
	// does not pass the rate limiter.
	Seq int64 `json:"seq"`
	// Endpoint is llm.EndpointChat, llm.EndpointResponses or
	// llm.EndpointEmbeddings.
	Endpoint string `json:"endpoint"`
	// Model is the model as the request named it.
	Model string `json:"model"`
	// ServiceTier is the tier the call was served in: the one asked for,
	// "default" for "auto" or none.
	ServiceTier string `json:"service_tier"`
	// InputTokens is the prompt as the answer's usage counts it: all of it
	// on OpenAI's APIs (CachedTokens of it from the cache), the part
	// neither read from the cache nor written to it on Anthropic's
	// (input_tokens; CachedTokens is then cache_read_input_tokens).
	InputTokens  int64 `json:"input_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	// CacheWrite5mTokens and CacheWrite1hTokens are an Anthropic call's
	// prompt written to the cache for five minutes and for the hour.
	CacheWrite5mTokens int64 `json:"cache_write_5m_tokens,omitempty"`
	CacheWrite1hTokens int64 `json:"cache_write_1h_tokens,omitempty"`
	OutputTokens       int64 `json:"output_tokens"`
	// Cost is the call at its model's price (Model.Price), rounded up to
	// the micro-dollar; 0 for a model without one.
	Cost money.Micros `json:"cost_micros"`
	// ToolCalls counts the built-in tool calls the answer made, by kind:
	// "web_search", "file_search", "code_interpreter", "image_generation".
	// Nil when it made none.
	ToolCalls map[string]int64 `json:"tool_calls,omitempty"`
	// ResponseID is a Responses API answer's id.
	ResponseID string `json:"response_id,omitempty"`
	// RequestID is the call's request id: its answer's x-request-id, a
	// batch line's request_id.
	RequestID string `json:"request_id"`
	// Batch marks a line of a batch on the simulator's Batch API.
	Batch bool `json:"batch,omitempty"`
	// Stream marks a streamed call.
	Stream bool `json:"stream,omitempty"`
}

// The kinds of built-in tools a bill counts calls of.
const (
	ToolWebSearch       = "web_search"
	ToolFileSearch      = "file_search"
	ToolCodeInterpreter = "code_interpreter"
	ToolImageGeneration = "image_generation"
)

// Bills returns the bills of the calls since the simulator started (or was
// reset), oldest first: the last Config.LogSize of them, as the admission
// log keeps its last entries (Stats.BillsDropped counts the others).
func (s *Server) Bills() []Bill {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.bills.since(0)
	for i := range out {
		out[i].ToolCalls = maps.Clone(out[i].ToolCalls)
	}
	return out
}

// record prices b and counts it in the stats and the bill log.
func (s *Server) record(b Bill) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b.Cost = cost(s.models[b.Model].Price, &b)
	s.stats.PromptTokens += b.InputTokens
	s.stats.CompletionTokens += b.OutputTokens
	s.bills.add(b)
}

// WorstCase reports whether the simulator bills every call the most a
// provider may (Config.WorstCase).
func (s *Server) WorstCase() bool { return s.worstCase.Load() }

// SetWorstCase turns the worst-case mode on or off, for calls admitted from
// now on (and batch lines answered from now on).
func (s *Server) SetWorstCase(on bool) { s.worstCase.Store(on) }

// respond draws the answer to c as request n at now: its body and its bill.
// In worst-case mode each choice produces its whole output limit and a
// Responses API call offering built-in tools makes all the calls it allows,
// billed as the multi-turn run they make (multiTurnInput).
func (s *Server) respond(c *call, n uint64, now time.Time) ([]byte, Bill) {
	b := Bill{Endpoint: c.endpoint, Model: c.p.Model, ServiceTier: c.terms.tier, InputTokens: c.prompt}
	if c.endpoint == llm.EndpointEmbeddings {
		b.ServiceTier = "default"
		return s.embeddingResponse(n, c.p, c.prompt, c.emb), b
	}
	worst := s.worstCase.Load()
	completions := make([]int64, c.terms.n)
	for i := range completions {
		if worst {
			completions[i] = c.maxTokens
		} else {
			completions[i] = s.completionTokens(c.maxTokens, s.draw(n, drawCompletion+uint64(i)))
		}
		b.OutputTokens += completions[i]
	}
	var calls []string
	if worst && c.terms.calls > 0 {
		calls = make([]string, c.terms.calls)
		b.ToolCalls = make(map[string]int64, len(c.terms.builtins))
		for i := range calls {
			calls[i] = c.terms.builtins[i%len(c.terms.builtins)]
			b.ToolCalls[calls[i]]++
		}
		b.InputTokens = multiTurnInput(c.prompt, s.cfg.ToolResultTokens, b.OutputTokens, c.terms.calls)
	}
	if c.endpoint == llm.EndpointResponses {
		return s.responsesResponse(c, n, now, &b, calls), b
	}
	return s.chatResponse(c, n, now, &b, completions), b
}

// cost is bill b at price p by money.Price.Cost, rounded up to the
// micro-dollar: an Anthropic call at p.Anthropic() (its uncached input at
// the input price, its cache writes at 1.25 times it for five minutes or 2
// times for the hour, its cache reads at CachedInputPerMTok, else a tenth
// of the input price, as Anthropic prices prompt caching); a batch line at
// p.Batch().
func cost(p money.Price, b *Bill) money.Micros {
	if b.Batch {
		p = p.Batch()
	}
	t := money.Tokens{Prompt: b.InputTokens, Cached: b.CachedTokens, Completion: b.OutputTokens}
	if b.Endpoint == EndpointMessages {
		// Anthropic's input_tokens are the prompt neither read nor written.
		p = p.Anthropic()
		t.Prompt += b.CachedTokens + b.CacheWrite5mTokens + b.CacheWrite1hTokens
		t.CacheWrite5m, t.CacheWrite1h = b.CacheWrite5mTokens, b.CacheWrite1hTokens
	}
	return p.Cost(t)
}
