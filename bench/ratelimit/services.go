package main

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

// workerBinary returns the worker binary to run: path when given, else one
// built now from ./cmd/worker into a temporary directory (removed by
// cleanup), so every scenario runs the code of the tree.
func workerBinary(ctx context.Context, path string) (bin string, cleanup func(), err error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", nil, fmt.Errorf("-worker: %w", err)
		}
		return path, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "llmq-bench-rl-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "worker")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/llmq/llmq/cmd/worker").CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build the worker: %w\n%s", err, out)
	}
	return bin, func() { _ = os.RemoveAll(dir) }, nil
}

// process is a worker process of a scenario.
type process struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
}

// startProcess runs bin with environ (and PATH, HOME) and waits until it
// prints ready.
func startProcess(ctx context.Context, bin string, environ []string, ready string) (*process, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(append([]string{}, environ...), "PATH="+os.Getenv("PATH"), "HOME="+os.Getenv("HOME"))
	p := &process{cmd: cmd, out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(p.out.String(), ready) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited before it was ready:\n%s", filepath.Base(bin), p.out.String())
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s not ready after a minute:\n%s", filepath.Base(bin), p.out.String())
		}
	}
	return p, nil
}

// startProcesses starts n processes of bin at once and waits until each
// is ready. It returns those it started, to stop, even when one failed.
func startProcesses(ctx context.Context, n int, bin string, environ []string, ready string) ([]*process, error) {
	procs := make([]*process, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { procs[i], errs[i] = startProcess(ctx, bin, environ, ready) })
	}
	wg.Wait()
	procs = slices.DeleteFunc(procs, func(p *process) bool { return p == nil })
	return procs, errors.Join(errs...)
}

// stopProcesses stops procs at once.
func stopProcesses(procs []*process) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// stop sends SIGTERM (the worker's graceful shutdown), then SIGKILL if it
// has not exited within 15 s.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
