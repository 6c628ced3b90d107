package batch_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/batch/batchtest"
	"github.com/llmq/llmq/internal/testutil"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", to fill the fixture in one statement

	"github.com/llmq/llmq/client"
)

// maxDispatcherRSS is what the dispatcher may hold, at its peak, while
// serving an output file.
const maxDispatcherRSS = 200 << 20

// resultLine is the start of a line of an output file: its custom_id and
// status.
var resultLine = regexp.MustCompile(`^\{"id":"batch_req_[^"]+","custom_id":"([^"]*)","response":\{"status_code":200,`)

// TestStreamingAnOutputFileKeepsTheDispatcherSmall serves the output file of
// a 12,000-line batch (about 38 MiB of results) from a real dispatcher
// process, and reads that process's resident memory from /proc: its peak
// (VmHWM, reset just before the request) grows by less than three quarters
// of the file's size while it serves it, since the file is streamed from
// Postgres a page of jobs at a time: the growth is a few pages' worth
// (10-13 MiB), whatever the file's size, where a file (or its jobs) held
// whole would take its size at least. The lines arrive in input order.
// bench/batchscale serves a 50,000-line file (157 MiB) the same way.
func TestStreamingAnOutputFileKeepsTheDispatcherSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the dispatcher and writes 38 MiB to Postgres")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to read the dispatcher's memory")
	}
	t.Parallel()
	dispatcherBin := buildDispatcher(t) // while the batch is made
	a := start(t, 0, nil)
	_, key := a.Tenant("standard")
	const n = 12_000
	b := validated(t, a, key, lines(n), nil)
	if b.RequestCounts.Total != n {
		t.Fatalf("validated batch = %+v", b)
	}
	// Every job succeeded with a 3 KB answer: written in one statement,
	// since 12,000 provider calls are not what this test is about.
	db, err := sql.Open("pgx", testutil.PlainDSN(envValue(a.Environ, "LLMQ_DATABASE_URL")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = db.ExecContext(context.Background(), `UPDATE jobs SET status = 'succeeded', response_status = 200,
		provider_request_id = 'req_' || line_no, finished_at = now(), updated_at = now(),
		response_body = jsonb_build_object('id', 'chatcmpl-' || line_no, 'object', 'chat.completion',
			'choices', jsonb_build_array(jsonb_build_object('index', 0, 'finish_reason', 'stop',
				'message', jsonb_build_object('role', 'assistant', 'content', custom_id || ' ' || repeat('lorem ipsum ', 250)))))
		WHERE batch_id = $1`, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	b = waitStatus(t, a, key, b.ID, "completed", time.Minute)
	var f client.File
	a.Do("GET", "/v1/files/"+*b.OutputFileID, key, nil).JSON(t, &f)
	if f.Bytes < 32<<20 {
		t.Fatalf("output file is %d bytes; the test wants one well above the dispatcher's growth while it streams", f.Bytes)
	}

	p := startDispatcher(t, dispatcherBin(), a.Environ)
	// The kernel resets the peak to the current size, so the peak read
	// after the request is the request's.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.cmd.Process.Pid), []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the dispatcher's peak memory: %v", err)
	}
	before := p.memory(t, "VmRSS")
	req, _ := http.NewRequest("GET", p.url+"/v1/files/"+f.ID+"/content", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("content: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var read int64
	i := 0
	for sc.Scan() {
		read += int64(len(sc.Bytes())) + 1
		id := fmt.Sprintf("req-%d", i)
		// Every line's start, and every 100th line whole, are read: parsing
		// 38 MiB of JSON under the race detector is slow.
		if m := resultLine.FindSubmatch(sc.Bytes()[:min(len(sc.Bytes()), 200)]); m == nil || string(m[1]) != id {
			t.Fatalf("line %d: %.200s, want custom_id %s answered 200", i+1, sc.Bytes(), id)
		}
		if i%100 == 0 {
			var r client.BatchResult
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.CustomID != id || r.Response == nil ||
				!strings.HasPrefix(batchtest.AnswerOf(r.Response.Body), id+" lorem ipsum") {
				t.Fatalf("line %d: %v %.200s", i+1, err, sc.Bytes())
			}
		}
		i++
	}
	if err := sc.Err(); err != nil || i != n || read != f.Bytes {
		t.Fatalf("read %d lines, %d bytes of %d (%v)", i, read, f.Bytes, err)
	}
	peak := p.memory(t, "VmHWM")
	growth := peak - before
	t.Logf("dispatcher resident memory %.1f MiB before the request, %.1f MiB at its peak while serving a %.1f MiB output file of %d lines (%.1f MiB more)",
		float64(before)/(1<<20), float64(peak)/(1<<20), float64(f.Bytes)/(1<<20), n, float64(growth)/(1<<20))
	if growth >= f.Bytes*3/4 {
		t.Errorf("dispatcher's resident memory grew by %.1f MiB serving a %.1f MiB file, want under three quarters of it",
			float64(growth)/(1<<20), float64(f.Bytes)/(1<<20))
	}
	if peak >= maxDispatcherRSS {
		t.Errorf("dispatcher peak RSS %d MiB, want under %d MiB", peak>>20, maxDispatcherRSS>>20)
	}
}

func envValue(environ []string, name string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// buildDispatcher starts building the dispatcher, and returns a function
// that waits for the build and returns the binary's path.
func buildDispatcher(t *testing.T) func() string {
	t.Helper()
	dir := t.TempDir()
	done := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "github.com/llmq/llmq/cmd/dispatcher").CombinedOutput()
		done <- err
	}()
	t.Cleanup(func() { <-done }) // before the directory is removed
	return func() string {
		t.Helper()
		err := <-done
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("build dispatcher: %v\n%s", err, out)
		}
		return filepath.Join(dir, "dispatcher")
	}
}

// dispatcher is a dispatcher process of the test.
type dispatcher struct {
	cmd *exec.Cmd
	url string
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

func startDispatcher(t *testing.T, bin string, environ []string) *dispatcher {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(append([]string{}, environ...), "LLMQ_LISTEN_ADDR=127.0.0.1:0", "PATH="+os.Getenv("PATH"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("dispatcher stderr:\n%s", stderr.String())
		}
	})
	select {
	case u := <-urls:
		return &dispatcher{cmd: cmd, url: u}
	case <-done:
		t.Fatalf("dispatcher exited before listening:\n%s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("dispatcher not listening after 30s:\n%s", stderr.String())
	}
	return nil
}

// memory is a field of the process's /proc status (VmHWM, VmRSS), in
// bytes.
func (d *dispatcher) memory(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc status", field)
	return 0
}
