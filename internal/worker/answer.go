package worker

import (
	"encoding/json"
	"fmt"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// verdict is what llmq takes of a provider's 2xx answer: the usage and cost
// it charges, and whether the job succeeds.
type verdict struct {
	usage llm.Usage
	cost  money.Micros
	// estimated: the usage and cost are the call's worst case (the prompt
	// as estimated and calibrated, every max_tokens of output), because
	// the answer said nothing of its usage, or nothing believable.
	estimated bool
	// failed, when set, fails the job, charged: the provider answered and
	// bills the call, but its answer cannot be taken.
	failed *store.JobError
}

// Usage llmq never believes, whatever the request: more than a model's
// largest context many times over. It keeps a provider's nonsense (1e15
// tokens) out of the ledger and its arithmetic.
const absurdTokens = 1 << 24

// judge reads a provider's 2xx answer: resp, or pe for one the llm package
// could not take (not of OpenAI's shape, larger than the provider's bound).
// An answer without usage is charged its worst case and succeeds; usage
// that is negative or beyond what the request could have used fails the
// job after this one call, charged its worst case.
func (r *run) judge(resp *llm.Response, pe *llm.Error) verdict {
	worst := verdict{
		usage: llm.Usage{PromptTokens: max(r.call.Calibration.Apply(r.call.PromptTokens), r.call.PromptTokens),
			CompletionTokens: r.call.MaxTokens},
		cost:      r.call.WorstCase,
		estimated: true,
	}
	worst.usage.TotalTokens = worst.usage.PromptTokens + worst.usage.CompletionTokens
	if pe != nil {
		e := providerError(pe)
		worst.failed = &e
		return worst
	}
	u := resp.Usage
	if u.PromptTokens == 0 && u.CompletionTokens == 0 && u.TotalTokens == 0 {
		r.h.Observer.UsageUnbelieved(r.job.Model, "missing")
		return worst
	}
	if why := r.unbelievable(u); why != "" {
		r.h.Observer.UsageUnbelieved(r.job.Model, "invalid")
		worst.failed = &store.JobError{Type: wire.TypeServer, Code: "provider_usage_invalid",
			Message: fmt.Sprintf("The provider's answer reports usage llmq cannot believe (%s); the job is charged its worst case, $%s.", why, worst.cost)}
		return worst
	}
	return verdict{usage: u, cost: r.call.Model.Price.Cost(u.PromptTokens, u.CachedTokens, u.CompletionTokens)}
}

// unbelievable says what is wrong with a reported usage, or "": a negative
// count, cached tokens beyond the prompt, a total that is not the sum, a
// prompt far beyond llmq's estimate, output beyond the request's own
// max_tokens, or counts past absurdTokens.
func (r *run) unbelievable(u llm.Usage) string {
	switch {
	case u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CachedTokens < 0 || u.TotalTokens < 0:
		return "a negative count"
	case u.PromptTokens > absurdTokens || u.CompletionTokens > absurdTokens || u.TotalTokens > 2*absurdTokens:
		return fmt.Sprintf("%d prompt and %d completion tokens", u.PromptTokens, u.CompletionTokens)
	case u.CachedTokens > u.PromptTokens:
		return fmt.Sprintf("%d cached tokens of a %d-token prompt", u.CachedTokens, u.PromptTokens)
	case u.TotalTokens != 0 && u.TotalTokens < u.PromptTokens+u.CompletionTokens:
		return fmt.Sprintf("a total of %d tokens below %d prompt + %d completion", u.TotalTokens, u.PromptTokens, u.CompletionTokens)
	case r.call.PromptTokens > 0 && u.PromptTokens > max(8*r.call.PromptTokens, r.call.PromptTokens+8192):
		return fmt.Sprintf("%d prompt tokens for a prompt llmq counts %d", u.PromptTokens, r.call.PromptTokens)
	}
	if limit := statedOutputLimit(r.job.Request); limit > 0 && u.CompletionTokens > limit+limit/100+8 {
		return fmt.Sprintf("%d completion tokens where the request allows %d", u.CompletionTokens, limit)
	}
	return ""
}

// statedOutputLimit is the most output a chat request's body allows:
// max_completion_tokens (or max_tokens) times n; 0 when it states none,
// since the provider's default is then unknown.
func statedOutputLimit(body json.RawMessage) int64 {
	var b struct {
		MaxTokens           *int64 `json:"max_tokens"`
		MaxCompletionTokens *int64 `json:"max_completion_tokens"`
		N                   *int64 `json:"n"`
	}
	if json.Unmarshal(body, &b) != nil {
		return 0
	}
	limit := b.MaxCompletionTokens
	if limit == nil {
		limit = b.MaxTokens
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

// relayed is how many events of a stream reached the client before its
// answer was judged.
func relayed(resp *llm.Response, pe *llm.Error) int {
	if resp != nil {
		return resp.Chunks
	}
	return pe.Relayed
}

// answered2xx reports whether err is an answer the provider gave with a 2xx
// status that llmq cannot take: the provider bills it, so the job is
// charged, and it is not retried.
func answered2xx(pe *llm.Error) bool {
	return pe != nil && pe.Class == llm.ClassPermanent && pe.StatusCode >= 200 && pe.StatusCode < 300
}
