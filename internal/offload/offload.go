// Package offload runs batch lines on a provider's Batch API, at its batch
// price, for tiers whose batch_offload allows it. Plan puts a validated
// batch's lines in parts; the offloader's sweep takes each part through its
// states (store.PartPending → … → store.PartDone), llmq's job id as each
// line's custom_id. A line the provider did not run goes back to llmq's own
// path while the batch's window allows, else ends cancelled: no line is
// lost, none is charged twice.
//
// Each state is stored before the provider is asked for what follows, so a
// restarted dispatcher finds what a part found uploading or creating made
// (its file by name, its batch by metadata) instead of making it again.
// Each part is worked on under a store lock.
package offload

import (
	"bufio"
	"cmp"
	"context"
	_ "embed" // learn.lua
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/loop"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Providers gives the provider of a name.
type Providers interface {
	Get(name string) (llm.Provider, bool)
}

// Deps are what an Offloader works with.
type Deps struct {
	Store     *store.DB
	Policy    *config.PolicyHolder
	Budgets   *budget.Budgets
	Queue     *queue.Client
	Providers Providers
	// Redis keeps the batch queue limits learned from the provider's
	// refusals, shared by every dispatcher.
	Redis  redis.UniversalClient
	Keys   rkeys.Builder
	Logger *slog.Logger
}

// Options tune an Offloader. The zero value is ready to use.
type Options struct {
	// PollMin and PollMax bound the wait between two looks at a provider
	// batch: a tenth of its age, within them. Defaults 5s and 5m.
	PollMin, PollMax time.Duration
	// RetryAfter is how long a part waits after a step that could not be
	// taken (no room in the provider's queue, the budget, an error).
	// Defaults to 1m.
	RetryAfter time.Duration
	// SweepInterval is how often the parts due are looked at. Defaults to 1s.
	SweepInterval time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
}

// A part's bounds: OpenAI's requests and bytes a batch file.
const (
	maxPartLines = 50_000
	maxPartBytes = 200 << 20
)

// withDefaults sets each duration not above 0 to its default.
func (o Options) withDefaults() Options {
	o.PollMin = cmp.Or(max(o.PollMin, 0), 5*time.Second)
	o.PollMax = cmp.Or(max(o.PollMax, 0), 5*time.Minute)
	o.RetryAfter = cmp.Or(max(o.RetryAfter, 0), time.Minute)
	o.SweepInterval = cmp.Or(max(o.SweepInterval, 0), time.Second)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Offloader plans batches into parts and runs the parts.
type Offloader struct {
	Deps
	opts Options
}

// New returns an Offloader.
func New(d Deps, opts Options) *Offloader {
	d.Logger = cmp.Or(d.Logger, slog.New(slog.DiscardHandler))
	return &Offloader{Deps: d, opts: opts.withDefaults()}
}

// Offloads reports whether a tier's batches of model run on the provider's
// Batch API.
func Offloads(p *config.Policy, tier *config.Tier, model string) bool {
	_, ok := p.BatchRoute(model)
	return ok && tier.BatchOffload != config.BatchOffloadNever
}

// Plain reports whether a line of shape s runs on a provider's Batch API:
// one whose bill its tokens bound, its output limit written in. The others
// (follow-ups, service tiers, built-in tools, uncounted content) run on
// llmq's own path, which bounds them call by call.
func Plain(s *admission.Shape) bool {
	return !s.Follows && s.Pinned == "" && s.Unbounded == "" && s.ServiceTier == "" && len(s.Tools) == 0
}

// batchRoute is route priced at its Batch API price.
func batchRoute(route config.Route) config.Route {
	d := *route.Deployment
	d.Price = d.Price.Batch()
	route.Deployment = &d
	return route
}

// lineShape reads job j's shape; ok is false when the line does not run
// on the Batch API (Plain), or its model is gone. A line planned and no
// longer plain keeps what its body says of its output limit, which its
// part was reserved for.
func (o *Offloader) lineShape(ctx context.Context, p *config.Policy, j *store.Job) (s admission.Shape, ok bool) {
	m, found := p.Model(j.Model)
	b, err := llm.Decode(j.Endpoint, j.Request)
	if !found || err != nil {
		return s, false
	}
	s, _, err = admission.ShapeOf(ctx, o.Store, p, nil, j.TenantID, m, b)
	return s, err == nil && Plain(&s)
}

// lineWorst is the most the provider's Batch API could bill job j of
// shape s on route.
func lineWorst(route config.Route, s *admission.Shape, j *store.Job) money.Micros {
	_, worst := admission.Charge(batchRoute(route), s, limiter.Calibration{Factor: 1}, j.EstPromptTokens, j.EstMaxTokens)
	return worst
}

// LearnedQueueTTL is how long a batch queue limit learned from a refusal
// holds: a provider raises its limits as an account grows.
const LearnedQueueTTL = 6 * time.Hour

// queueLimit is the deployment's batch queue limit: the policy's, else the
// one learned from the provider's refusals; 0 when neither is known.
func (o *Offloader) queueLimit(ctx context.Context, route config.Route) (int64, error) {
	if l := route.Limits.BatchQueueTokens; l > 0 {
		return l, nil
	}
	v, err := o.Redis.Get(ctx, o.Keys.LearnedBatchQueue(route.Deployment.Name())).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

//go:embed learn.lua
var learnLua string

var learnScript = redis.NewScript(learnLua)

// Plan puts the batch's queued lines that the tier offloads in parts, and
// returns how many it put; the others stay for llmq's own path. Run again,
// it plans only the lines in no part.
func (o *Offloader) Plan(ctx context.Context, b *store.Batch, p *config.Policy, tier *config.Tier) (int64, error) {
	if tier.BatchOffload == config.BatchOffloadNever {
		return 0, nil
	}
	type building struct {
		part  store.BatchPart
		route config.Route
		limit int64 // the deployment's batch queue limit; 0 unknown
		jobs  []string
	}
	open := map[string]*building{} // by model
	var planned int64
	flush := func(bl *building) error {
		if err := o.Store.BatchPartInsert(ctx, &bl.part, bl.jobs); err != nil {
			return err
		}
		planned += int64(len(bl.jobs))
		o.Logger.Info("batch part planned", "batch", b.ID, "part", bl.part.ID, "model", bl.part.Model,
			"deployment", bl.part.Deployment, "lines", len(bl.jobs), "tokens", bl.part.Tokens)
		bl.part = store.BatchPart{BatchID: b.ID, TenantID: b.TenantID, Model: bl.part.Model, Deployment: bl.part.Deployment, Endpoint: b.Endpoint}
		bl.jobs = nil
		return nil
	}
	err := o.Store.JobStreamByBatch(ctx, b.ID, []store.JobStatus{store.JobQueued}, func(j *store.Job) error {
		if j.BatchPartID != "" {
			return nil
		}
		shape, ok := o.lineShape(ctx, p, j)
		if !ok {
			return nil // llmq's own path bounds it
		}
		bl := open[j.Model]
		if bl == nil {
			route, ok := p.BatchRoute(j.Model)
			if !ok {
				return nil
			}
			limit, err := o.queueLimit(ctx, route)
			if err != nil {
				return err
			}
			bl = &building{route: route, limit: limit, part: store.BatchPart{BatchID: b.ID, TenantID: b.TenantID,
				Model: j.Model, Deployment: route.Deployment.Name(), Endpoint: b.Endpoint}}
			open[j.Model] = bl
		}
		if len(bl.jobs) > 0 && (len(bl.jobs)+1 > maxPartLines || bl.part.Bytes+lineSize(j) > maxPartBytes ||
			(bl.limit > 0 && bl.part.Tokens+j.EstPromptTokens > bl.limit)) {
			if err := flush(bl); err != nil {
				return err
			}
		}
		bl.jobs = append(bl.jobs, j.ID)
		addLine(&bl.part, bl.route, &shape, j)
		return nil
	})
	if err != nil {
		return planned, err
	}
	for _, bl := range open {
		if err := flush(bl); err != nil {
			return planned, err
		}
	}
	return planned, nil
}

func addLine(p *store.BatchPart, route config.Route, s *admission.Shape, j *store.Job) {
	p.Bytes += lineSize(j)
	p.Tokens += j.EstPromptTokens
	p.Reserved += lineWorst(route, s, j)
}

// lineSize is about how many bytes the job's line takes in the provider's
// input file.
func lineSize(j *store.Job) int64 { return int64(len(j.Request)) + int64(len(j.ID)) + 80 }

// Run sweeps the parts due every SweepInterval until ctx ends.
func (o *Offloader) Run(ctx context.Context) {
	loop.Every(ctx, o.opts.SweepInterval, true, o.Sweep, o.Logger, "offload sweep")
}

// Sweep moves every part that is due on, as far as it can now.
func (o *Offloader) Sweep(ctx context.Context) error {
	parts, err := o.Store.BatchPartListDue(ctx, o.opts.Now(), 100)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range parts {
		if err := o.Step(ctx, p.ID); err != nil && ctx.Err() == nil {
			errs = append(errs, fmt.Errorf("part %s: %w", p.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Step moves one part on, unless another process holds it.
func (o *Offloader) Step(ctx context.Context, partID string) error {
	unlock, ok, err := o.Store.TryLock(ctx, "batch-part:"+partID)
	if err != nil || !ok {
		return err
	}
	defer unlock()
	part, err := o.Store.BatchPartGet(ctx, partID)
	if err != nil {
		return err
	}
	r, err := o.newRun(ctx, part)
	if err != nil {
		return o.later(ctx, part, err)
	}
	for part.State != store.PartDone && !part.NextCheckAt.After(o.opts.Now()) {
		from := part.State
		if err := r.step(ctx); err != nil {
			return o.later(ctx, part, err)
		}
		if part.State == from {
			break // waiting: the step set its next check
		}
	}
	return nil
}

// later stores a step's error on the part, due again after RetryAfter.
func (o *Offloader) later(ctx context.Context, part *store.BatchPart, cause error) error {
	from := part.State
	part.Error = llm.Truncate(cause.Error(), 500)
	part.NextCheckAt = o.opts.Now().Add(o.opts.RetryAfter)
	if _, err := o.Store.BatchPartSave(ctx, part, from); err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// run is the work on one part in one Step.
type run struct {
	o        *Offloader
	part     *store.BatchPart
	batch    *store.Batch
	policy   *config.Policy
	route    config.Route
	api      llm.BatchAPI
	provider *config.Provider
	resumed  bool // found uploading or creating: look at the provider first
}

func (o *Offloader) newRun(ctx context.Context, part *store.BatchPart) (*run, error) {
	b, err := o.Store.BatchGetByID(ctx, part.BatchID)
	if err != nil {
		return nil, err
	}
	p := o.Policy.Current()
	m, ok := p.Model(part.Model)
	if !ok {
		return nil, fmt.Errorf("model %q is no longer in the policy", part.Model)
	}
	route, ok := m.Route(part.Deployment)
	if !ok {
		return nil, fmt.Errorf("deployment %s of model %q is no longer in the policy", part.Deployment, part.Model)
	}
	pc, _ := p.Provider(route.Provider) // config refuses a deployment of an unknown provider
	prov, ok := o.Providers.Get(route.Provider)
	if !ok {
		return nil, fmt.Errorf("provider %q is not configured", route.Provider)
	}
	api, ok := prov.(llm.BatchAPI)
	if !ok {
		return nil, fmt.Errorf("provider %q offers no Batch API", route.Provider)
	}
	return &run{o: o, part: part, batch: b, policy: p, route: route, api: api, provider: pc,
		resumed: part.State == store.PartUploading || part.State == store.PartCreating}, nil
}

// stopping reports whether the part's batch no longer wants its lines run:
// cancelled, ended, or past its window.
func (r *run) stopping() bool {
	switch r.batch.Status {
	case store.BatchCancelling, store.BatchCancelled, store.BatchExpired, store.BatchFailed, store.BatchCompleted:
		return true
	}
	return r.batch.ExpiresAt != nil && !r.o.opts.Now().Before(*r.batch.ExpiresAt)
}

// move stores the part in state to, due again at next.
func (r *run) move(ctx context.Context, to store.BatchPartState, next time.Time) error {
	from := r.part.State
	r.part.State, r.part.NextCheckAt, r.part.Error = to, next, ""
	ok, err := r.o.Store.BatchPartSave(ctx, r.part, from)
	if err == nil && !ok {
		err = fmt.Errorf("the part left state %s meanwhile", from)
	}
	if err != nil {
		r.part.State = from
	}
	return err
}

// wait keeps the part in its state, due again at next.
func (r *run) wait(ctx context.Context, next time.Time, why string) error {
	r.part.NextCheckAt, r.part.Error = next, why
	_, err := r.o.Store.BatchPartSave(ctx, r.part, r.part.State)
	return err
}

func (r *run) step(ctx context.Context) error {
	now := r.o.opts.Now()
	switch r.part.State {
	case store.PartPending:
		if r.stopping() {
			return r.collect(ctx, nil)
		}
		return r.admit(ctx, now)
	case store.PartUploading:
		return r.upload(ctx)
	case store.PartCreating:
		return r.create(ctx)
	case store.PartSubmitted:
		return r.poll(ctx, now)
	case store.PartCollecting:
		pb, err := r.api.GetBatch(ctx, r.part.ProviderBatchID)
		if err != nil {
			return err
		}
		return r.collect(ctx, pb)
	}
	return nil
}

// admit takes a pending part to the provider when its queue has room and
// the budget holds the part's worst case.
func (r *run) admit(ctx context.Context, now time.Time) error {
	limit, err := r.o.queueLimit(ctx, r.route)
	if err != nil {
		return err
	}
	if limit > 0 {
		if r.part.Tokens > limit && r.part.Lines > 1 {
			return r.split(ctx, now)
		}
		held, err := r.o.Store.BatchPartTokensInFlight(ctx, r.part.Deployment)
		if err != nil {
			return err
		}
		if held > 0 && held+r.part.Tokens > limit {
			return r.wait(ctx, now.Add(r.o.opts.RetryAfter), fmt.Sprintf("waiting for room in the provider's batch queue (%d of %d tokens held)", held, limit))
		}
	}
	if r.part.BudgetDay == "" {
		tenant, err := r.o.Store.TenantGetByID(ctx, r.part.TenantID)
		if err != nil {
			return err
		}
		acct, _, err := admission.Account(r.policy, tenant)
		if err != nil {
			return err
		}
		res, d, err := r.o.Budgets.Reserve(ctx, acct, r.part.ID, r.part.Reserved)
		if err != nil {
			return err
		}
		if res == nil {
			if d.TooLarge {
				// The lines go one by one through llmq's own path instead.
				r.o.Logger.Info("batch part larger than its tenant's budget; its lines run through llmq", "part", r.part.ID)
				return r.collect(ctx, nil)
			}
			if d.Held {
				// Held room comes back as running jobs settle.
				return r.wait(ctx, now.Add(d.RetryAfter), "waiting for room running jobs hold in the tenant's budget ("+d.DeniedBy+")")
			}
			return r.wait(ctx, d.ResetsAt, "waiting for the tenant's budget ("+d.DeniedBy+")")
		}
		r.part.BudgetDay, r.part.BudgetGlobalDay, r.part.BudgetGlobal = res.Day, res.GlobalDay, res.Global
	}
	if r.part.ProviderFileID != "" { // refused for the queue once: its file is there
		return r.move(ctx, store.PartCreating, now)
	}
	return r.move(ctx, store.PartUploading, now)
}

func (r *run) reservation() *budget.Reservation {
	return &budget.Reservation{ID: r.part.ID, TenantID: r.part.TenantID, Day: r.part.BudgetDay, GlobalDay: r.part.BudgetGlobalDay,
		Amount: r.part.Reserved, Global: r.part.BudgetGlobal}
}

// fileName is the name of the part's input file at the provider, by which
// a restarted offloader finds it.
func (r *run) fileName() string {
	return "llmq-" + r.part.ID + "-" + strconv.Itoa(r.part.Refusals) + ".jsonl"
}

// submission names the part's current attempt in the provider batch's
// metadata; a part refused for the queue tries again under a new one.
func (r *run) submission() string { return r.part.ID + "/" + strconv.Itoa(r.part.Refusals) }

const metadataKey = "llmq_submission"

// upload puts the part's input file at the provider, unless a resumed part
// finds it there (then its batch may be there too: resumed stays).
func (r *run) upload(ctx context.Context) error {
	var id string
	found, err := false, error(nil)
	if r.resumed {
		id, found, err = r.api.FindBatchFile(ctx, r.fileName())
	}
	if err == nil && !found {
		in := r.input(ctx)
		id, err = r.api.UploadBatchFile(ctx, r.fileName(), in)
		in.Close()
		r.resumed = false
	}
	if err != nil {
		return err
	}
	r.part.ProviderFileID = id
	return r.move(ctx, store.PartCreating, r.o.opts.Now())
}

// create makes the provider batch of the part's file, unless a resumed
// part finds it made.
func (r *run) create(ctx context.Context) error {
	var pb *llm.ProviderBatch
	found, err := false, error(nil)
	if r.resumed {
		pb, found, err = r.api.FindBatch(ctx, metadataKey, r.submission(), r.part.CreatedAt.Add(-time.Hour))
	}
	if err == nil && !found {
		pb, err = r.api.CreateBatch(ctx, r.part.ProviderFileID, r.part.Endpoint,
			map[string]string{metadataKey: r.submission(), "llmq_batch": r.part.BatchID})
	}
	if err != nil {
		return err
	}
	now := r.o.opts.Now()
	r.part.ProviderBatchID, r.part.ProviderStatus, r.part.SubmittedAt = pb.ID, pb.Status, &now
	r.o.Logger.Info("batch part at the provider", "part", r.part.ID, "batch", r.part.BatchID, "deployment", r.part.Deployment,
		"provider_file", r.part.ProviderFileID, "provider_batch", pb.ID, "lines", r.part.Lines)
	return r.move(ctx, store.PartSubmitted, now.Add(r.o.opts.PollMin))
}

// poll looks at the provider batch: keeps the budget hold, cancels it when
// the llmq batch stops, and collects it once it ended.
func (r *run) poll(ctx context.Context, now time.Time) error {
	pb, err := r.api.GetBatch(ctx, r.part.ProviderBatchID)
	if err != nil {
		return err
	}
	if _, err := r.o.Budgets.Extend(ctx, r.reservation()); err != nil {
		r.o.Logger.Warn("extend a batch part's budget hold", "part", r.part.ID, "err", err)
	}
	r.part.ProviderStatus = pb.Status
	if pb.Status == llm.BatchFailed && slices.Contains(pb.ErrorCodes(), "token_limit_exceeded") { // the queue limit
		return r.refused(ctx, now)
	}
	if pb.Ended() {
		return r.move(ctx, store.PartCollecting, now)
	}
	if r.stopping() && pb.Status != llm.BatchCancelling {
		if pb, err = r.api.CancelBatch(ctx, r.part.ProviderBatchID); err != nil {
			return err
		}
		r.part.ProviderStatus = pb.Status
		r.o.Logger.Info("batch part cancelled at the provider", "part", r.part.ID, "batch", r.part.BatchID)
	}
	age := now.Sub(*r.part.SubmittedAt)
	return r.wait(ctx, now.Add(min(max(age/10, r.o.opts.PollMin), r.o.opts.PollMax)), "")
}

// refused handles a provider batch refused for the queue limit: the
// deployment's limit is learned (what the other parts held), and the part
// goes back to pending, its file kept.
func (r *run) refused(ctx context.Context, now time.Time) error {
	held, err := r.o.Store.BatchPartTokensInFlight(ctx, r.part.Deployment)
	if err != nil {
		return err
	}
	held -= r.part.Tokens // the others'
	if held <= 0 {
		held = r.part.Tokens / 2 // alone it is too big
	}
	err = learnScript.Run(ctx, r.o.Redis, []string{r.o.Keys.LearnedBatchQueue(r.part.Deployment)}, held, LearnedQueueTTL.Milliseconds()).Err()
	if err != nil {
		return err
	}
	r.o.Logger.Info("batch part refused for the provider's batch queue limit; it waits", "part", r.part.ID,
		"deployment", r.part.Deployment, "held_tokens", held)
	r.part.Refusals++
	r.part.ProviderBatchID, r.part.ProviderStatus, r.part.SubmittedAt = "", "", nil
	return r.move(ctx, store.PartPending, now.Add(r.o.opts.RetryAfter))
}

// split halves a pending part larger than its deployment's batch queue
// limit: the later half of its jobs go to a new part, and the part gives
// back its budget hold and its file. Cut short, the jobs in no part go
// through llmq's own path (the reconciler enqueues them).
func (r *run) split(ctx context.Context, now time.Time) error {
	jobs, err := r.partJobs(ctx)
	if err != nil {
		return err
	}
	all := slices.SortedFunc(maps.Values(jobs), func(a, b *store.Job) int { return strings.Compare(a.ID, b.ID) })
	keep, move := all[:len(all)/2], all[len(all)/2:]
	if r.part.BudgetDay != "" {
		if err := r.o.Budgets.Release(ctx, r.reservation()); err != nil {
			return err
		}
	}
	moved := make([]string, len(move))
	for i, j := range move {
		moved[i] = j.ID
	}
	if _, err := r.o.Store.JobLeavePart(ctx, r.part.ID, moved); err != nil {
		return err
	}
	half := func(p *store.BatchPart, js []*store.Job) {
		p.Bytes, p.Tokens, p.Reserved, p.Lines = 0, 0, 0, int64(len(js))
		for _, j := range js {
			s, _ := r.o.lineShape(ctx, r.policy, j)
			addLine(p, r.route, &s, j)
		}
	}
	next := &store.BatchPart{BatchID: r.part.BatchID, TenantID: r.part.TenantID, Model: r.part.Model, Deployment: r.part.Deployment,
		Endpoint: r.part.Endpoint}
	half(next, move)
	if err := r.o.Store.BatchPartInsert(ctx, next, moved); err != nil {
		return err
	}
	half(r.part, keep)
	r.part.BudgetDay, r.part.BudgetGlobalDay, r.part.BudgetGlobal, r.part.ProviderFileID = "", "", false, ""
	r.part.Refusals++ // a new file name
	r.o.Logger.Info("batch part split for the provider's batch queue limit", "part", r.part.ID, "new_part", next.ID,
		"lines", len(keep), "moved", len(move))
	return r.wait(ctx, now, "")
}

// input streams the part's input file: one line per job, its id as
// custom_id. Closing it stops the stream.
func (r *run) input(ctx context.Context) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		w := bufio.NewWriterSize(pw, 256<<10)
		err := r.o.Store.JobStreamByPart(ctx, r.part.ID, func(j *store.Job) error {
			s, _ := r.o.lineShape(ctx, r.policy, j)
			line, err := llm.BatchInputLine(j.ID, s.Request(r.route, j.Request))
			if err != nil {
				return fmt.Errorf("job %s: %w", j.ID, err)
			}
			if _, err := w.Write(line); err != nil {
				return err
			}
			return w.WriteByte('\n')
		})
		if err == nil {
			err = w.Flush()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

func (r *run) partJobs(ctx context.Context) (map[string]*store.Job, error) {
	jobs := map[string]*store.Job{}
	err := r.o.Store.JobStreamByPart(ctx, r.part.ID, func(j *store.Job) error {
		jobs[j.ID] = j
		return nil
	})
	return jobs, err
}

// collect stores the outcome of each of the part's lines from the ended
// provider batch pb (nil: none ran), gives the budget hold back and ends
// the part. Every write is idempotent.
func (r *run) collect(ctx context.Context, pb *llm.ProviderBatch) error {
	jobs, err := r.partJobs(ctx)
	if err != nil {
		return err
	}
	c := &collection{run: r, jobs: jobs, seen: map[string]bool{}}
	if pb != nil {
		for _, file := range []string{pb.OutputFileID, pb.ErrorFileID} {
			if file == "" {
				continue
			}
			if err := c.readFile(ctx, file); err != nil {
				return err
			}
		}
		if err := c.flush(ctx); err != nil {
			return err
		}
	}
	var undone []string
	for id, j := range jobs {
		if !c.seen[id] && !j.Status.Terminal() {
			undone = append(undone, id)
		}
	}
	if err := r.undone(ctx, jobs, undone); err != nil {
		return err
	}
	if r.part.BudgetDay != "" {
		if err := r.o.Budgets.Release(ctx, r.reservation()); err != nil {
			return err
		}
	}
	now := r.o.opts.Now()
	r.part.EndedAt = &now
	if pb != nil {
		r.part.ProviderStatus = pb.Status
	}
	r.o.Logger.Info("batch part ended", "part", r.part.ID, "batch", r.part.BatchID, "provider_status", r.part.ProviderStatus,
		"lines", len(jobs), "answered", c.answered, "failed", c.failed, "undone", len(undone), "unknown_lines", c.unknown)
	return r.move(ctx, store.PartDone, now)
}

// undone takes the part's jobs ids, which the provider did not run, back to
// llmq's own path while the batch's window allows, else cancels them.
func (r *run) undone(ctx context.Context, jobs map[string]*store.Job, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	if r.stopping() {
		for _, id := range ids {
			if _, _, err := r.o.Store.JobCancel(ctx, r.part.TenantID, id); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		return nil
	}
	left, err := r.o.Store.JobLeavePart(ctx, r.part.ID, ids)
	if err != nil {
		return err
	}
	share := 1.0
	if tenant, err := r.o.Store.TenantGetByID(ctx, r.part.TenantID); err == nil {
		if t, ok := r.policy.Tier(tenant.Tier); ok {
			share = t.Share
		}
	}
	refs := make([]queue.JobRef, len(left))
	for i, id := range left {
		refs[i] = admission.JobRef(r.policy, jobs[id], share)
	}
	if _, err := r.o.Queue.EnqueueJobs(ctx, refs); err != nil {
		r.o.Logger.Warn("enqueue a batch part's undone lines; the reconciler will", "part", r.part.ID, "err", err)
	}
	return nil
}

// collection reads a provider batch's files into the part's jobs.
type collection struct {
	*run
	jobs map[string]*store.Job
	seen map[string]bool

	pending  []*store.JobCompleteParams
	answered int // jobs this pass completed
	failed   int
	unknown  int
}

func (c *collection) readFile(ctx context.Context, fileID string) error {
	body, err := c.api.BatchFileContent(ctx, fileID)
	if err != nil {
		return err
	}
	defer body.Close()
	limit := cmp.Or(max(c.provider.MaxResponseBytes, 0), llm.DefaultMaxResponseBytes)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), int(limit)+4096)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var line llm.BatchLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			c.unknown++
			continue
		}
		if err := c.line(ctx, &line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read the provider's file %s: %w", fileID, err)
	}
	return nil
}

// line stores one line's outcome: an answer is charged at the batch price;
// a refused request fails the job, uncharged; a line the provider did not
// run is left for undone.
func (c *collection) line(ctx context.Context, l *llm.BatchLine) error {
	j, ok := c.jobs[l.CustomID]
	if !ok || c.seen[l.CustomID] {
		c.unknown++ // not a line of this part, or one seen already: trusted for nothing
		return nil
	}
	switch {
	case l.Response != nil && l.Response.StatusCode >= 200 && l.Response.StatusCode < 300:
		c.seen[j.ID] = true
		c.pending = append(c.pending, c.answer(ctx, j, l))
		if len(c.pending) >= 500 {
			return c.flush(ctx)
		}
	case l.Response != nil && l.Response.StatusCode != 0:
		c.seen[j.ID] = true
		c.failed++
		body := l.Response.Body
		if !json.Valid(body) {
			body = nil
		}
		if _, _, err := c.o.Store.JobFail(ctx, &store.JobFailParams{ID: j.ID, Error: refusal(l), ResponseStatus: l.Response.StatusCode,
			ResponseBody: body, CountAttempt: true}); err != nil {
			return err
		}
	}
	return nil
}

// answer is the JobComplete of a line the provider answered, judged as
// llmq's own path judges an answer (admission.Judge), at the batch price.
func (c *collection) answer(ctx context.Context, j *store.Job, l *llm.BatchLine) *store.JobCompleteParams {
	route := batchRoute(c.route)
	s, _ := c.o.lineShape(ctx, c.policy, j)
	p := &store.JobCompleteParams{ID: j.ID, Day: c.part.BudgetDay, GlobalDay: c.part.BudgetGlobalDay, ResponseStatus: l.Response.StatusCode,
		ResponseBody: l.Response.Body, ProviderRequestID: llm.Truncate(l.Response.RequestID, 200), Deployment: c.part.Deployment, Batched: true}
	worst := admission.Verdict{Usage: llm.Usage{PromptTokens: j.EstPromptTokens, CompletionTokens: j.EstMaxTokens},
		Cost: lineWorst(c.route, &s, j)}
	u, err := llm.UsageOf(l.Response.Body)
	invalid := err != nil || !json.Valid(l.Response.Body)
	if invalid {
		u = llm.Usage{}
	}
	v := admission.Judge(route, &s, j.EstPromptTokens, j.EstMaxTokens, worst, u)
	if invalid {
		p.ResponseBody = nil
		v.Failed = &store.JobError{Type: wire.TypeServer, Code: client.CodeProviderResponseInvalid,
			Message: fmt.Sprintf("The provider's batch answer is not of the shape of an OpenAI answer; the job is charged its worst case, $%s.", v.Cost)}
	}
	p.PromptTokens, p.CompletionTokens, p.CachedTokens, p.TotalTokens = v.Usage.PromptTokens, v.Usage.CompletionTokens, v.Usage.CachedTokens, v.Usage.TotalTokens
	p.Cost, p.UsageEstimated, p.Failed = v.Cost, v.Estimated, v.Failed
	if p.Failed == nil && j.Endpoint == llm.EndpointResponses {
		c.remember(ctx, j, l.Response.Body, v.Usage)
	}
	return p
}

// remember records a stored response of a line's answer as the tenant's.
func (c *collection) remember(ctx context.Context, j *store.Job, answer []byte, u llm.Usage) {
	b, err := llm.Decode(j.Endpoint, j.Request)
	if err != nil || !b.StoresResponse() {
		return
	}
	rows := admission.StoredRows(j.TenantID, c.part.Deployment, answer, u)
	if rows == nil {
		return
	}
	if err := c.o.Store.StoredResponseInsert(ctx, rows); err != nil {
		c.o.Logger.Warn("record a stored response of a batch line; its follow-ups will be refused", "job", j.ID, "err", err)
	}
}

// refusal is the job error of a request the provider's batch refused.
func refusal(l *llm.BatchLine) store.JobError {
	var eb struct {
		Error *struct {
			Message, Type, Code, Param string
		} `json:"error"`
	}
	e := store.JobError{Type: wire.TypeInvalidRequest, Message: fmt.Sprintf("The provider refused the request (%d).", l.Response.StatusCode)}
	if json.Unmarshal(l.Response.Body, &eb) == nil && eb.Error != nil && eb.Error.Message != "" {
		e.Message, e.Code, e.Param = llm.Truncate(eb.Error.Message, 2000), client.Code(llm.Truncate(eb.Error.Code, 100)), llm.Truncate(eb.Error.Param, 100)
		if eb.Error.Type != "" {
			e.Type = llm.Truncate(eb.Error.Type, 100)
		}
	}
	return e
}

const settlers = 32

// flush stores the answers read so far in one transaction and charges each
// to the budget on the part's days.
func (c *collection) flush(ctx context.Context) error {
	if len(c.pending) == 0 {
		return nil
	}
	results, errs := c.o.Store.JobCompleteMany(ctx, &store.JobCompleteManyParams{Jobs: c.pending})
	for i := range c.pending {
		if errs[i] != nil {
			return errs[i]
		}
		if results[i].Completed {
			c.answered++ // by this pass: a collection run again after a crash counts what it added
		}
	}
	// Settled again even when an earlier pass stored the job: a job is
	// charged once per day.
	var g errgroup.Group
	g.SetLimit(settlers)
	for _, p := range c.pending {
		res := &budget.Reservation{ID: p.ID, TenantID: c.part.TenantID, Day: p.Day, GlobalDay: p.GlobalDay, Global: c.part.BudgetGlobal}
		g.Go(func() error { return c.o.Budgets.Settle(ctx, res, p.Cost, true) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	c.pending = c.pending[:0]
	return nil
}
