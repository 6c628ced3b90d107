package worker

import (
	"context"
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

// accept judges a provider's 2xx answer (judge) and, when it is a stored
// response the client can take, remembers its conversation's tokens for
// its follow-ups before the answer reaches anyone (see
// pacer.RememberContext).
func (r *run) accept(ctx context.Context, resp *llm.Response, pe *llm.Error) verdict {
	v := r.judge(resp, pe)
	if v.failed == nil && !v.estimated && llm.StoredResponse(r.job.Endpoint, r.job.Request) {
		r.h.Pacer.RememberContext(ctx, resp)
	}
	return v
}

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

// unbelievable says what is wrong with a reported usage, or "" (see
// llm.UnbelievableUsage).
func (r *run) unbelievable(u llm.Usage) string {
	return llm.UnbelievableUsage(u, r.call.PromptTokens, r.job.Request)
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
// status that llmq cannot take, or a stream that failed after it relayed
// events (an error event, a cut, a timeout): the provider bills it, so the
// job is charged, and it is not retried. (A stream's relayed events cannot
// be taken back from its client either.)
func answered2xx(pe *llm.Error) bool {
	return pe != nil && (pe.Relayed > 0 || pe.Class == llm.ClassPermanent && pe.StatusCode >= 200 && pe.StatusCode < 300)
}
