package offload

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sync/errgroup"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

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
