package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// wait bounds every wait on a channel; a test that needs it has failed.
const wait = 10 * time.Second

// policyWithRPS is basePolicy with the standard tier's api_rps set to rps, a
// cheap way to tell versions apart.
func policyWithRPS(t *testing.T, rps int) string {
	return edit(t, "api_rps: 50", fmt.Sprintf("api_rps: %d", rps))
}

func standardRPS(p *Policy) int {
	tr, _ := p.Tier("standard")
	return int(tr.APILimits.Second)
}

// writePolicy replaces the file by renaming a new one over it, as editors
// and ConfigMap updates do.
func writePolicy(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type change struct{ old, new *Policy }

// setup writes a valid policy (api_rps 50) and returns a holder for it with
// its changes delivered on a channel.
func setup(t *testing.T, opts *HolderOptions) (string, *PolicyHolder, <-chan change) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	writePolicy(t, path, policyWithRPS(t, 50))
	h, err := NewPolicyHolder(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	changes := make(chan change, 16)
	h.OnChange(func(old, new *Policy) { changes <- change{old, new} })
	return path, h, changes
}

func waitChange(t *testing.T, changes <-chan change) change {
	t.Helper()
	select {
	case c := <-changes:
		return c
	case <-time.After(wait):
		t.Fatal("no policy change")
		return change{}
	}
}

func noChange(t *testing.T, changes <-chan change) {
	t.Helper()
	select {
	case c := <-changes:
		t.Fatalf("unexpected policy change to api_rps %d", standardRPS(c.new))
	default:
	}
}

// logRecords is a slog handler that delivers records on a channel.
type logRecords chan slog.Record

func (c logRecords) Enabled(context.Context, slog.Level) bool      { return true }
func (c logRecords) Handle(_ context.Context, r slog.Record) error { c <- r; return nil }
func (c logRecords) WithAttrs([]slog.Attr) slog.Handler            { return c }
func (c logRecords) WithGroup(string) slog.Handler                 { return c }

func attrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	return m
}

func waitLog(t *testing.T, logs logRecords) slog.Record {
	t.Helper()
	select {
	case r := <-logs:
		return r
	case <-time.After(wait):
		t.Fatal("no log record")
		return slog.Record{}
	}
}

func noLog(t *testing.T, logs logRecords) {
	t.Helper()
	select {
	case r := <-logs:
		t.Fatalf("unexpected log %q %v", r.Message, attrs(r))
	default:
	}
}

// watch runs h.Watch until the test ends and returns its log records.
func watch(t *testing.T, h *PolicyHolder) logRecords {
	t.Helper()
	logs := make(logRecords, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Watch(ctx, slog.New(logs))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(wait):
			t.Error("Watch did not return after its context ended")
		}
	})
	return logs
}

func TestNewPolicyHolderRefusesInvalid(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "llmq.yaml")
	writePolicy(t, path, edit(t, "priority: default", "priority: urgent"))
	_, err := NewPolicyHolder(path, nil)
	var pe *PolicyError
	if !errors.As(err, &pe) || pe.File != path || pe.Field != "tiers[0].priority" {
		t.Errorf("invalid policy: error = %v", err)
	}
	_, err = NewPolicyHolder(filepath.Join(dir, "missing.yaml"), nil)
	if err == nil || !strings.Contains(err.Error(), "cannot read the file") {
		t.Errorf("missing file: error = %v", err)
	}
}

func TestPolicyHolderReload(t *testing.T) {
	t.Parallel()
	path, h, changes := setup(t, nil)
	first := h.Current()
	if standardRPS(first) != 50 || h.Path() != path {
		t.Fatalf("initial policy: api_rps %d, path %q", standardRPS(first), h.Path())
	}

	writePolicy(t, path, policyWithRPS(t, 60))
	if err := h.Reload(); err != nil {
		t.Fatal(err)
	}
	c := waitChange(t, changes)
	if c.old != first || c.new != h.Current() || standardRPS(c.new) != 60 {
		t.Errorf("change old %d new %d, current %d", standardRPS(c.old), standardRPS(c.new), standardRPS(h.Current()))
	}

	// The same content again changes nothing and tells nobody.
	if err := h.Reload(); err != nil {
		t.Fatal(err)
	}
	noChange(t, changes)
}

// TestPolicyHolderReloadRefused: a policy that fails validation never
// replaces the one in force, however often it is offered.
func TestPolicyHolderReloadRefused(t *testing.T) {
	t.Parallel()
	path, h, changes := setup(t, nil)
	before := h.Current()

	writePolicy(t, path, edit(t, "{rps: 5}", "{rps: -5}"))
	for range 2 {
		err := h.Reload()
		var pe *PolicyError
		if !errors.As(err, &pe) || pe.Field != "models[1].limits.rps" || pe.File != path {
			t.Fatalf("Reload error = %v, want one naming models[1].limits.rps in %s", err, path)
		}
		if h.Current() != before {
			t.Fatal("a refused policy replaced the one in force")
		}
	}
	noChange(t, changes)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := h.Reload(); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("Reload of a missing file: error = %v", err)
	}
	if h.Current() != before {
		t.Fatal("a missing file replaced the policy in force")
	}

	writePolicy(t, path, policyWithRPS(t, 70))
	if err := h.Reload(); err != nil {
		t.Fatal(err)
	}
	if c := waitChange(t, changes); c.old != before || standardRPS(c.new) != 70 {
		t.Errorf("recovery: old %d new %d", standardRPS(c.old), standardRPS(c.new))
	}
}

func TestPolicyHolderWatchFileChange(t *testing.T) {
	t.Parallel()
	polls := make(chan struct{}, 1)
	path, h, changes := setup(t, &HolderOptions{PollInterval: time.Millisecond, Signals: make(chan os.Signal)})
	h.afterPoll = func() {
		select {
		case polls <- struct{}{}:
		default:
		}
	}
	waitPolls := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-polls:
			case <-time.After(wait):
				t.Fatal("no poll")
			}
		}
	}
	logs := watch(t, h)

	// An in-place edit is seen by its size and modification time.
	if err := os.WriteFile(path, []byte(policyWithRPS(t, 123)), 0o600); err != nil {
		t.Fatal(err)
	}
	if c := waitChange(t, changes); standardRPS(c.new) != 123 || standardRPS(c.old) != 50 {
		t.Errorf("change old %d new %d", standardRPS(c.old), standardRPS(c.new))
	}
	r := waitLog(t, logs)
	if a := attrs(r); r.Level != slog.LevelInfo || r.Message != "policy reloaded" || a["trigger"] != "file change" || a["path"] != path || a["tiers"] != "2" {
		t.Errorf("log %s %q %v", r.Level, r.Message, a)
	}

	// An invalid version is refused once, logged once, and stays refused
	// while the file does not change, even if it is touched.
	writePolicy(t, path, edit(t, "on_exhausted: defer", "on_exhausted: queue"))
	r = waitLog(t, logs)
	if a := attrs(r); r.Level != slog.LevelError || !strings.Contains(r.Message, "refused") ||
		!strings.Contains(a["err"], "tiers[0].on_exhausted") || a["trigger"] != "file change" {
		t.Errorf("log %s %q %v", r.Level, r.Message, a)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	waitPolls(3)
	noLog(t, logs)
	noChange(t, changes)
	if standardRPS(h.Current()) != 123 {
		t.Errorf("current api_rps %d after a refused change, want 123", standardRPS(h.Current()))
	}

	// A file that disappears is logged once; its return applies it.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	r = waitLog(t, logs)
	if r.Level != slog.LevelError || !strings.Contains(r.Message, "unreadable") || !strings.Contains(attrs(r)["err"], "no such file") {
		t.Errorf("log %s %q %v", r.Level, r.Message, attrs(r))
	}
	waitPolls(3)
	noLog(t, logs)

	writePolicy(t, path, policyWithRPS(t, 7))
	if c := waitChange(t, changes); standardRPS(c.new) != 7 || standardRPS(c.old) != 123 {
		t.Errorf("change old %d new %d", standardRPS(c.old), standardRPS(c.new))
	}
	if r := waitLog(t, logs); r.Message != "policy reloaded" {
		t.Errorf("log %q %v", r.Message, attrs(r))
	}
}

func TestPolicyHolderWatchSignal(t *testing.T) {
	t.Parallel()
	sigs := make(chan os.Signal)
	// A poll interval far beyond the test: only the signal can reload.
	path, h, changes := setup(t, &HolderOptions{PollInterval: time.Hour, Signals: sigs})
	logs := watch(t, h)
	send := func() {
		t.Helper()
		select {
		case sigs <- os.Interrupt:
		case <-time.After(wait):
			t.Fatal("Watch does not take signals")
		}
	}

	writePolicy(t, path, policyWithRPS(t, 99))
	send()
	if c := waitChange(t, changes); standardRPS(c.new) != 99 {
		t.Errorf("new api_rps %d, want 99", standardRPS(c.new))
	}
	if r := waitLog(t, logs); r.Message != "policy reloaded" || attrs(r)["trigger"] != "signal" {
		t.Errorf("log %q %v", r.Message, attrs(r))
	}

	// A signal is always answered, even when there is nothing to do.
	send()
	if r := waitLog(t, logs); r.Level != slog.LevelInfo || r.Message != "policy unchanged" {
		t.Errorf("log %s %q", r.Level, r.Message)
	}

	writePolicy(t, path, edit(t, "base_url: https://api.openai.com/v1", "base_url: api.openai.com"))
	for range 2 { // refused again on every signal, not only the first
		send()
		r := waitLog(t, logs)
		if r.Level != slog.LevelError || !strings.Contains(attrs(r)["err"], "providers[0].base_url") {
			t.Errorf("log %s %q %v", r.Level, r.Message, attrs(r))
		}
	}
	noChange(t, changes)
	if standardRPS(h.Current()) != 99 {
		t.Error("a refused policy replaced the one in force")
	}
}

func TestPolicyHolderOnChange(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	writePolicy(t, path, policyWithRPS(t, 1))
	h, err := NewPolicyHolder(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	p2 := mustParse(t, policyWithRPS(t, 2))
	p3 := mustParse(t, policyWithRPS(t, 3))

	var mu sync.Mutex
	var calls []string
	record := func(name string) func(old, new *Policy) {
		return func(old, new *Policy) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, fmt.Sprintf("%s:%d->%d", name, standardRPS(old), standardRPS(new)))
		}
	}
	h.OnChange(record("a"))
	cancelB := h.OnChange(record("b"))
	h.OnChange(record("c"))

	h.Set(p2)
	cancelB()
	cancelB() // twice is harmless
	h.Set(p3)

	want := "a:1->2 b:1->2 c:1->2 a:2->3 c:2->3"
	if got := strings.Join(calls, " "); got != want {
		t.Errorf("calls = %s\nwant    %s", got, want)
	}
	if h.Current() != p3 {
		t.Error("Set did not put the policy in force")
	}
}

// TestPolicyHolderConcurrent runs readers against reloads; its value is
// under -race.
func TestPolicyHolderConcurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	writePolicy(t, path, policyWithRPS(t, 50))
	h, err := NewPolicyHolder(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var notified int
	h.OnChange(func(_, _ *Policy) { notified++ }) // calls never overlap, so no lock
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if p := h.Current(); p == nil || len(p.Tiers) != 2 {
					t.Error("reader saw no policy or a partial one")
					return
				}
			}
		})
	}
	for i := range 20 {
		writePolicy(t, path, policyWithRPS(t, 100+i))
		if err := h.Reload(); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	if standardRPS(h.Current()) != 119 || notified != 20 {
		t.Errorf("final api_rps %d after %d changes, want 119 after 20", standardRPS(h.Current()), notified)
	}
}
