package worker

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"

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

// accept judges a provider's 2xx answer (judge) and, when it is a response
// the provider stores and the client can take, records it as the tenant's
// (its id and its output items', with the deployment that holds them and
// the tokens a follow-up naming them brings) before the answer reaches
// anyone, since a client may send the follow-up the moment it has it. A
// record that fails is logged: a follow-up of it is then refused as one
// llmq does not know, never served as another's.
func (r *run) accept(ctx context.Context, resp *llm.Response, pe *llm.Error) verdict {
	v := r.judge(resp, pe)
	if v.failed != nil || !r.stores {
		return v
	}
	id, items := llm.StoredIDs(resp.Body)
	if id == "" {
		return v
	}
	rows := make([]store.StoredResponse, 0, 1+len(items))
	deployment := r.call.Scope.Name
	rows = append(rows, store.StoredResponse{ID: id, ResponseID: id, TenantID: r.job.TenantID, Deployment: deployment,
		Tokens: v.usage.PromptTokens + v.usage.CompletionTokens})
	for _, item := range items {
		rows = append(rows, store.StoredResponse{ID: item, ResponseID: id, TenantID: r.job.TenantID, Deployment: deployment,
			Tokens: v.usage.CompletionTokens})
	}
	if err := r.h.Store.StoredResponseInsert(context.WithoutCancel(ctx), rows); err != nil {
		r.log.Warn("record a stored response; its follow-ups will be refused", "err", err)
	}
	return v
}

// judge reads a provider's 2xx answer: resp, or pe for one the llm package
// could not take (not of OpenAI's shape, larger than the provider's bound).
// An answer without usage is charged its worst case (the reservation) and
// succeeds. Usage up to what the request as sent could be billed is
// believed and charged at the price it was served at, whatever llmq
// estimated; usage past that bound (admission.Unbelievable) fails the job
// after this one call, charged the bound (admission.Disbelieved), since
// the provider bills what it bills.
func (r *run) judge(resp *llm.Response, pe *llm.Error) verdict {
	route, s := r.call.Route, &r.shape
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
	if why := admission.Unbelievable(route, s, r.call.PromptTokens, r.call.MaxTokens, u); why != "" {
		r.h.Observer.UsageUnbelieved(r.job.Model, "invalid")
		bound := admission.Disbelieved(route, s, route.Price, r.call.PromptTokens, r.call.MaxTokens)
		if bound.Cost > worst.cost {
			worst.cost, worst.usage.PromptTokens = bound.Cost, bound.PromptTokens
			worst.usage.TotalTokens = worst.usage.PromptTokens + worst.usage.CompletionTokens
		}
		worst.failed = &store.JobError{Type: wire.TypeServer, Code: client.CodeProviderUsageInvalid,
			Message: fmt.Sprintf("The provider's answer reports usage llmq cannot believe (%s); the job is charged the most the request as sent could be billed, $%s.", why, worst.cost)}
		return worst
	}
	return verdict{usage: u, cost: admission.Bill(route.Price, s, u)}
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
