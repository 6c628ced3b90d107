package pacer

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/llm"
)

// ContextMemory is how long the tokens of a stored response's conversation
// are remembered for a follow-up: a week, within the 30 days OpenAI keeps
// stored responses. A follow-up of an older response reserves only what
// it holds itself.
const ContextMemory = 7 * 24 * time.Hour

// RememberContext keeps the tokens of a stored response's conversation
// (its input, earlier turns included, and its output) under its id: a
// follow-up naming it as previous_response_id carries them all to the
// provider, which counts them. It is called before the answer reaches
// anyone, since a client may send the follow-up the moment it has it. A
// failure is logged: the follow-up then reserves only what it holds itself.
func (p *Pacer) RememberContext(ctx context.Context, resp *llm.Response) {
	id := llm.ResponseID(resp.Body)
	tokens := resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	if id == "" || tokens <= 0 {
		return
	}
	if err := p.rdb.Set(ctx, p.keys.ResponseContext(id), tokens, ContextMemory).Err(); err != nil {
		p.logger.Warn("remember a response's context", "err", err)
	}
}

// PriorContext returns the tokens of the conversation of responseID, a
// stored response llmq was answered (0 when it was not, or long ago): what
// a follow-up naming it as previous_response_id adds to its own prompt at
// the provider. When Redis cannot be read it is 0, logged.
func (p *Pacer) PriorContext(ctx context.Context, responseID string) int64 {
	n, err := p.rdb.Get(ctx, p.keys.ResponseContext(responseID)).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		if ctx.Err() == nil {
			p.logger.Warn("read a response's context", "err", err)
		}
		return 0
	}
	return max(n, 0)
}
