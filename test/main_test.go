// Package integration runs llmq end to end: the real worker (and dispatcher)
// binaries as separate processes, against real Redis, real Postgres and the
// simulated provider, with many concurrent producers.
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/testutil"
)

const redisDB = 7

// bin holds the binaries built once for the package.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "llmq-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "github.com/llmq/llmq/cmd/worker", "github.com/llmq/llmq/cmd/dispatcher").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build llmq binaries: %v\n%s", err, out)
		os.Exit(1)
	}
	bin = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// process is an llmq binary running for one test.
type process struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
}

// startProcess runs the named binary with the test app's environment plus
// extra variables; it is stopped (SIGTERM, then SIGKILL) when the test ends.
func startProcess(t *testing.T, a *apptest.App, name string, extra ...string) *process {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, name))
	cmd.Env = append(append(append([]string{}, a.Environ...), "PATH="+os.Getenv("PATH")), extra...)
	p := &process{cmd: cmd, out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.signal(syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

func (p *process) signal(s syscall.Signal) { _ = p.cmd.Process.Signal(s) }

// waitForOutput waits until the process prints s.
func (p *process) waitForOutput(t *testing.T, s string) {
	t.Helper()
	eventually(t, 30*time.Second, func() bool {
		select {
		case <-p.done:
			t.Fatalf("process exited before printing %q:\n%s", s, p.out.String())
		default:
		}
		return strings.Contains(p.out.String(), s)
	}, "process prints %q", s)
}

// eventually polls cond until it holds or timeout passes. Tests use it to
// wait for work done by other processes, which send no signal they could
// wait on.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
