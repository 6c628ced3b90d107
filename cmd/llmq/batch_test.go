package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
)

// sweep runs the test app's batch sweeper, as a dispatcher does.
func (e *env) sweep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { e.app.Batches.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestSubmitBatchWait: the command, llmq submit FILE --wait --out:
// upload, batch, a progress bar to the end, the output and error files
// written, and exit 3 because one request failed.
func TestSubmitBatchWait(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.sweep(t)
	in := batchInput(t, 6, 4)
	dir := t.TempDir()
	out, errs := filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "errors.jsonl")

	r := e.run(t, "submit", in, "--wait", "--out", out, "--errors", errs, "--poll", "50ms")
	if r.code() != exitIncomplete || message(r.err) != "1 of 6 requests failed (see "+errs+")" {
		t.Fatalf("submit --wait: %v", r)
	}
	batchID := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(batchID, "batch_") {
		t.Fatalf("stdout %q: want the batch id", r.stdout)
	}
	for _, want := range []string{
		"uploaded requests.jsonl as file-",
		"done 5, failed 1", "(6/6)", "100%",
		"batch " + batchID + " completed: 5 done, 1 failed of 6",
		"wrote results to " + out, "wrote errors to " + errs,
		"'gpt-nope'", // why line 5 was refused
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "line 5: Line 5") {
		t.Errorf("the line number is said twice:\n%s", r.stderr)
	}
	results := readResults(t, out)
	if len(results) != 5 {
		t.Fatalf("%d results, want 5", len(results))
	}
	for _, res := range results {
		if res.Error != nil || res.Response == nil || res.Response.StatusCode != 200 || !strings.Contains(string(res.Response.Body), res.CustomID) {
			t.Fatalf("result %+v", res)
		}
	}
	failed := readResults(t, errs)
	if len(failed) != 1 || failed[0].CustomID != "req-4" || failed[0].Error == nil {
		t.Fatalf("errors %+v", failed)
	}

	// The batch shows in the list and in full.
	r = e.ok(t, "batches")
	if !strings.Contains(r.stdout, batchID+"  completed  5     1       6") {
		t.Fatalf("batches:\n%s", r.stdout)
	}
	b := decode[client.Batch](t, e.ok(t, "batches", "get", batchID).stdout)
	if b.Status != "completed" || b.RequestCounts.Total != 6 || b.OutputFileID == nil {
		t.Fatalf("batches get: %+v", b)
	}
	if r := e.run(t, "batches", "cancel", batchID); r.code() != exitFailed || !strings.Contains(message(r.err), "409") {
		t.Fatalf("cancel a completed batch: %v", r)
	}

	// The output file through files content, to stdout and to a file.
	want, _ := os.ReadFile(out)
	if r := e.ok(t, "files", "content", *b.OutputFileID); r.stdout != string(want) {
		t.Fatalf("files content differs from --out:\n%s", r.stdout)
	}
	copyPath := filepath.Join(dir, "copy.jsonl")
	e.ok(t, "files", "content", *b.OutputFileID, "--out", copyPath)
	if got, _ := os.ReadFile(copyPath); string(got) != string(want) {
		t.Fatal("files content --out differs")
	}
}

// TestSubmitBatchStdin: the input from a pipe, the results to stdout, no
// bar; without --wait only the batch id.
func TestSubmitBatchStdin(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.sweep(t)
	data, err := os.ReadFile(batchInput(t, 3))
	if err != nil {
		t.Fatal(err)
	}
	r := runWith(t, e.environ, "\n"+string(data), "submit", "-", "--out", "-", "--quiet", "--poll", "50ms", "--metadata", "run=7")
	if r.err != nil {
		t.Fatalf("submit - --out -: %v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], `"custom_id":"req-`) || strings.Contains(r.stderr, "%") {
		t.Fatalf("results on stdout: %v", r)
	}
	batchID := strings.Fields(r.stderr[strings.Index(r.stderr, "batch batch_"):])[1]
	if b := decode[client.Batch](t, e.ok(t, "batches", "get", batchID).stdout); b.Metadata["run"] != "7" {
		t.Fatalf("metadata: %+v", b.Metadata)
	}

	r = e.ok(t, "submit", batchInput(t, 2))
	if !strings.HasPrefix(r.stdout, "batch_") || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stderr, "llmq batches get") {
		t.Fatalf("submit without --wait: %v", r)
	}
	if r := runWith(t, e.environ, "", "submit", "-"); r.code() != exitFailed || !strings.Contains(message(r.err), "empty") {
		t.Fatalf("empty input: %v", r)
	}
}

// TestSubmitInterrupted: Ctrl-C while waiting leaves the batch running and
// says how to follow it.
func TestSubmitInterrupted(t *testing.T) {
	t.Parallel()
	e := setup(t, 0) // no workers: the batch never ends
	e.sweep(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	var out, errOut strings.Builder
	err := run(ctx, []string{"submit", batchInput(t, 2), "--wait", "--poll", "50ms"}, e.environ, strings.NewReader(""), &out, &errOut)
	if exitCode(err) != exitInterrupted || message(err) != "interrupted" || !strings.Contains(errOut.String(), "runs on: llmq batches get batch_") {
		t.Fatalf("interrupted: %v, %s", err, errOut.String())
	}
	batchID := strings.TrimSpace(out.String())
	if r := e.ok(t, "batches", "cancel", batchID); r.stdout != batchID+" cancelling\n" && r.stdout != batchID+" cancelled\n" {
		t.Fatalf("batches cancel: %v", r)
	}
}

func TestFilesCommands(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	in := batchInput(t, 2)
	r := e.ok(t, "files", "upload", in)
	id := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(id, "file-") {
		t.Fatalf("files upload: %v", r)
	}
	f := decode[client.File](t, e.ok(t, "files", "get", id).stdout)
	data, _ := os.ReadFile(in)
	if f.Bytes != int64(len(data)) || f.Filename != "requests.jsonl" || f.Purpose != "batch" {
		t.Fatalf("files get: %+v", f)
	}
	if r := e.ok(t, "files", "content", id); r.stdout != string(data) {
		t.Fatalf("files content:\n%s", r.stdout)
	}
	r = e.ok(t, "files", "list", "--purpose", "batch")
	if !strings.Contains(r.stdout, id+"  batch") || !strings.Contains(r.stdout, "requests.jsonl") {
		t.Fatalf("files list:\n%s", r.stdout)
	}
	if r := e.run(t, "files", "upload", filepath.Join(t.TempDir(), "none.jsonl")); r.code() != exitFailed || !strings.Contains(message(r.err), "no such file") {
		t.Fatalf("missing file: %v", r)
	}
	if r := e.run(t, "files", "get", "file-nope"); !strings.Contains(message(r.err), "404") {
		t.Fatalf("unknown file: %v", r)
	}
	if r := e.ok(t, "files", "delete", id); r.stdout != id+" deleted\n" {
		t.Fatalf("files delete: %v", r)
	}
	if r := e.run(t, "files", "get", id); !strings.Contains(message(r.err), "404") {
		t.Fatalf("deleted file: %v", r)
	}
}

// A row holding control or invisible formatting characters (a tenant name
// stored before the API refused them) is printed with them written out;
// the table's tabs stay.
func TestPrintableRows(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"ten_1\tacme\r\nX\tstandard": `ten_1` + "\t" + `acme\u000d\u000aX` + "\t" + `standard`,
		"evil\x1b[31m":               `evil\u001b[31m`,
		"file\u202egnp.exe":          `file\u202egnp.exe`,
		"café\t€":                    "café\t€",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}
