package client

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// JobsService calls /v1/jobs: single asynchronous completions.
type JobsService struct{ c *Client }

// JobCreateParams describe a job to enqueue (POST /v1/jobs).
type JobCreateParams struct {
	// CustomID is the caller's own id of the job, echoed in the job.
	CustomID string `json:"custom_id,omitempty"`
	// Endpoint is "/v1/chat/completions", "/v1/responses" or
	// "/v1/embeddings". Defaults to "/v1/chat/completions".
	Endpoint string `json:"endpoint,omitempty"`
	// Body is the request for the provider: a json.RawMessage, a map or a
	// struct that encodes to the JSON the endpoint takes.
	Body any `json:"body"`
	// Priority is critical, default, low or batch: the tier's priority or a
	// lower one. Defaults to the tier's.
	Priority string `json:"priority,omitempty"`
	// WebhookURL receives the job when it finishes.
	WebhookURL string            `json:"webhook_url,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// IdempotencyKey makes the call safe to repeat: a second create with
	// the same key returns the first job instead of enqueueing another.
	IdempotencyKey string `json:"-"`
}

// Create enqueues a job; the job it returns is queued (or, for a repeated
// IdempotencyKey, the job that key created, in whatever state it is).
func (s *JobsService) Create(ctx context.Context, p *JobCreateParams) (*Job, error) {
	req := &request{method: http.MethodPost, path: "/v1/jobs", json: p}
	if p.IdempotencyKey != "" {
		req.header = http.Header{"Idempotency-Key": {p.IdempotencyKey}}
	}
	var j Job
	if err := s.c.do(ctx, req, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Get returns a job of the key's tenant; another tenant's job is a 404.
func (s *JobsService) Get(ctx context.Context, id string) (*Job, error) {
	var j Job
	if err := s.c.do(ctx, &request{method: http.MethodGet, path: "/v1/jobs/" + pathID(id)}, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Cancel cancels a job that has not finished and returns it. Cancelling a
// cancelled job again is not an error; cancelling one that succeeded or
// failed is a 409.
func (s *JobsService) Cancel(ctx context.Context, id string) (*Job, error) {
	var j Job
	if err := s.c.do(ctx, &request{method: http.MethodDelete, path: "/v1/jobs/" + pathID(id)}, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// JobListParams filter and page GET /v1/jobs. Zero fields are left out.
type JobListParams struct {
	// Status is one of queued, running, waiting, deferred, succeeded,
	// failed, cancelled.
	Status  string
	BatchID string
	// Limit is the page size, 1 to 1000. Defaults to the server's (20).
	Limit int
	// After is the last id of the previous page.
	After string
}

func (p *JobListParams) query() url.Values {
	q := url.Values{}
	if p == nil {
		return q
	}
	set(q, "status", p.Status)
	set(q, "batch_id", p.BatchID)
	set(q, "after", p.After)
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	return q
}

// List returns one page of the tenant's jobs, newest first.
func (s *JobsService) List(ctx context.Context, p *JobListParams) (*List[Job], error) {
	var l List[Job]
	if err := s.c.do(ctx, &request{method: http.MethodGet, path: "/v1/jobs", query: p.query()}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// All iterates over every job that p selects, page after page, starting
// after p.After. An error ends the iteration, yielded with a nil job.
func (s *JobsService) All(ctx context.Context, p *JobListParams) iter.Seq2[*Job, error] {
	q := JobListParams{}
	if p != nil {
		q = *p
	}
	return pages(q.After, func(after string) (*List[Job], error) {
		q.After = after
		return s.List(ctx, &q)
	})
}

// Finished reports whether the job has reached a final status: succeeded,
// failed or cancelled.
func (j *Job) Finished() bool {
	switch j.Status {
	case "succeeded", "failed", "cancelled":
		return true
	}
	return false
}

// WaitOptions set how Wait polls. Polls start at Interval and back off by
// half each time up to MaxInterval, so a short job is seen soon and a long
// one costs few requests.
type WaitOptions struct {
	// Interval is the first wait between polls. Defaults to 250ms.
	Interval time.Duration
	// MaxInterval is the longest wait between polls. Defaults to 5s.
	MaxInterval time.Duration
}

func (o *WaitOptions) poller() *poller {
	p := &poller{next: 250 * time.Millisecond, max: 5 * time.Second}
	if o != nil && o.Interval > 0 {
		p.next = o.Interval
	}
	if o != nil && o.MaxInterval > 0 {
		p.max = o.MaxInterval
	}
	if p.next > p.max {
		p.next = p.max
	}
	return p
}

// poller spaces polls.
type poller struct{ next, max time.Duration }

// wait sleeps the current interval and grows the next one.
func (p *poller) wait(ctx context.Context) error {
	d := p.next
	p.next = min(p.next+p.next/2, p.max)
	return sleep(ctx, d)
}

// Wait polls a job until it finishes and returns it in its final state. On
// ctx's end it returns the last job seen (nil if none was) with ctx's
// error. A waiting or deferred job (rate limit, budget) may take long: bound
// the wait with ctx.
func (s *JobsService) Wait(ctx context.Context, id string, opts *WaitOptions) (*Job, error) {
	p := opts.poller()
	var last *Job
	for {
		j, err := s.Get(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return last, err
			}
			return nil, err
		}
		last = j
		if j.Finished() {
			return j, nil
		}
		if err := p.wait(ctx); err != nil {
			return j, err
		}
	}
}

// pages iterates over the items of a paged list, fetching the page after
// each last id while the server says there is more.
func pages[T any](after string, fetch func(after string) (*List[T], error)) iter.Seq2[*T, error] {
	return func(yield func(*T, error) bool) {
		for {
			l, err := fetch(after)
			if err != nil {
				yield(nil, err)
				return
			}
			for i := range l.Data {
				if !yield(&l.Data[i], nil) {
					return
				}
			}
			if !l.HasMore || l.LastID == nil || *l.LastID == "" || *l.LastID == after {
				return
			}
			after = *l.LastID
		}
	}
}

func set(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}
