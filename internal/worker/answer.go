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
	// estimated: the usage and cost are the call's worst case, the answer
	// having said nothing (believable) of its usage.
	estimated bool
	// failed fails the job, charged: the provider bills the call, but its
	// answer cannot be taken.
	failed *store.JobError
}

// accept judges a provider's 2xx answer and, when it is a response the
// provider stores, records it (and its output items) as the tenant's
// before the answer reaches anyone, since a client may send the follow-up
// the moment it has it. A record that fails is logged: a follow-up of it
// is then refused as unknown, never served as another's.
func (r *run) accept(ctx context.Context, resp *llm.Response, pe *llm.Error) verdict {
	v := r.judge(resp, pe)
	if v.failed != nil || !r.stores {
		return v
	}
	id, items := llm.StoredIDs(resp.Body)
	if id == "" {
		return v
	}
	rows := []store.StoredResponse{{ID: id, ResponseID: id, TenantID: r.job.TenantID, Deployment: r.call.Scope.Name,
		Tokens: v.usage.PromptTokens + v.usage.CompletionTokens}}
	for _, item := range items {
		rows = append(rows, store.StoredResponse{ID: item, ResponseID: id, TenantID: r.job.TenantID, Deployment: r.call.Scope.Name,
			Tokens: v.usage.CompletionTokens})
	}
	if err := r.h.Store.StoredResponseInsert(context.WithoutCancel(ctx), rows); err != nil {
		r.log.Warn("record a stored response; its follow-ups will be refused", "err", err)
	}
	return v
}

// judge reads a provider's 2xx answer: resp, or pe for one llmq could not
// take. An answer without usage is charged the call's worst case and
// succeeds. Usage up to what the request as sent could be billed is
// charged at the price it was served at; usage past that bound
// (admission.Unbelievable) fails the job, charged the bound.
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

// answered2xx reports whether pe is a 2xx answer llmq cannot take, or a
// stream that failed after it relayed events: the provider bills it, so
// the job is charged, and it is not retried.
func answered2xx(pe *llm.Error) bool {
	return pe != nil && (pe.Relayed > 0 || pe.Class == llm.ClassPermanent && pe.StatusCode >= 200 && pe.StatusCode < 300)
}
