package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
)

// TestOpenAINodeSDK runs test/node/batch.mjs, the official OpenAI Node SDK
// (npm "openai", pinned in test/node/package-lock.json), against a running
// llmq: upload, batch, poll, output and error files, paging, cancel and
// error classes. It is what proves the Batch API wire-compatible with the
// SDKs, so a machine without Node fails it, with what to install.
func TestOpenAINodeSDK(t *testing.T) {
	t.Parallel()
	// The real binaries: a dispatcher (API and batch sweeper) and a worker.
	// Answers take 100ms: the 200 requests of the batch the script cancels
	// need a second on the worker's 20 slots, so the cancel finds it running.
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 30000, TPM: 3000000}, DefaultMaxTokens: 1024, Echo: true, Latency: 100 * time.Millisecond,
	}})
	d := startProcess(t, a, "dispatcher", "LLMQ_LISTEN_ADDR=127.0.0.1:0")
	d.waitForOutput(t, "listening")
	m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("no URL in the dispatcher's output:\n%s", d.out.String())
	}
	startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=20").waitForOutput(t, "worker running")
	_, key := a.Tenant("standard")
	t.Logf("%s", runNodeScript(t, 5*time.Minute, "batch.mjs", m[1]+"/v1", key))
}

// runNodeScript runs a script of test/node (installing its locked SDKs
// first) against llmq at baseURL (ending in /v1) with a tenant's key, and
// extra environment ("NAME=value"), and returns what it printed; a script
// that fails fails the test with its output.
func runNodeScript(t *testing.T, timeout time.Duration, script, baseURL, key string, extra ...string) string {
	t.Helper()
	node, npm := lookNode(t)
	dir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	installNodeSDK(ctx, t, npm, dir)
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "LLMQ_BASE_URL=" + baseURL, "LLMQ_API_KEY=" + key}, extra...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, out)
	}
	return string(out)
}

// nodeInstall runs npm ci once per test process, for the tests that share
// test/node.
var nodeInstall sync.Mutex

// installNodeSDK installs the locked SDK versions (the OpenAI SDK, the
// Vercel AI SDK and its OpenAI provider) into dir on a clean clone.
func installNodeSDK(ctx context.Context, t *testing.T, npm, dir string) {
	t.Helper()
	nodeInstall.Lock()
	defer nodeInstall.Unlock()
	installed := true
	for _, pkg := range []string{"openai", "ai", "@ai-sdk/openai"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			installed = false
		}
	}
	if installed {
		return
	}
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in test/node: %v\n%s", err, out)
	}
}

// lookNode finds node and npm, or fails the test saying what to install.
func lookNode(t *testing.T) (node, npm string) {
	t.Helper()
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if errNode != nil || errNpm != nil {
		t.Fatal("the OpenAI SDK test needs Node.js (20 or newer) and npm on PATH: scripts/test gets them (apt-get install nodejs npm; Node.js 20 from the npm registry into .llmq-local/node when apt's is older)")
	}
	return node, npm
}
