// Package admission decides what a request costs and whether it can ever
// run, from the request body and the policy in force: the model it names, its
// estimated prompt and output tokens, its worst-case price, the limiter scope
// it draws from and the budget account it is charged to. The HTTP API, batch
// validation and the worker all ask it, so a request is judged the same way
// at enqueue and at run time, and one that can never run is refused at once
// instead of waiting forever.
package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Estimate is what one request will cost at most.
type Estimate struct {
	Model *config.Model
	// PromptTokens is the prompt's estimate with the earlier turns of the
	// stored responses it continues.
	PromptTokens int64
	// MaxTokens is the output limit (or the model's, written in) times the
	// choices, and a prediction's tokens; 0 for embeddings.
	MaxTokens   int64
	Shape       Shape               // the rest of what decides its bill
	Calibration limiter.Calibration // the model's prompt correction, in Cost and WorstCase
	Cost        limiter.Cost        // what the limiter reserves (permit)
	// WorstCase is the budget reservation: the most the provider could
	// bill for the request as sent, on the dearest route it may take.
	WorstCase money.Micros
}

// Calibrations gives a limiter scope's prompt correction (the pacer's).
type Calibrations interface {
	Calibration(ctx context.Context, scope string) limiter.Calibration
}

// Estimator judges requests. It is safe for concurrent use.
type Estimator struct {
	tokens *llm.Estimator
	calib  Calibrations
	convs  Conversations
}

// New returns an Estimator; with c, prompt estimates are corrected as the
// provider counts them; with convs, follow-ups find their stored responses.
func New(c Calibrations, convs Conversations) *Estimator {
	return &Estimator{tokens: llm.NewEstimator(), calib: c, convs: convs}
}

// Request is what admission decided about one body, once, carried by every
// later step.
type Request struct {
	Estimate
	Endpoint  string
	Body      []byte   // as the client sent it
	Fallbacks []string // the job's own (WithFallbacks); none uses its model's
}

// WithFallbacks makes fallbacks the request's own, checked for tier
// (CheckJobFallbacks), and its worst case theirs too, checked against
// acct's budget; on error the request is unchanged.
func (r *Request) WithFallbacks(p *config.Policy, tier *config.Tier, acct budget.Account, fallbacks []string) error {
	if len(fallbacks) == 0 {
		return nil
	}
	if err := CheckJobFallbacks(p, tier, r.Model, fallbacks); err != nil {
		return err
	}
	worst := WorstCase(p, r.Model, fallbacks, &r.Shape, r.Calibration, r.PromptTokens, r.MaxTokens)
	if err := CheckBudget(acct, worst, r.Endpoint); err != nil {
		return err
	}
	r.WorstCase, r.Fallbacks = worst, fallbacks
	return nil
}

// Admit judges body for endpoint, for a tenant of tier whose budget
// account is acct: Estimate, then CheckBudget.
func (e *Estimator) Admit(ctx context.Context, p *config.Policy, tier *config.Tier, acct budget.Account, endpoint string, body []byte) (*Request, error) {
	est, err := e.Estimate(ctx, p, tier, acct.TenantID, endpoint, body)
	if err != nil {
		return nil, err
	}
	if err := CheckBudget(acct, est.WorstCase, endpoint); err != nil {
		return nil, err
	}
	return &Request{Estimate: *est, Endpoint: endpoint, Body: body}, nil
}

// Fill writes what admission decided into the job's insert params.
func (r *Request) Fill(j *store.JobInsertParams) {
	j.Endpoint, j.Model, j.Request = r.Endpoint, r.Model.Name, r.Body
	j.EstPromptTokens, j.EstMaxTokens, j.EstCost = r.PromptTokens, r.MaxTokens, r.WorstCase
	j.Fallbacks = r.Fallbacks
}

// Estimate validates body for endpoint, for a tenant of tier (nil: a
// tier's defaults) whose id is tenantID, or says as a *wire.Error why it can
// never run: an invalid body, an unknown model or one of another kind, what
// llmq cannot bound (ShapeOf), a shape no route serves, a cost above a
// bucket's capacity.
func (e *Estimator) Estimate(ctx context.Context, p *config.Policy, tier *config.Tier, tenantID, endpoint string, body []byte) (*Estimate, error) {
	decoded, err := llm.Decode(endpoint, body)
	if err == nil {
		err = decoded.CaseVariant()
	}
	if err != nil {
		return nil, invalid(err)
	}
	m, ok := p.Model(decoded.Model())
	if !ok {
		return nil, wire.Invalid("model", client.CodeModelNotFound, "The model '%s' does not exist or is not served here.", decoded.Model())
	}
	if (endpoint == llm.EndpointEmbeddings) != (m.Kind == config.KindEmbedding) { // chat: the rest
		return nil, wire.Invalid("model", client.CodeModelNotSupported, "The model '%s' is a %s model and cannot serve %s.", m.Name, m.Kind, endpoint)
	}
	if m.Anthropic && endpoint != llm.EndpointMessages {
		return nil, wire.Invalid("model", client.CodeModelNotSupported,
			"The model '%s' is served by Anthropic's Messages API only: send it to %s, not %s.", m.Name, llm.EndpointMessages, endpoint)
	}
	if !m.Anthropic && endpoint == llm.EndpointMessages {
		return nil, wire.Invalid("model", client.CodeModelNotSupported,
			"The model '%s' is not served by Anthropic's Messages API: send it to %s or %s.", m.Name, llm.EndpointChat, llm.EndpointResponses)
	}
	counted, err := e.tokens.Count(decoded, m.TokenizerModel(), m.Encoding)
	if err != nil {
		return nil, invalid(err)
	}
	shape, prior, err := ShapeOf(ctx, e.convs, p, tier, tenantID, m, decoded)
	if err != nil {
		return nil, err
	}
	own := Serving(m.Routes(), &shape)
	if len(own) == 0 {
		return nil, Serves(m.Routes()[0], &shape) // why the first cannot
	}
	est := &Estimate{Model: m, PromptTokens: counted.PromptTokens + prior, Shape: shape}
	if m.Kind == config.KindChat {
		perChoice := cmp.Or(counted.MaxTokens, m.MaxOutputTokens)
		est.MaxTokens = satAdd(satMul(perChoice, max(counted.N, 1)), counted.PredictionTokens)
	}
	est.Calibration = limiter.Calibration{Factor: 1}
	if e.calib != nil {
		est.Calibration = e.calib.Calibration(ctx, m.Routes()[0].Deployment.Name())
	}
	est.Cost = permit(est.Calibration, est.PromptTokens, est.MaxTokens)
	est.WorstCase = WorstCase(p, m, m.Fallbacks, &shape, est.Calibration, est.PromptTokens, est.MaxTokens)
	// A cost no deployment of the model can ever hold is refused: one whose
	// buckets are all large enough may run it.
	for _, r := range own {
		if fitsRoute(r, est, endpoint) == nil {
			return est, nil
		}
	}
	return nil, fitsRoute(own[0], est, endpoint)
}

// Fallbacks are the models a job of m falls back to: its own, when it
// names some, else m's.
func Fallbacks(m *config.Model, own []string) []string {
	if len(own) > 0 {
		return own
	}
	return m.Fallbacks
}

// Candidates are the routes of m, then of fallbacks (see Fallbacks), that
// can serve s.
func Candidates(p *config.Policy, m *config.Model, fallbacks []string, s *Shape) []config.Route {
	return Serving(append(m.Routes(), FallbackRoutes(p, fallbacks)...), s)
}

// FallbackRoutes are the routes of the models fallbacks names.
func FallbackRoutes(p *config.Policy, fallbacks []string) []config.Route {
	var out []config.Route
	for _, name := range fallbacks {
		if f, ok := p.Model(name); ok {
			out = append(out, f.Routes()...)
		}
	}
	return out
}

// WorstCase is the most Charge asks on any of the candidates of a request
// of m, since the budget is reserved before a route is chosen.
func WorstCase(p *config.Policy, m *config.Model, fallbacks []string, s *Shape, c limiter.Calibration, promptTokens, maxTokens int64) money.Micros {
	var worst money.Micros
	for _, r := range Candidates(p, m, fallbacks, s) {
		_, w := Charge(r, s, c, promptTokens, maxTokens)
		worst = max(worst, w)
	}
	return worst
}

// fitsRoute refuses a cost a bucket of route r can never hold, in each
// dimension of its limits.
func fitsRoute(m config.Route, est *Estimate, endpoint string) error {
	for _, b := range Scope(m).Buckets {
		need := est.Cost.Of(b.Unit)
		if b.Unit == limiter.UnitRequests || need <= b.Limit {
			continue
		}
		prompt := est.Cost.Tokens - est.MaxTokens
		param := outputParam(endpoint)
		if b.Unit == limiter.UnitInputTokens || b.Unit == limiter.UnitTokens && (prompt > b.Limit || est.MaxTokens == 0) {
			param = promptParam(endpoint)
		}
		note := "" // when the prompt count is the provider's, as calibrated
		if f := est.Calibration.Factor; f != 1 {
			note = fmt.Sprintf(", as the provider counts: %.2f× llmq's estimate", f)
		}
		period := "day"
		if b.Period == time.Minute {
			period = "minute"
		}
		what := fmt.Sprintf("%d tokens (%d prompt%s + %d output)", need, prompt, note, est.MaxTokens)
		switch b.Unit {
		case limiter.UnitInputTokens:
			what = fmt.Sprintf("%d input tokens (its prompt%s)", need, note)
		case limiter.UnitOutputTokens:
			what = fmt.Sprintf("%d output tokens", need)
		}
		return wire.Invalid(param, client.CodeTokensExceedCapacity,
			"This request needs up to %s, more than the %d %s per %s the model '%s' allows; it could never run. Lower %s or shorten the input.",
			what, b.Limit, b.Unit, period, m.Model.Name, outputParam(endpoint))
	}
	return nil
}

func invalid(err error) error {
	var e *wire.Error
	if errors.As(err, &e) {
		return e
	}
	return wire.Invalid("", client.CodeInvalidRequest, "%s", err.Error())
}

// JobRef is the fair queue's reference of a stored job; share 0 keeps what
// the fair queue knows. A job whose model the policy no longer serves has
// no scope, for its worker to fail.
func JobRef(p *config.Policy, j *store.Job, share float64) queue.JobRef {
	return Ref(p, j.ID, j.Queue, j.TenantID, j.Model, j.EstPromptTokens+j.EstMaxTokens, share)
}

// Ref is JobRef of a job known by its fields; cost is its estimated tokens.
func Ref(p *config.Policy, id, priority, tenantID, model string, cost int64, share float64) queue.JobRef {
	ref := queue.JobRef{ID: id, Priority: priority, TenantID: tenantID, Cost: cost, Share: share}
	if m, ok := p.Model(model); ok {
		ref.Scope = m.Queue()
	}
	return ref
}

// MaxJobFallbacks bounds the fallbacks one job may name.
const MaxJobFallbacks = 4

// CheckJobFallbacks refuses fallbacks a job of model m under tier may not
// name.
func CheckJobFallbacks(p *config.Policy, tier *config.Tier, m *config.Model, fallbacks []string) error {
	if len(fallbacks) > MaxJobFallbacks {
		return wire.Invalid("fallbacks", client.CodeInvalidValue,
			"A job may name at most %d fallbacks, got %d.", MaxJobFallbacks, len(fallbacks))
	}
	allowed := "none"
	if len(tier.Fallbacks) > 0 {
		allowed = "'" + strings.Join(tier.Fallbacks, "', '") + "'"
	}
	for i, name := range fallbacks {
		f, ok := p.Model(name)
		switch {
		case !ok:
			return wire.Invalid("fallbacks", client.CodeModelNotFound, "The fallback model '%s' does not exist or is not served here.", name)
		case !slices.Contains(tier.Fallbacks, name):
			return wire.Invalid("fallbacks", client.CodeFallbackNotAllowed,
				"The %s tier does not allow '%s' as a fallback; it allows %s.", tier.Name, name, allowed)
		case name == m.Name:
			return wire.Invalid("fallbacks", client.CodeInvalidValue, "The model '%s' cannot be its own fallback.", name)
		case f.Kind != m.Kind:
			return wire.Invalid("fallbacks", client.CodeModelNotSupported,
				"The fallback '%s' is a %s model and '%s' a %s one.", name, f.Kind, m.Name, m.Kind)
		case slices.Contains(fallbacks[:i], name):
			return wire.Invalid("fallbacks", client.CodeInvalidValue, "The fallback '%s' is named twice.", name)
		}
	}
	return nil
}

// Scope returns the limiter scope of route with the policy's limits.
func Scope(route config.Route) limiter.Scope {
	return limiter.ModelScope(route.Deployment.Name(), route.Limits.ByName(), route.Limits.Burst)
}

// Account is the budget account of tenant t under policy p (the tenant's
// budget override, else its tier's). It fails when the tier is not in p.
func Account(p *config.Policy, t *store.Tenant) (budget.Account, *config.Tier, error) {
	tier, ok := p.Tier(t.Tier)
	if !ok {
		return budget.Account{}, nil, fmt.Errorf("tenant %s: tier %q is not in the policy", t.ID, t.Tier)
	}
	acct := budget.Account{TenantID: t.ID, Budget: tier.DailyBudget, Unlimited: tier.Unlimited,
		SoftLimit: tier.SoftLimit, Location: tier.Timezone, Global: p.GlobalDailyBudget}
	if t.BudgetOverride != nil {
		acct.Budget, acct.Unlimited = *t.BudgetOverride, false
	}
	return acct, tier, nil
}

// CheckBudget refuses a worst case above the account's whole daily budget
// or the global cap: no reset would ever let it run.
func CheckBudget(acct budget.Account, worst money.Micros, endpoint string) error {
	what, of := "the whole daily budget", acct.Budget
	switch {
	case !acct.Unlimited && worst > acct.Budget:
	case acct.Global > 0 && worst > acct.Global:
		what, of = "the global daily cap", acct.Global
	default:
		return nil
	}
	param := outputParam(endpoint)
	return wire.Invalid(param, client.CodeBudgetTooSmall,
		"This request may cost up to $%s, more than %s of $%s; it could never run. Lower %s.", worst, what, of, param)
}
