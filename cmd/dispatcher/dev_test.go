package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/testutil"
)

// bareEnviron is this process's environment without any LLMQ_* or TEST_*
// variable: what a newcomer's shell has.
func bareEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LLMQ_") && !strings.HasPrefix(kv, "TEST_") {
			out = append(out, kv)
		}
	}
	return out
}

// devRun is one run of `dispatcher dev`.
type devRun struct {
	out, errOut testutil.SyncBuffer
	cancel      context.CancelFunc
	done        chan error
}

func startDev(t *testing.T, dir, addr string, extra ...string) *devRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &devRun{cancel: cancel, done: make(chan error, 1)}
	args := append([]string{"dev", "-dir", dir, "-addr", addr}, extra...)
	go func() { d.done <- run(ctx, args, bareEnviron(), &d.out, &d.errOut) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(d.out.String(), "Ctrl-C stops llmq") {
		select {
		case err := <-d.done:
			t.Fatalf("dev exited before it was ready: %v\n%s\n%s", err, d.out.String(), d.errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev did not print its banner within 30s:\n%s\n%s", d.out.String(), d.errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d
}

func (d *devRun) stop(t *testing.T) {
	t.Helper()
	d.cancel()
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("dev: %v\n%s", err, d.errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dev did not stop within 30s")
	}
}

var (
	keyLine  = regexp.MustCompile(`(?m)^\s+key:\s+(llmq_\S+)$`)
	curlPost = regexp.MustCompile(`(?m)^\s+(curl -s -X POST \S+/v1/jobs .*)$`)
)

func getJob(t *testing.T, base, key, id string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/jobs/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var j map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		t.Fatal(err)
	}
	return j
}

// TestDevRunsOnABareMachine: with no LLMQ_* variable set, `dispatcher dev`
// starts with an embedded Redis, SQLite and the simulated provider; the
// curl line it prints enqueues a job that succeeds within 30 s; after a
// restart the job, the key and unfinished jobs are all still there.
func TestDevRunsOnABareMachine(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is not installed (apt-get install curl): the test runs the printed curl line")
	}
	dir := t.TempDir() + "/llmq-dev"
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	base := "http://" + addr

	d := startDev(t, dir, addr)
	key := keyLine.FindStringSubmatch(d.out.String())
	curl := curlPost.FindStringSubmatch(d.out.String())
	if key == nil || curl == nil {
		t.Fatalf("the banner lacks the key or the curl line:\n%s", d.out.String())
	}
	out, err := exec.Command("sh", "-c", curl[1]).CombinedOutput()
	if err != nil {
		t.Fatalf("the printed curl line failed: %v\n%s", err, out)
	}
	var created map[string]any
	if err := json.Unmarshal(out, &created); err != nil || created["status"] != "queued" {
		t.Fatalf("the printed curl line answered %s", out)
	}
	id := created["id"].(string)
	deadline := time.Now().Add(30 * time.Second)
	for getJob(t, base, key[1], id)["status"] != "succeeded" {
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not succeed within 30s: %v", id, getJob(t, base, key[1], id))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Leave work unfinished: the simulator takes 0.3–1 s a call.
	var pending []string
	for i := 0; i < 5; i++ {
		out, err := exec.Command("sh", "-c", curl[1]).CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		var j map[string]any
		if err := json.Unmarshal(out, &j); err != nil {
			t.Fatal(err)
		}
		pending = append(pending, j["id"].(string))
	}
	d.stop(t)

	d = startDev(t, dir, addr)
	defer d.stop(t)
	if again := keyLine.FindStringSubmatch(d.out.String()); again == nil || again[1] != key[1] {
		t.Fatalf("the restart printed another key: %v", again)
	}
	if j := getJob(t, base, key[1], id); j["status"] != "succeeded" || j["response"] == nil {
		t.Fatalf("after the restart the job is %v", j)
	}
	// The fresh embedded Redis lost the unfinished jobs' tasks; the
	// reconciler enqueues them again from SQLite.
	for _, p := range pending {
		for getJob(t, base, key[1], p)["status"] != "succeeded" {
			if time.Now().After(deadline.Add(30 * time.Second)) {
				t.Fatalf("unfinished job %s did not run after the restart: %v", p, getJob(t, base, key[1], p))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
