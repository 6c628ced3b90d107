package admission

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Shape is what of a request's body, beside its prompt and output tokens,
// decides the most the provider may bill for it as llmq sends it: what
// llmq cannot count is bounded by the context window, what the body leaves
// to the provider's default is written in, what no price covers is refused.
type Shape struct {
	Endpoint string
	// OutputLimit is the model's max_output_tokens, written into a body
	// that states no output limit; else 0.
	OutputLimit int64
	ServiceTier string // the body's; "" for none or auto (the price's AutoTier)
	// Tools are the kinds of built-in tools the body names (each billed
	// per call), and ToolCalls the most calls of them: its max_tool_calls,
	// or the model's, written in (one for a chat body's web search).
	Tools          []string
	ToolCalls      int64
	WriteToolCalls bool // ToolCalls is written into the request
	// Unbounded is the param of prompt content llmq cannot count (a file,
	// context stored at the provider): the context window bounds it.
	Unbounded string
	// Follows is set when the body continues stored responses llmq
	// relayed (its previous_response_id, item_references): their tokens
	// are in the prompt's estimate, and Pinned is the deployment whose
	// account holds them, the only one that can serve it.
	Follows bool
	Pinned  string
}

// Unseen reports whether the provider's count of the prompt includes what
// llmq did not count, which teaches nothing of how it counts.
func (s *Shape) Unseen() bool { return s.Unbounded != "" || s.Follows || s.ToolCalls > 0 }

// Request returns the provider call of route for a job of this shape with
// body, with what is written into it.
func (s *Shape) Request(route config.Route, body []byte) llm.Request {
	req := llm.Request{Endpoint: s.Endpoint, Upstream: route.Upstream, Body: body, OutputLimit: s.OutputLimit}
	if s.WriteToolCalls {
		req.MaxToolCalls = s.ToolCalls
	}
	return req
}

// Conversations finds the stored responses (and items) a follow-up names.
type Conversations interface {
	StoredResponseGet(ctx context.Context, ids []string) (map[string]*store.StoredResponse, error)
}

// maxToolCallsParam bounds a body's max_tool_calls.
const maxToolCallsParam = 1000

// ShapeOf reads the shape of a body decoded for m, for a tenant of tier (nil:
// a tier's defaults), and the tokens of the stored responses it continues
// (none known when convs is nil). It refuses, as a *wire.Error naming the
// param, what llmq cannot bound or the tier does not allow.
func ShapeOf(ctx context.Context, convs Conversations, p *config.Policy, tier *config.Tier, tenantID string, m *config.Model, b *llm.Body) (Shape, int64, error) {
	s := Shape{Endpoint: b.Endpoint(), ServiceTier: b.ServiceTier(), Tools: b.BuiltinTools()}
	if a := b.Audio(); a != "" {
		return s, 0, wire.Invalid(a, client.CodeUnsupportedValue,
			"'%s': llmq does not serve audio: it has no price for audio tokens, so it cannot bound what the call would be billed.", a)
	}
	if m.Kind == config.KindChat && b.OutputParam() == "" {
		if tier != nil && tier.RequireOutputLimit {
			param := outputParam(s.Endpoint)
			return s, 0, wire.Invalid(param, client.CodeOutputLimitRequired,
				"The %s tier requires an output limit: set '%s'.", tier.Name, param)
		}
		s.OutputLimit = m.MaxOutputTokens
	}
	if len(s.Tools) > 0 {
		switch k := b.MaxToolCalls(); {
		case s.Endpoint == llm.EndpointChat:
			s.ToolCalls = 1 // a search model searches once per request
		case k > maxToolCallsParam:
			return s, 0, wire.Invalid("max_tool_calls", client.CodeInvalidValue,
				"'max_tool_calls' must be at most %d, got %d.", maxToolCallsParam, k)
		case k > 0:
			s.ToolCalls = k
		default:
			s.ToolCalls, s.WriteToolCalls = m.MaxToolCalls, true
		}
	}
	foreign := tier != nil && tier.AllowForeignResponses
	if u := b.Unseen(); u != "" {
		if !foreign {
			return s, 0, wire.Invalid(u, client.CodeUnsupportedParameter,
				"'%s' names context the provider holds that llmq cannot see, so it cannot bound what the call would be billed; send the input itself, or ask for a tier that allows foreign responses.", u)
		}
		s.Unbounded = u
	}
	if u := b.Uncounted(); u != "" && s.Unbounded == "" {
		s.Unbounded = u
	}
	prior, err := s.follow(ctx, convs, tenantID, foreign, b)
	return s, prior, err
}

// follow looks up the stored responses b continues, each the tenant's;
// their tokens are returned and their deployment pins the call. One llmq
// never saw made is refused, or, when foreign is allowed, bounds the prompt
// by the context window.
func (s *Shape) follow(ctx context.Context, convs Conversations, tenantID string, foreign bool, b *llm.Body) (int64, error) {
	var ids, params []string // the param naming each id
	if id := b.PreviousResponseID(); id != "" {
		ids, params = append(ids, id), append(params, "previous_response_id")
	}
	for i, id := range b.ItemReferences() {
		ids, params = append(ids, id), append(params, fmt.Sprintf("input[%d].id", i))
	}
	if len(ids) == 0 {
		return 0, nil
	}
	known := map[string]*store.StoredResponse{}
	if convs != nil && tenantID != "" {
		var err error
		if known, err = convs.StoredResponseGet(ctx, ids); err != nil {
			return 0, err
		}
	}
	var prior int64
	for i, id := range ids {
		row, ok := known[id]
		if ok && row.TenantID == tenantID {
			if s.Pinned != "" && row.Deployment != s.Pinned {
				return 0, wire.Invalid(params[i], client.CodeInvalidValue,
					"'%s' is stored at another provider account than the rest of the conversation; one call cannot reach both.", params[i])
			}
			s.Follows, s.Pinned = true, row.Deployment
			prior += row.Tokens
			continue
		}
		if !ok && foreign {
			s.Unbounded = cmp.Or(s.Unbounded, params[i])
			continue
		}
		// Another tenant's reads as one llmq does not know: nothing of it
		// is told.
		return 0, wire.Errorf(http.StatusNotFound, wire.TypeInvalidRequest, client.CodeNotFound, params[i],
			"No response or item '%.100s' was made through llmq for this tenant; a follow-up may continue only its own tenant's responses.", id)
	}
	return prior, nil
}

// Serves reports, as a *wire.Error naming the param, why route cannot serve a
// request of shape s; nil when it can.
func Serves(route config.Route, s *Shape) error {
	if s.Pinned != "" && route.Deployment.Name() != s.Pinned {
		return wire.Invalid("previous_response_id", client.CodeInvalidValue,
			"The conversation is stored at deployment %s, which model '%s' does not use.", s.Pinned, route.Model.Name)
	}
	if _, ok := route.Price.Tier(s.ServiceTier); !ok {
		return wire.Invalid("service_tier", client.CodeUnsupportedValue,
			"The service tier '%s' has no price for model '%s' (deployment %s), so llmq cannot bound what the call would be billed.",
			s.ServiceTier, route.Model.Name, route.Deployment.Name())
	}
	for _, t := range s.Tools {
		if _, ok := route.Price.Tools[t]; !ok {
			return wire.Invalid("tools", client.CodeUnsupportedValue,
				"The built-in tool '%s' has no price for model '%s' (deployment %s): the provider bills each call, so llmq cannot bound what the call would be billed.",
				t, route.Model.Name, route.Deployment.Name())
		}
	}
	if route.ContextWindow == 0 {
		if s.Unbounded != "" {
			return wire.Invalid(s.Unbounded, client.CodeUnsupportedValue,
				"llmq cannot count '%s', and model '%s' has no context_window in the policy to bound it.", s.Unbounded, route.Model.Name)
		}
		for _, t := range s.Tools {
			if route.Price.Tools[t].ResultTokens == 0 {
				return wire.Invalid("tools", client.CodeUnsupportedValue,
					"The results of the built-in tool '%s' enter the model's input, and model '%s' has neither a context_window nor the tool's result_tokens in the policy to bound them.", t, route.Model.Name)
			}
		}
	}
	return nil
}

// Routable is nil when a candidate route of a job of m with fallbacks can
// serve s (Candidates), else why m's first cannot.
func Routable(p *config.Policy, m *config.Model, fallbacks []string, s *Shape) error {
	if len(Candidates(p, m, fallbacks, s)) > 0 {
		return nil
	}
	return Serves(m.Routes()[0], s) // none serves: the first's reason
}

// Serving are the routes of candidates (reused) that can serve s.
func Serving(candidates []config.Route, s *Shape) []config.Route {
	return slices.DeleteFunc(candidates, func(r config.Route) bool { return Serves(r, s) != nil })
}

// Charge is what a request of this shape on route takes: the limiter's
// cost (permit) and the budget's worst case, the most the provider could
// bill. A calibration below 1 lowers the permit, never the dollars held.
func Charge(route config.Route, s *Shape, c limiter.Calibration, promptTokens, maxTokens int64) (limiter.Cost, money.Micros) {
	bound := s.PromptBound(route, max(c.Apply(promptTokens), promptTokens), maxTokens)
	return permit(c, promptTokens, maxTokens), s.dearest(route.Price, bound, maxTokens)
}

// dearest is the most a call of shape s with these tokens costs at any
// price it may be billed at, its tool calls included.
func (s *Shape) dearest(price money.Price, promptTokens, maxTokens int64) money.Micros {
	var worst money.Micros
	for _, p := range prices(price, s.ServiceTier) {
		fees := satMul(max(s.ToolCalls, 0), dearestTool(p, s.Tools).PerCall)
		worst = max(worst, satAdd(p.WorstCase(promptTokens, maxTokens), fees))
	}
	return worst
}

// permit is what a request takes of the limiter: one request and every
// token, the prompt calibrated: its input the prompt, its output the
// output limit, its tokens both.
func permit(c limiter.Calibration, promptTokens, maxTokens int64) limiter.Cost {
	input := c.Apply(promptTokens)
	return limiter.Cost{Requests: 1, Tokens: input + maxTokens, Input: input, Output: maxTokens}
}

// PromptBound is the most input tokens the provider may bill for a call
// on route whose prompt is prompt tokens and whose output is at most
// maxTokens: the prompt itself, or the context window when part of it is
// uncounted; with built-in tools, every turn the model takes (one more
// than its tool calls) reads the prompt, each call's result (the tool's
// result_tokens, else the window) and the output so far, each turn within
// the window.
func (s *Shape) PromptBound(route config.Route, prompt, maxTokens int64) int64 {
	b := prompt
	if s.Unbounded != "" {
		b = max(b, route.ContextWindow)
	}
	if s.ToolCalls <= 0 {
		return b
	}
	var result int64
	for _, t := range s.Tools {
		r := route.Price.Tools[t].ResultTokens
		if r == 0 {
			r = route.ContextWindow
		}
		result = max(result, r)
	}
	turn := satAdd(satAdd(b, satMul(s.ToolCalls, result)), maxTokens)
	if route.ContextWindow > 0 {
		turn = min(turn, max(route.ContextWindow, b))
	}
	return satMul(s.ToolCalls+1, turn)
}

// unknownWindow bounds a prompt of a model whose context window the policy
// does not give: more than any model's.
const unknownWindow = 10_000_000

// Unbelievable says what is wrong with the usage u a provider reported for
// a call of shape s on route, or "": more than the request as sent could be
// billed, or a count llm rejects.
func Unbelievable(route config.Route, s *Shape, prompt, maxTokens int64, u llm.Usage) string {
	if why := llm.UnbelievableUsage(u); why != "" {
		return why
	}
	window := cmp.Or(route.ContextWindow, unknownWindow)
	turns := s.ToolCalls + 1
	if limit := satMul(turns, max(window, prompt)); u.PromptTokens > limit {
		return fmt.Sprintf("%d prompt tokens, more than %d turns of the model's %d-token context window", u.PromptTokens, turns, window)
	}
	if maxTokens > 0 && u.CompletionTokens > maxTokens+maxTokens/100+8 {
		return fmt.Sprintf("%d completion tokens where the request allows %d", u.CompletionTokens, maxTokens)
	}
	var calls int64
	for kind, n := range u.ToolCalls {
		if !slices.Contains(s.Tools, kind) {
			return fmt.Sprintf("%d calls of the built-in tool '%s', which the request did not name", n, kind)
		}
		calls += n
	}
	if calls > s.ToolCalls {
		return fmt.Sprintf("%d built-in tool calls where the request allows %d", calls, s.ToolCalls)
	}
	return ""
}

// Bound is what a call is charged when its usage cannot be believed.
type Bound struct {
	PromptTokens int64
	Cost         money.Micros
}

// Verdict is what llmq takes of a provider's 2xx answer: the usage and
// cost it charges; Estimated when they are the call's worst case (the
// answer said nothing believable of its usage); Failed when the provider
// bills the call but its answer cannot be taken.
type Verdict struct {
	Usage     llm.Usage
	Cost      money.Micros
	Estimated bool
	Failed    *store.JobError
}

// Judge charges the usage u a provider reported for a call of shape s on
// route, on llmq's own path and the offloader's alike. worst is the call's
// worst case (its usage and cost): an answer without usage is charged it
// and succeeds; usage past what the request as sent could be billed
// (Unbelievable) fails the job, charged the dearer of worst and that bound
// (Disbelieved); the rest is billed at the route's price.
func Judge(route config.Route, s *Shape, prompt, maxTokens int64, worst Verdict, u llm.Usage) Verdict {
	worst.Estimated = true
	worst.Usage.TotalTokens = worst.Usage.PromptTokens + worst.Usage.CompletionTokens
	if u.PromptTokens == 0 && u.CompletionTokens == 0 && u.TotalTokens == 0 {
		return worst
	}
	why := Unbelievable(route, s, prompt, maxTokens, u)
	if why == "" {
		return Verdict{Usage: u, Cost: Bill(route.Price, s, u)}
	}
	if bound := Disbelieved(route, s, route.Price, prompt, maxTokens); bound.Cost > worst.Cost {
		worst.Cost, worst.Usage.PromptTokens = bound.Cost, bound.PromptTokens
		worst.Usage.TotalTokens = worst.Usage.PromptTokens + worst.Usage.CompletionTokens
	}
	worst.Failed = &store.JobError{Type: wire.TypeServer, Code: client.CodeProviderUsageInvalid,
		Message: fmt.Sprintf("The provider's answer reports usage llmq cannot believe (%s); the job is charged the most the request as sent could be billed, $%s.", why, worst.Cost)}
	return worst
}

// StoredRows are the records of a Responses answer the provider stores, as
// the tenant's and held by deployment: the response, carrying the tokens a
// follow-up naming it brings (its prompt and output), and each output
// item, carrying its output; none when the answer names no stored id.
func StoredRows(tenantID, deployment string, answer []byte, u llm.Usage) []store.StoredResponse {
	id, items := llm.StoredIDs(answer)
	if id == "" {
		return nil
	}
	rows := []store.StoredResponse{{ID: id, ResponseID: id, TenantID: tenantID, Deployment: deployment,
		Tokens: u.PromptTokens + u.CompletionTokens}}
	for _, item := range items {
		rows = append(rows, store.StoredResponse{ID: item, ResponseID: id, TenantID: tenantID, Deployment: deployment,
			Tokens: u.CompletionTokens})
	}
	return rows
}

// Disbelieved is what a call of shape s on route is charged when its usage
// cannot be believed: every turn's context window read and all its output
// produced, at the dearest price it may be served at.
func Disbelieved(route config.Route, s *Shape, price money.Price, prompt, maxTokens int64) Bound {
	bound := satMul(s.ToolCalls+1, max(cmp.Or(route.ContextWindow, unknownWindow), prompt))
	return Bound{PromptTokens: bound, Cost: s.dearest(price, bound, maxTokens)}
}

// Bill is what the provider bills a call of shape s for usage u at price
// (a route's, or its Batch price): its tokens at the service tier the
// answer says served it (the tier asked for, or the account's, when it
// says none; the dearest the call may be served at when it names one
// without a price), and each built-in tool call it made at its tool's
// price (a chat search model's one search when it answered).
func Bill(price money.Price, s *Shape, u llm.Usage) money.Micros {
	tier := cmp.Or(s.ServiceTier, price.AutoTier)
	if u.ServiceTier != "" && u.ServiceTier != "auto" {
		tier = u.ServiceTier
	}
	p, ok := price.Tier(tier)
	if !ok {
		var dearest money.Micros
		for _, q := range prices(price, s.ServiceTier) {
			if c := q.Cost(tokens(u)); c >= dearest {
				dearest, p = c, q
			}
		}
	}
	cost := p.Cost(tokens(u))
	calls := u.ToolCalls
	if s.Endpoint == llm.EndpointChat && len(s.Tools) > 0 {
		calls = map[string]int64{s.Tools[0]: 1}
	}
	for kind, n := range calls {
		fee, ok := p.Tools[kind]
		if !ok {
			fee = dearestTool(p, s.Tools)
		}
		cost = satAdd(cost, satMul(n, fee.PerCall))
	}
	return cost
}

// tokens are what a call of usage u is billed for.
func tokens(u llm.Usage) money.Tokens {
	return money.Tokens{Prompt: u.PromptTokens, Cached: u.CachedTokens, Completion: u.CompletionTokens,
		CacheWrite5m: u.CacheWrite5mTokens, CacheWrite1h: u.CacheWrite1hTokens}
}

// prices are the prices a call asking for service tier may be billed at:
// that tier's (for none, the account's, AutoTier), and the standard one (a
// provider may serve a tier's call at its standard tier).
func prices(p money.Price, tier string) []money.Price {
	out := []money.Price{p}
	if tier = cmp.Or(tier, p.AutoTier); tier != "" {
		if t, ok := p.Tier(tier); ok {
			out = append(out, t)
		}
	}
	return out
}

func dearestTool(p money.Price, tools []string) money.ToolPrice {
	var d money.ToolPrice
	for _, t := range tools {
		if tp := p.Tools[t]; tp.PerCall >= d.PerCall {
			d = tp
		}
	}
	return d
}

// The arithmetic of bounds saturates: a bound past what an int64 holds is
// the most it holds, which no budget or bucket admits.
func satAdd[T ~int64](a, b T) T {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul[T ~int64](n int64, v T) T {
	if n > 0 && v > T(math.MaxInt64/n) {
		return math.MaxInt64
	}
	return T(n) * v
}

// outputParam is the body's output limit at endpoint.
func outputParam(endpoint string) string {
	if endpoint == llm.EndpointResponses {
		return "max_output_tokens"
	}
	return "max_tokens"
}

// promptParam is the body's prompt at endpoint.
func promptParam(endpoint string) string {
	if endpoint == llm.EndpointChat {
		return "messages"
	}
	return "input"
}
