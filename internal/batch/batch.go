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
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/loop"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
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

// sweeperLock keeps to one the processes sweeping at a time.
const sweeperLock = "batch-sweeper"

// Run sweeps the unfinished batches every second until ctx ends.
// Every dispatcher runs it; a store lock lets one sweep at a time.
func (s *Service) Run(ctx context.Context) {
	loop.Every(ctx, sweepInterval, true, s.Sweep, s.Logger, "batch sweep failed")
}

// Sweep moves every unfinished batch on once (step), unless another process
// is sweeping; a batch that another process holds is left for the next.
func (s *Service) Sweep(ctx context.Context) error {
	unlock, ok, err := s.Store.TryLock(ctx, sweeperLock)
	if err != nil || !ok {
		return err
	}
	defer unlock()
	p := &store.BatchListActiveParams{Limit: 1000}
	list := func() ([]*store.Batch, bool, error) { return s.Store.BatchListActive(ctx, p) }
	id := func(b *store.Batch) string { return b.ID }
	return loop.Pages(&p.After, list, id, func(b *store.Batch) error {
		if err := s.step(ctx, b); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.Logger.Warn("batch step failed; the next sweep tries again", "batch", b.ID, "status", b.Status, "err", err)
		}
		return nil
	})
}

func (s *Service) step(ctx context.Context, b *store.Batch) error {
	if b.Status == store.BatchValidating && !s.expired(b) {
		s.Start(b.ID)
		return nil
	}
	unlock, ok, err := s.Store.TryLock(ctx, lockName(b.ID))
	if err != nil || !ok {
		return err
	}
	defer unlock()
	if b, err = s.Store.BatchGetByID(ctx, b.ID); err != nil { // as it is under the lock
		return err
	}
	switch b.Status {
	case store.BatchValidating: // past its expiry, its validation not running
		if s.expired(b) {
			return s.expireValidating(ctx, b)
		}
	case store.BatchInProgress:
		if s.expired(b) {
			return s.stop(ctx, b, store.BatchExpired, b.ExpiresAt)
		}
		c, err := s.Store.JobCountsByBatch(ctx, b.ID)
		if err != nil || c.Unfinished() > 0 {
			return err
		}
		b, _, err = s.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{ID: b.ID,
			From: []store.BatchStatus{store.BatchInProgress}, To: store.BatchFinalizing})
		if err != nil || b.Status != store.BatchFinalizing {
			return err
		}
		fallthrough
	case store.BatchFinalizing: // this finalization, or one that stopped half way
		return s.finish(ctx, b, store.BatchCompleted, nil, nil)
	case store.BatchCancelling:
		return s.stop(ctx, b, store.BatchCancelled, b.CancellingAt)
	}
	return nil
}

func (s *Service) expired(b *store.Batch) bool {
	return b.ExpiresAt != nil && !s.opts.Now().Before(*b.ExpiresAt)
}

// expireValidating expires a batch whose window ended before its
// validation did: nothing of it was enqueued, so the jobs it stored are
// cancelled at once. The caller holds the batch's lock.
func (s *Service) expireValidating(ctx context.Context, b *store.Batch) error {
	total, err := s.cancelStored(ctx, b.ID)
	if err != nil {
		return err
	}
	return s.finish(ctx, b, store.BatchExpired, total, []client.BatchError{{Code: client.CodeBatchExpired,
		Message: "The completion window ended before the input file was validated; no request of the batch ran."}})
}

// stop ends a cancelled or expired batch: its pending jobs are cancelled at
// once (again at every sweep: a running job may come back to waiting after
// a 429); running ones may finish, for stopGrace after the stop (at), and
// are then cancelled too. Once none runs, the batch ends as final, with the
// results of what finished.
func (s *Service) stop(ctx context.Context, b *store.Batch, final store.BatchStatus, at *time.Time) error {
	if _, err := s.Store.JobCancelByBatch(ctx, b.ID); err != nil {
		return err
	}
	c, err := s.Store.JobCountsByBatch(ctx, b.ID)
	if err != nil {
		return err
	}
	if c.Unfinished() > 0 {
		if at == nil || s.opts.Now().Sub(*at) < stopGrace {
			return nil
		}
		s.Logger.Warn("batch jobs still running after the grace period; cancelling them", "batch", b.ID, "running", c.Running)
		err := s.Store.JobStreamByBatch(ctx, b.ID, []store.JobStatus{store.JobQueued, store.JobRunning, store.JobWaiting, store.JobDeferred},
			func(j *store.Job) error {
				_, _, err := s.Store.JobCancel(ctx, j.TenantID, j.ID)
				return err
			})
		if err != nil {
			return err
		}
	}
	return s.finish(ctx, b, final, nil, nil)
}

// finish ends a batch as final: it makes its output and error files and
// enqueues its webhook before the status moves, so a crash never loses the
// call (the delivery waits for the terminal state).
func (s *Service) finish(ctx context.Context, b *store.Batch, final store.BatchStatus, total *int64, errs []client.BatchError) error {
	outputID, errorID, err := s.writeFiles(ctx, b, final)
	if err != nil {
		return fmt.Errorf("make files: %w", err)
	}
	if b.WebhookURL != "" {
		if _, err := s.Queue.EnqueueWebhook(ctx, queue.WebhookPayload{Kind: store.WebhookBatch, ID: b.ID}); err != nil {
			return err
		}
	}
	nb, applied, err := s.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{ID: b.ID,
		From: []store.BatchStatus{b.Status}, To: final, OutputFileID: outputID, ErrorFileID: errorID,
		Total: total, Errors: errorsJSON(errs)})
	if err != nil {
		return err
	}
	if applied {
		s.Logger.Info("batch ended", "batch", b.ID, "status", final)
	} else {
		s.Logger.Warn("batch changed while it was ending; the next sweep looks again", "batch", b.ID, "status", nb.Status)
	}
	return nil
}

// The statuses of the jobs each generated file holds.
var (
	outputStatuses = []store.JobStatus{store.JobSucceeded}
	errorStatuses  = []store.JobStatus{store.JobFailed, store.JobCancelled}
)

// WriteFile writes the content of an ended batch's output file (a line per
// succeeded request) or error file (a line per other request) to w, in
// input order, reading the jobs a page at a time.
func WriteFile(ctx context.Context, db *store.DB, w io.Writer, b *store.Batch, purpose store.FilePurpose) error {
	statuses := outputStatuses
	if purpose == store.FilePurposeBatchError {
		statuses = errorStatuses
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := newLineEncoder(bw)
	err := db.JobStreamByBatch(ctx, b.ID, statuses, func(j *store.Job) error {
		return enc.Encode(wire.BatchResult(j, b.Status))
	})
	if err != nil {
		return err
	}
	return bw.Flush()
}

// newLineEncoder writes one JSON value per line, leaving <, > and & as they
// are (a provider's body is passed on unchanged).
func newLineEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

type size struct{ bytes, lines int64 }

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// sizes renders both files once, keeping only their sizes, for the file
// objects that announce them.
func sizes(ctx context.Context, db *store.DB, b *store.Batch, final store.BatchStatus) (out, errs size, err error) {
	var co, ce countingWriter
	eo, ee := newLineEncoder(&co), newLineEncoder(&ce)
	err = db.JobStreamByBatch(ctx, b.ID, nil, func(j *store.Job) error {
		switch j.Status {
		case store.JobSucceeded:
			out.lines++
			return eo.Encode(wire.BatchResult(j, final))
		case store.JobFailed, store.JobCancelled:
			errs.lines++
			return ee.Encode(wire.BatchResult(j, final))
		}
		return fmt.Errorf("job %s of batch %s is still %s", j.ID, b.ID, j.Status)
	})
	out.bytes, errs.bytes = co.n, ce.n
	return out, errs, err
}

// fileID is the id of a batch's output or error file, derived from the
// batch id and, for the error file whose content depends on it, how the
// batch ended: a finalization run again finds the file it made.
func fileID(batchID string, purpose store.FilePurpose, final store.BatchStatus) string {
	body := strings.TrimPrefix(batchID, ids.Batch)
	last := "0"
	if purpose == store.FilePurposeBatchError {
		last = map[store.BatchStatus]string{store.BatchCompleted: "1", store.BatchFailed: "2",
			store.BatchExpired: "3", store.BatchCancelled: "4"}[final]
	}
	return ids.File + body[:len(body)-1] + last
}

// writeFiles creates the file objects of a batch ending as final: an output
// file when a request succeeded, an error file when one did not.
func (s *Service) writeFiles(ctx context.Context, b *store.Batch, final store.BatchStatus) (outputID, errorID string, err error) {
	out, errs, err := sizes(ctx, s.Store, b, final)
	if err != nil {
		return "", "", err
	}
	mk := func(purpose store.FilePurpose, name string, sz size) (string, error) {
		if sz.lines == 0 {
			return "", nil
		}
		id := fileID(b.ID, purpose, final)
		_, err := s.Store.FileInsert(ctx, &store.FileInsertParams{ID: id, TenantID: b.TenantID, Purpose: purpose,
			Filename: name, BatchID: b.ID, Generated: true, Bytes: sz.bytes, Lines: sz.lines})
		if errors.Is(err, store.ErrConflict) { // made by an earlier, interrupted finalization?
			f, gerr := s.Store.FileGetByID(ctx, id)
			if gerr != nil {
				return "", gerr
			}
			if f.BatchID != b.ID {
				return "", fmt.Errorf("file id %s of batch %s is taken by another file", id, b.ID)
			}
			err = nil
		}
		return id, err
	}
	if outputID, err = mk(store.FilePurposeBatchOutput, b.ID+"_output.jsonl", out); err == nil {
		errorID, err = mk(store.FilePurposeBatchError, b.ID+"_error.jsonl", errs)
	}
	return outputID, errorID, err
}
