package config

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// HolderOptions tune a PolicyHolder. A nil *HolderOptions means the defaults.
type HolderOptions struct {
	// PollInterval is how often Watch looks at the file. Defaults to 1s.
	PollInterval time.Duration
	// Signals, when set, replaces Watch's SIGHUP: each value asks for a
	// reload.
	Signals <-chan os.Signal
}

// PolicyHolder keeps the policy in force and swaps it when the file changes.
// Readers call Current on every use, so a reload takes effect for the next
// job or request. It is safe for concurrent use.
type PolicyHolder struct {
	path    string
	poll    time.Duration
	signals <-chan os.Signal
	cur     atomic.Pointer[Policy]

	mu          sync.Mutex  // serialises reloads and notifications; guards below
	stat        os.FileInfo // of the file when last read
	lastSeen    [32]byte    // hash of the content last tried, applied or refused
	applied     [32]byte    // hash of the content in force
	lastReadErr string      // so an unreadable file is logged once, not every poll

	subsMu sync.Mutex
	subs   []*subscription

	afterPoll func() // for tests
}

type subscription struct{ fn func(old, new *Policy) }

// NewPolicyHolder loads the policy at path and returns a holder for it.
func NewPolicyHolder(path string, opts *HolderOptions) (*PolicyHolder, error) {
	if opts == nil {
		opts = &HolderOptions{}
	}
	h := &PolicyHolder{path: path, poll: cmp.Or(opts.PollInterval, time.Second), signals: opts.Signals}
	if _, _, err := h.reload(true); err != nil {
		return nil, err
	}
	return h, nil
}

// Current returns the policy in force.
func (h *PolicyHolder) Current() *Policy { return h.cur.Load() }

// Path returns the policy file's path.
func (h *PolicyHolder) Path() string { return h.path }

// OnChange subscribes fn to policy changes: after each swap, fn is called
// with the old and the new policy, one change at a time, in order of
// subscription. fn must be quick and must not call Reload or Set.
func (h *PolicyHolder) OnChange(fn func(old, new *Policy)) (cancel func()) {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	sub := &subscription{fn}
	h.subs = append(h.subs, sub)
	return func() {
		h.subsMu.Lock()
		defer h.subsMu.Unlock()
		h.subs = slices.DeleteFunc(h.subs, func(s *subscription) bool { return s == sub })
	}
}

// Set puts p in force and notifies subscribers, bypassing the file (tests):
// p must come from ParsePolicy.
func (h *PolicyHolder) Set(p *Policy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.swap(p)
}

// Reload reads the policy file again and puts it in force. A policy that
// fails to read or validate is refused and the one in force stays.
func (h *PolicyHolder) Reload() error {
	_, _, err := h.reload(true)
	return err
}

// reload applies the file if it differs from the policy in force (force)
// or from the content last tried (a poll): the policy applied, if any, or
// why not, unreadable when the file could not be read.
func (h *PolicyHolder) reload(force bool) (applied *Policy, unreadable bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The file and its FileInfo from one open file, so a watcher compares
	// against what was parsed.
	f, err := os.Open(h.path)
	if err != nil {
		return nil, true, h.readError(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	var data []byte
	if err == nil {
		data, err = io.ReadAll(f)
	}
	if err != nil {
		return nil, true, h.readError(err)
	}
	h.stat = fi
	sum := sha256.Sum256(data)
	same := sum == h.applied || (!force && sum == h.lastSeen)
	h.lastSeen = sum
	if same {
		return nil, false, nil
	}
	p, err := ParsePolicy(data)
	if pe := (*PolicyError)(nil); errors.As(err, &pe) {
		pe.File = h.path
	}
	if err != nil {
		return nil, false, err
	}
	h.applied = sum
	h.swap(p)
	return p, false, nil
}

func (h *PolicyHolder) readError(err error) error {
	msg := "cannot read the file: " + unwrapPathError(err).Error()
	if errors.Is(err, fs.ErrNotExist) {
		msg += "; set LLMQ_POLICY to the path of the policy file (llmq.example.yaml is a commented example to copy)"
	}
	return &PolicyError{File: h.path, Msg: msg}
}

// swap must be called with h.mu held.
func (h *PolicyHolder) swap(p *Policy) {
	old := h.cur.Swap(p)
	h.subsMu.Lock()
	subs := slices.Clone(h.subs)
	h.subsMu.Unlock()
	for _, s := range subs {
		s.fn(old, p)
	}
}

// changed tells whether the file looks different from when it was last
// read: another file, size or time.
func (h *PolicyHolder) changed() (bool, error) {
	fi, err := os.Stat(h.path)
	if err != nil {
		return false, h.readError(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	prev := h.stat
	return prev == nil || !os.SameFile(prev, fi) || fi.Size() != prev.Size() || !fi.ModTime().Equal(prev.ModTime()), nil
}

// Watch keeps the policy current until ctx ends: it reloads on SIGHUP and
// when the file changes, and logs one line per reload. It blocks.
func (h *PolicyHolder) Watch(ctx context.Context, logger *slog.Logger) {
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	sigs := h.signals
	if sigs == nil {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGHUP)
		defer signal.Stop(ch)
		sigs = ch
	}
	tick := time.NewTicker(h.poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			h.logReload(logger, "signal", true)
		case <-tick.C:
			if changed, err := h.changed(); err != nil {
				h.logReadError(logger, err, false)
			} else if changed {
				h.logReload(logger, "file change", false)
			}
			if h.afterPoll != nil {
				h.afterPoll()
			}
		}
	}
}

func (h *PolicyHolder) logReload(logger *slog.Logger, trigger string, force bool) {
	p, unreadable, err := h.reload(force)
	if unreadable {
		h.logReadError(logger, err, force)
		return
	}
	h.logReadError(logger, nil, false)
	switch {
	case p != nil:
		logger.Info("policy reloaded", "path", h.path, "trigger", trigger, "digest", p.Digest[:12],
			"providers", len(p.Providers), "models", len(p.Models), "tiers", len(p.Tiers))
	case err != nil:
		logger.Error("policy reload refused; the current policy stays in force", "path", h.path, "trigger", trigger, "err", err.Error())
	case force:
		logger.Info("policy unchanged", "path", h.path, "trigger", trigger)
	}
}

// logReadError logs an unreadable file once per distinct error, and at
// every signal (force); nil records that the file was read.
func (h *PolicyHolder) logReadError(logger *slog.Logger, err error, force bool) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	h.mu.Lock()
	isNew := h.lastReadErr != msg
	h.lastReadErr = msg
	h.mu.Unlock()
	if err != nil && (isNew || force) {
		logger.Error("policy file unreadable; the current policy stays in force", "path", h.path, "err", msg)
	}
}
