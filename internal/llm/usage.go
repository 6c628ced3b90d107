package llm

import (
	"encoding/json"
	"fmt"
)

// Usage llmq never believes, whatever the request: more than a model's
// largest context many times over. It keeps a provider's nonsense (1e15
// tokens) out of the ledger and its arithmetic.
const absurdTokens = 1 << 24

// UnbelievableUsage says what is wrong with a usage a provider reported
// for a request (body, whose prompt llmq counts estimatedPrompt tokens), or
// "": a negative count, cached tokens beyond the prompt, reasoning tokens
// beyond the output, a total that is not the sum, a prompt far beyond
// llmq's estimate (unless the request has context llmq cannot see: see
// HasUnseenContext), output beyond the request's own max_tokens, or counts
// past absurdTokens.
func UnbelievableUsage(u Usage, estimatedPrompt int64, body json.RawMessage) string {
	switch {
	case u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CachedTokens < 0 || u.TotalTokens < 0 || u.ReasoningTokens < 0:
		return "a negative count"
	case u.PromptTokens > absurdTokens || u.CompletionTokens > absurdTokens || u.TotalTokens > 2*absurdTokens:
		return fmt.Sprintf("%d prompt and %d completion tokens", u.PromptTokens, u.CompletionTokens)
	case u.CachedTokens > u.PromptTokens:
		return fmt.Sprintf("%d cached tokens of a %d-token prompt", u.CachedTokens, u.PromptTokens)
	case u.TotalTokens != 0 && u.TotalTokens < u.PromptTokens+u.CompletionTokens:
		return fmt.Sprintf("a total of %d tokens below %d prompt + %d completion", u.TotalTokens, u.PromptTokens, u.CompletionTokens)
	case u.ReasoningTokens > u.CompletionTokens:
		return fmt.Sprintf("%d reasoning tokens of %d output tokens", u.ReasoningTokens, u.CompletionTokens)
	case estimatedPrompt > 0 && u.PromptTokens > max(8*estimatedPrompt, estimatedPrompt+8192) && !hasUnseenContext(body):
		return fmt.Sprintf("%d prompt tokens for a prompt llmq counts %d", u.PromptTokens, estimatedPrompt)
	}
	if limit := statedOutputLimit(body); limit > 0 && u.CompletionTokens > limit+limit/100+8 {
		return fmt.Sprintf("%d completion tokens where the request allows %d", u.CompletionTokens, limit)
	}
	return ""
}

// statedOutputLimit is the most output a chat request's body allows:
// max_completion_tokens (or max_tokens, or a Responses body's
// max_output_tokens) times n; 0 when it states none,
// since the provider's default is then unknown.
func statedOutputLimit(body json.RawMessage) int64 {
	var b struct {
		MaxTokens           *int64 `json:"max_tokens"`
		MaxCompletionTokens *int64 `json:"max_completion_tokens"`
		MaxOutputTokens     *int64 `json:"max_output_tokens"`
		N                   *int64 `json:"n"`
	}
	if json.Unmarshal(body, &b) != nil {
		return 0
	}
	limit := b.MaxCompletionTokens
	if limit == nil {
		limit = b.MaxTokens
	}
	if limit == nil {
		limit = b.MaxOutputTokens
	}
	if limit == nil || *limit <= 0 {
		return 0
	}
	n := int64(1)
	if b.N != nil && *b.N > 1 {
		n = *b.N
	}
	return *limit * n
}

// wireUsage is an answer's usage object, as OpenAI sends it: chat
// completions' and embeddings' (prompt_tokens, completion_tokens), or the
// Responses API's (input_tokens, output_tokens).
type wireUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`

	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

func (w *wireUsage) usage() Usage {
	if w.InputTokens != nil || w.OutputTokens != nil {
		u := Usage{TotalTokens: w.TotalTokens}
		if w.InputTokens != nil {
			u.PromptTokens = *w.InputTokens
		}
		if w.OutputTokens != nil {
			u.CompletionTokens = *w.OutputTokens
		}
		if w.InputTokensDetails != nil {
			u.CachedTokens = w.InputTokensDetails.CachedTokens
		}
		if w.OutputTokensDetails != nil {
			u.ReasoningTokens = w.OutputTokensDetails.ReasoningTokens
		}
		return u
	}
	u := Usage{PromptTokens: w.PromptTokens, CompletionTokens: w.CompletionTokens, TotalTokens: w.TotalTokens}
	if w.PromptTokensDetails != nil {
		u.CachedTokens = w.PromptTokensDetails.CachedTokens
	}
	if w.CompletionTokensDetails != nil {
		u.ReasoningTokens = w.CompletionTokensDetails.ReasoningTokens
	}
	return u
}

// UsageOf reads the usage of an answer's body (a chat completion's,
// a response's or embeddings'): zero when it has none; an error when it is not a JSON
// object or its usage is not of OpenAI's shape.
func UsageOf(body json.RawMessage) (Usage, error) {
	var b struct {
		Usage *wireUsage `json:"usage"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return Usage{}, fmt.Errorf("the answer's usage cannot be read: %w", err)
	}
	if b.Usage == nil {
		return Usage{}, nil
	}
	return b.Usage.usage(), nil
}
