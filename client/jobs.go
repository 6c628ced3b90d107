package client

import (
	"cmp"
	"context"
	"iter"
	"net/http"
	"net/url"
	"slices"
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

// Create enqueues a job; for a repeated IdempotencyKey it returns the job
// that key created, in whatever state it is.
func (s *JobsService) Create(ctx context.Context, p *JobCreateParams) (*Job, error) {
	req := &request{method: http.MethodPost, path: "/v1/jobs", json: p}
	if p.IdempotencyKey != "" {
		req.header = http.Header{"Idempotency-Key": {p.IdempotencyKey}}
	}
	return call[Job](ctx, s.c, req)
}

// Get returns a job of the key's tenant; another tenant's job is a 404.
func (s *JobsService) Get(ctx context.Context, id string) (*Job, error) {
	return call[Job](ctx, s.c, &request{method: http.MethodGet, path: "/v1/jobs/" + pathID(id)})
}

// Cancel cancels a job that has not finished and returns it. Cancelling a
// cancelled job again is not an error; cancelling one that succeeded or
// failed is a 409.
func (s *JobsService) Cancel(ctx context.Context, id string) (*Job, error) {
	return call[Job](ctx, s.c, &request{method: http.MethodDelete, path: "/v1/jobs/" + pathID(id)})
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

// List returns one page of the tenant's jobs, newest first.
func (s *JobsService) List(ctx context.Context, p *JobListParams) (*List[Job], error) {
	q := deref(p)
	return call[List[Job]](ctx, s.c, &request{method: http.MethodGet, path: "/v1/jobs",
		query: query(q.Limit, "after", q.After, "status", q.Status, "batch_id", q.BatchID)})
}

// All iterates over every job that p selects, page after page, starting
// after p.After. An error ends the iteration, yielded with a nil job.
func (s *JobsService) All(ctx context.Context, p *JobListParams) iter.Seq2[*Job, error] {
	q := deref(p)
	return pages(&q.After, func() (*List[Job], error) { return s.List(ctx, &q) })
}

// Finished reports whether the job has reached a final status: succeeded,
// failed or cancelled.
func (j *Job) Finished() bool {
	return slices.Contains([]string{"succeeded", "failed", "cancelled"}, j.Status)
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

// Wait polls a job until it finishes and returns it in its final state. On
// ctx's end it returns the last job seen (nil if none was) with ctx's
// error. A waiting or deferred job (rate limit, budget) may take long: bound
// the wait with ctx.
func (s *JobsService) Wait(ctx context.Context, id string, opts *WaitOptions) (*Job, error) {
	return wait(ctx, opts, func() (*Job, error) { return s.Get(ctx, id) }, (*Job).Finished)
}

// wait gets an object until it is finished, polling as opts say; on ctx's
// end it returns the last one seen with ctx's error.
func wait[T any](ctx context.Context, opts *WaitOptions, get func() (*T, error), finished func(*T) bool) (*T, error) {
	o := deref(opts)
	longest := cmp.Or(max(o.MaxInterval, 0), 5*time.Second)
	next := min(cmp.Or(max(o.Interval, 0), 250*time.Millisecond), longest)
	var last *T
	for {
		v, err := get()
		if err != nil {
			if ctx.Err() != nil {
				return last, err
			}
			return nil, err
		}
		last = v
		if finished(v) {
			return v, nil
		}
		if err := sleep(ctx, next); err != nil {
			return v, err
		}
		next = min(next+next/2, longest)
	}
}

// pages iterates over the items of a paged list, fetching the page after
// each last id while the server says there is more.
func pages[T any](after *string, fetch func() (*List[T], error)) iter.Seq2[*T, error] {
	return func(yield func(*T, error) bool) {
		for {
			l, err := fetch()
			if err != nil {
				yield(nil, err)
				return
			}
			for i := range l.Data {
				if !yield(&l.Data[i], nil) {
					return
				}
			}
			if !l.HasMore || l.LastID == nil || *l.LastID == "" || *l.LastID == *after {
				return
			}
			*after = *l.LastID
		}
	}
}

// query is the query of a list: the page size when set, and the values of
// the names given in pairs that are not empty.
func query(limit int, pairs ...string) url.Values {
	q := url.Values{}
	for i := 0; i < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			q.Set(pairs[i], pairs[i+1])
		}
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return q
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
