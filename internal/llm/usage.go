package llm

import (
	"encoding/json"
	"fmt"
)

// absurdTokens is a count llmq never believes: a model's largest context
// many times over.
const absurdTokens = 1 << 24

// UnbelievableUsage says what is wrong with a usage whatever the request, or
// "". What the request allows is admission's to judge.
func UnbelievableUsage(u Usage) string {
	switch {
	case u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CachedTokens < 0 || u.TotalTokens < 0 || u.ReasoningTokens < 0 ||
		u.CacheWrite5mTokens < 0 || u.CacheWrite1hTokens < 0:
		return "a negative count"
	case u.PromptTokens > absurdTokens || u.CompletionTokens > absurdTokens || u.TotalTokens > 2*absurdTokens:
		return fmt.Sprintf("%d prompt and %d completion tokens", u.PromptTokens, u.CompletionTokens)
	case u.CachedTokens > u.PromptTokens:
		return fmt.Sprintf("%d cached tokens of a %d-token prompt", u.CachedTokens, u.PromptTokens)
	case u.CacheWrite5mTokens > absurdTokens || u.CacheWrite1hTokens > absurdTokens ||
		u.CachedTokens+u.CacheWrite5mTokens+u.CacheWrite1hTokens > u.PromptTokens:
		return fmt.Sprintf("%d cached and %d + %d written tokens of a %d-token prompt", u.CachedTokens, u.CacheWrite5mTokens, u.CacheWrite1hTokens, u.PromptTokens)
	case u.TotalTokens != 0 && u.TotalTokens < u.PromptTokens+u.CompletionTokens:
		return fmt.Sprintf("a total of %d tokens below %d prompt + %d completion", u.TotalTokens, u.PromptTokens, u.CompletionTokens)
	case u.ReasoningTokens > u.CompletionTokens:
		return fmt.Sprintf("%d reasoning tokens of %d output tokens", u.ReasoningTokens, u.CompletionTokens)
	}
	for kind, n := range u.ToolCalls {
		if n < 0 || n > absurdTokens {
			return fmt.Sprintf("%d calls of the tool '%s'", n, kind)
		}
	}
	return ""
}

// wireUsage is an answer's usage object: chat completions' and embeddings',
// or the Responses API's (input_tokens, output_tokens).
type wireUsage struct {
	PromptTokens            int64            `json:"prompt_tokens"`
	CompletionTokens        int64            `json:"completion_tokens"`
	TotalTokens             int64            `json:"total_tokens"`
	PromptTokensDetails     cachedDetails    `json:"prompt_tokens_details"`
	CompletionTokensDetails reasoningDetails `json:"completion_tokens_details"`

	InputTokens         *int64           `json:"input_tokens"`
	OutputTokens        *int64           `json:"output_tokens"`
	InputTokensDetails  cachedDetails    `json:"input_tokens_details"`
	OutputTokensDetails reasoningDetails `json:"output_tokens_details"`
}

type cachedDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

type reasoningDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

func (w *wireUsage) usage() Usage {
	u := Usage{PromptTokens: w.PromptTokens, CompletionTokens: w.CompletionTokens, TotalTokens: w.TotalTokens}
	cached, reasoning := w.PromptTokensDetails, w.CompletionTokensDetails
	if w.InputTokens != nil || w.OutputTokens != nil {
		u.PromptTokens, u.CompletionTokens = deref(w.InputTokens), deref(w.OutputTokens)
		cached, reasoning = w.InputTokensDetails, w.OutputTokensDetails
	}
	u.CachedTokens, u.ReasoningTokens = cached.CachedTokens, reasoning.ReasoningTokens
	return u
}

func deref(n *int64) int64 {
	if n == nil {
		return 0
	}
	return *n
}

// UsageOf reads the usage of an answer's body or chunk, with its service
// tier and built-in tool calls: zero when it has none, an error when it is
// not of OpenAI's shape.
func UsageOf(body json.RawMessage) (Usage, error) {
	var b struct {
		Usage       *wireUsage `json:"usage"`
		ServiceTier *string    `json:"service_tier"`
		Output      []struct {
			Type string `json:"type"`
		} `json:"output"`
	}
	if err := unmarshal(body, &b); err != nil {
		return Usage{}, fmt.Errorf("the answer's usage cannot be read: %w", err)
	}
	var u Usage
	if b.Usage != nil {
		u = b.Usage.usage()
	}
	if b.ServiceTier != nil && len(*b.ServiceTier) <= 64 {
		u.ServiceTier = *b.ServiceTier
	}
	for _, it := range b.Output {
		if kind, ok := toolCallKind(it.Type); ok {
			if u.ToolCalls == nil {
				u.ToolCalls = map[string]int64{}
			}
			u.ToolCalls[kind]++
		}
	}
	return u, nil
}
