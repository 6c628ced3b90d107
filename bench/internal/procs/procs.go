// Package procs runs the llmq processes of a benchmark: the worker (or
// dispatcher) binary built from the tree, started and stopped as the system
// would.
package procs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmq/llmq/internal/testutil"
)

// WorkerBinary returns the worker binary to run: path when given, else one
// built now from ./cmd/worker into a temporary directory (removed by
// cleanup), so every scenario runs the code of the tree.
func WorkerBinary(ctx context.Context, path string) (bin string, cleanup func(), err error) {
	return Binary(ctx, path, "worker", "-worker")
}

// Binary returns the binary of command name (a directory of ./cmd) to run:
// path when given (flag names the option that gave it), else one built now
// from ./cmd/name into a temporary directory (removed by cleanup), so every
// scenario runs the code of the tree. Callers at the same time share one
// build (a test's runs side by side): its directory goes with the last
// cleanup.
func Binary(ctx context.Context, path, name, flag string) (bin string, cleanup func(), err error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", nil, fmt.Errorf("%s: %w", flag, err)
		}
		return path, func() {}, nil
	}
	builds.Lock()
	b := builds.m[name]
	if b == nil {
		b = &build{}
		builds.m[name] = b
	}
	b.users++
	builds.Unlock()
	release := func() {
		builds.Lock()
		defer builds.Unlock()
		if b.users--; b.users == 0 {
			delete(builds.m, name)
			if b.dir != "" {
				_ = os.RemoveAll(b.dir)
			}
		}
	}
	b.once.Do(func() { b.bin, b.dir, b.err = buildCommand(ctx, name) })
	if b.err != nil {
		release()
		return "", nil, b.err
	}
	return b.bin, sync.OnceFunc(release), nil
}

// builds are the binaries built and still in use, by command name.
var builds = struct {
	sync.Mutex
	m map[string]*build
}{m: map[string]*build{}}

// build is a binary built once for the callers of Binary that share it.
type build struct {
	once     sync.Once
	bin, dir string
	err      error
	users    int // guarded by builds
}

// buildCommand builds ./cmd/name into a temporary directory. It builds in
// llmq's own module, where the benchmarks' module replaces it, so the binary
// is built as the product is, with the product's go.mod.
func buildCommand(ctx context.Context, name string) (bin, dir string, err error) {
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/llmq/llmq").Output()
	if err != nil {
		return "", "", fmt.Errorf("find llmq's module: %w", err)
	}
	dir, err = os.MkdirTemp("", "llmq-bench-")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, name)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/"+name)
	build.Dir = strings.TrimSpace(string(root))
	out, err := build.CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", "", fmt.Errorf("build the %s: %w\n%s", name, err, out)
	}
	return bin, dir, nil
}

// Process is a running process of a benchmark.
type Process struct {
	cmd  *exec.Cmd
	Out  *testutil.SyncBuffer // what it printed
	done chan struct{}
}

// Start runs bin with environ (and PATH, HOME) and waits until it
// prints ready.
func Start(ctx context.Context, bin string, environ []string, ready string) (*Process, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(append([]string{}, environ...), "PATH="+os.Getenv("PATH"), "HOME="+os.Getenv("HOME"))
	p := &Process{cmd: cmd, Out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(p.Out.String(), ready) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited before it was ready:\n%s", filepath.Base(bin), p.Out.String())
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s not ready after a minute:\n%s", filepath.Base(bin), p.Out.String())
		}
	}
	return p, nil
}

// StartN starts n processes of bin at once and waits until each
// is ready. It returns those it started, to stop, even when one failed.
func StartN(ctx context.Context, n int, bin string, environ []string, ready string) ([]*Process, error) {
	procs := make([]*Process, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { procs[i], errs[i] = Start(ctx, bin, environ, ready) })
	}
	wg.Wait()
	procs = slices.DeleteFunc(procs, func(p *Process) bool { return p == nil })
	return procs, errors.Join(errs...)
}

// StopAll stops procs at once.
func StopAll(procs []*Process) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.Stop)
	}
	wg.Wait()
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM (the worker's graceful shutdown), then SIGKILL if it
// has not exited within 15 s.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
