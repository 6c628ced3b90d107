package client

import (
	"cmp"
	"context"
	"iter"
	"net/http"
	"slices"
)

// BatchesService calls /v1/batches: OpenAI-style batches, whose input is an
// uploaded file of BatchRequest lines.
type BatchesService struct{ c *Client }

// BatchCreateParams describe a batch (POST /v1/batches).
type BatchCreateParams struct {
	// InputFileID is an uploaded file of purpose "batch".
	InputFileID string `json:"input_file_id"`
	// Endpoint is the url of every line: "/v1/chat/completions",
	// "/v1/responses" or "/v1/embeddings".
	Endpoint string `json:"endpoint"`
	// CompletionWindow is how long the batch may run. Defaults to "24h".
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	// WebhookURL (an llmq addition) receives the batch once it ends.
	WebhookURL string `json:"webhook_url,omitempty"`
}

// Create creates a batch of an uploaded input file. It starts as
// validating; lines are checked and enqueued as jobs.
func (s *BatchesService) Create(ctx context.Context, p *BatchCreateParams) (*Batch, error) {
	body := *p
	body.CompletionWindow = cmp.Or(body.CompletionWindow, "24h")
	return call[Batch](ctx, s.c, &request{method: http.MethodPost, path: "/v1/batches", json: &body})
}

// Get returns a batch with its request counts.
func (s *BatchesService) Get(ctx context.Context, id string) (*Batch, error) {
	return call[Batch](ctx, s.c, &request{method: http.MethodGet, path: "/v1/batches/" + pathID(id)})
}

// Cancel asks a batch to stop: it is cancelling until its running requests
// end, then cancelled, with the results so far in its files.
func (s *BatchesService) Cancel(ctx context.Context, id string) (*Batch, error) {
	return call[Batch](ctx, s.c, &request{method: http.MethodPost, path: "/v1/batches/" + pathID(id) + "/cancel"})
}

// List returns one page of the tenant's batches, newest first.
func (s *BatchesService) List(ctx context.Context, p *ListParams) (*List[Batch], error) {
	return call[List[Batch]](ctx, s.c, &request{method: http.MethodGet, path: "/v1/batches", query: p.query()})
}

// All iterates over every batch of the tenant, page after page.
func (s *BatchesService) All(ctx context.Context, p *ListParams) iter.Seq2[*Batch, error] {
	q := deref(p)
	return pages(&q.After, func() (*List[Batch], error) { return s.List(ctx, &q) })
}

// Finished reports whether the batch has reached a final status:
// completed, failed, expired or cancelled.
func (b *Batch) Finished() bool {
	return slices.Contains([]string{"completed", "failed", "expired", "cancelled"}, b.Status)
}

// BatchWaitOptions set how Batches.Wait polls.
type BatchWaitOptions struct {
	WaitOptions
	// OnPoll, when set, sees the batch after every poll, the last one
	// included (to draw progress).
	OnPoll func(*Batch)
}

// Wait polls a batch until it finishes and returns it in its final state.
// On ctx's end it returns the last batch seen (nil if none was) with ctx's
// error; the batch itself runs on.
func (s *BatchesService) Wait(ctx context.Context, id string, opts *BatchWaitOptions) (*Batch, error) {
	o := deref(opts)
	return wait(ctx, &o.WaitOptions, func() (*Batch, error) {
		b, err := s.Get(ctx, id)
		if err == nil && o.OnPoll != nil {
			o.OnPoll(b)
		}
		return b, err
	}, (*Batch).Finished)
}
