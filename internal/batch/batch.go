// Package batch runs OpenAI-style batches. It validates a batch's input file
// line by line and turns it into jobs (refused lines stored as failed jobs
// with their line number and why), inserted in bulk and enqueued once the
// whole file is checked. Its sweeper moves batches through their lifecycle
// (finalize, cancel, expire) and calls their webhook at the end. Output and
// error files are rendered from the batch's jobs whenever they are read.
//
// Every step is safe to repeat after a crash, and a store lock per batch
// serializes work on it, so several dispatchers can run side by side.
package batch

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// CompletionWindow is the only completion window there is, as at OpenAI.
const CompletionWindow = "24h"

// Window is the length of CompletionWindow.
const Window = 24 * time.Hour

// Options tune a Service. The zero value is ready to use.
type Options struct {
	// GroupLines is how many lines are inserted together (one COPY).
	// Defaults to 5000.
	GroupLines int
	// Now is the clock of expiry (a batch expires at created_at + 24h).
	// Defaults to time.Now.
	Now func() time.Time
}

const (
	// groupBytes flushes a group early, so a file of large lines never
	// sits in memory whole.
	groupBytes = 8 << 20
	// maxLineBytes is the longest line accepted (the default request size
	// of POST /v1/jobs); a longer one is skipped without being read whole.
	maxLineBytes = 1 << 20
	// maxValidations bounds the batches this process validates at once.
	maxValidations = 2
	sweepInterval  = time.Second
	// stopGrace is how long a cancelled or expired batch waits for its
	// running jobs; after it they are cancelled too, their results unkept.
	stopGrace = 10 * time.Minute
)

func (o Options) withDefaults() Options {
	o.GroupLines = cmp.Or(o.GroupLines, 5000)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Deps are what a Service works with.
type Deps struct {
	Store     *store.DB
	Policy    *config.PolicyHolder
	Admission *admission.Estimator
	Queue     *queue.Client
	// Offload puts the lines a tier offloads in parts for the provider's
	// Batch API; nil runs every line through llmq's own path.
	Offload *offload.Offloader
	Logger  *slog.Logger
}

// Service validates batches and runs their lifecycle.
type Service struct {
	Deps
	opts Options

	// ctx bounds background validations; Close cancels it and waits.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}

	mu         sync.Mutex
	validating map[string]bool // batches this process is validating
}

// New returns a Service. Close it to stop its background work.
func New(d Deps, opts Options) *Service {
	d.Logger = cmp.Or(d.Logger, slog.New(slog.DiscardHandler))
	if d.Admission == nil {
		d.Admission = admission.New(nil, d.Store)
	}
	o := opts.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{Deps: d, opts: o, ctx: ctx, cancel: cancel, sem: make(chan struct{}, maxValidations),
		validating: map[string]bool{}}
}

// Close stops the validations running in the background and waits for
// them; a batch left validating is picked up again by a sweeper.
func (s *Service) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// lockName is the store lock of one batch: whoever validates, finalizes or
// ends a batch holds it.
func lockName(batchID string) string { return "batch:" + batchID }

// Start validates the batch in the background (a batch that is validating;
// anything else is left alone). It returns at once; a batch already being
// validated, here or in another process, is not validated twice.
func (s *Service) Start(batchID string) {
	s.mu.Lock()
	if s.validating[batchID] || s.ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	s.validating[batchID] = true
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.validating, batchID)
			s.mu.Unlock()
		}()
		select {
		case s.sem <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		defer func() { <-s.sem }()
		if err := s.Validate(s.ctx, batchID); err != nil && s.ctx.Err() == nil {
			s.Logger.Warn("batch validation failed; the sweeper will try again", "batch", batchID, "err", err)
		}
	}()
}
