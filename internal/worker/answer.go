package worker

import (
	"context"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/llm"
)

// accept judges a provider's 2xx answer: resp by admission.Judge, or pe
// for one llmq could not take (failed, charged the call's worst case).
// When it is a response the provider stores, it records it (and its output
// items) as the tenant's before the answer reaches anyone, since a client
// may send the follow-up the moment it has it. A record that fails is
// logged: a follow-up of it is then refused as unknown, never served as
// another's.
func (r *run) accept(ctx context.Context, resp *llm.Response, pe *llm.Error) admission.Verdict {
	worst := admission.Verdict{
		Usage: llm.Usage{PromptTokens: max(r.call.Calibration.Apply(r.call.PromptTokens), r.call.PromptTokens),
			CompletionTokens: r.call.MaxTokens},
		Cost: r.call.WorstCase,
	}
	if pe != nil {
		e := providerError(pe)
		worst.Failed = &e
		worst.Estimated = true
		worst.Usage.TotalTokens = worst.Usage.PromptTokens + worst.Usage.CompletionTokens
		return worst
	}
	v := admission.Judge(r.call.Route, &r.shape, r.call.PromptTokens, r.call.MaxTokens, worst, resp.Usage)
	switch {
	case v.Failed != nil:
		r.h.Observer.UsageUnbelieved(r.job.Model, "invalid")
	case v.Estimated:
		r.h.Observer.UsageUnbelieved(r.job.Model, "missing")
	}
	if v.Failed != nil || !r.stores {
		return v
	}
	if rows := admission.StoredRows(r.job.TenantID, r.call.Scope.Name, resp.Body, v.Usage); rows != nil {
		if err := r.h.Store.StoredResponseInsert(context.WithoutCancel(ctx), rows); err != nil {
			r.log.Warn("record a stored response; its follow-ups will be refused", "err", err)
		}
	}
	return v
}

// relayed is how many events of a stream reached the client before its
// answer was judged.
func relayed(resp *llm.Response, pe *llm.Error) int {
	if resp != nil {
		return resp.Chunks
	}
	return pe.Relayed
}

// answered2xx reports whether pe is a 2xx answer llmq cannot take, or a
// stream that failed after it relayed events: the provider bills it, so
// the job is charged, and it is not retried.
func answered2xx(pe *llm.Error) bool {
	return pe != nil && (pe.Relayed > 0 || pe.Class == llm.ClassPermanent && pe.StatusCode >= 200 && pe.StatusCode < 300)
}
