package client_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
)

// sweep runs the app's batch sweeper, as a dispatcher does, until the test
// ends.
// sweep runs the batch sweeper until the test ends or stop is called.
func sweep(t *testing.T, a *apptest.App) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Batches.Run(ctx) })
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	return stop
}

// input is a batch input file of good chat lines, then lines asking for a
// model the policy lacks.
func input(good, bad int) string {
	var b strings.Builder
	for i := range good + bad {
		body := apptest.ChatBody(fmt.Sprintf("Question %d", i), fmt.Sprintf("req-%d", i), 20)
		if i >= good {
			body["model"] = "gpt-nope"
		}
		line, _ := json.Marshal(client.BatchRequest{CustomID: fmt.Sprintf("req-%d", i), Method: "POST", URL: "/v1/chat/completions", Body: mustJSON(body)})
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// results reads an output or error file.
func results(t *testing.T, c *client.Client, fileID string) []client.BatchResult {
	t.Helper()
	rc, err := c.Files.Content(ctxT(t), fileID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out []client.BatchResult
	sc := bufio.NewScanner(rc)
	for sc.Scan() {
		var r client.BatchResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFilesAndBatches(t *testing.T) {
	t.Parallel()
	a, c, _, _ := setup(t, 1)
	stopSweep := sweep(t, a)
	ctx := ctxT(t)

	content := input(4, 1)
	f, err := c.Files.Upload(ctx, "requests.jsonl", strings.NewReader(content), "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(f.ID, "file-") || f.Bytes != int64(len(content)) || f.Purpose != "batch" || f.Filename != "requests.jsonl" {
		t.Fatalf("uploaded = %+v", f)
	}
	if got, err := c.Files.Get(ctx, f.ID); err != nil || got.ID != f.ID || got.Bytes != f.Bytes {
		t.Fatalf("Files.Get = %+v, %v", got, err)
	}
	rc, err := c.Files.Content(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(stored) != content {
		t.Fatalf("content differs from the upload (%v)", err)
	}

	b, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", Metadata: map[string]string{"run": "7"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.ID, "batch_") || b.InputFileID != f.ID || b.CompletionWindow != "24h" || b.Metadata["run"] != "7" || b.Finished() {
		t.Fatalf("created = %+v", b)
	}
	var polls []client.BatchRequestCounts
	done, err := c.Batches.Wait(ctx, b.ID, &client.BatchWaitOptions{
		WaitOptions: client.WaitOptions{Interval: 50 * time.Millisecond, MaxInterval: 200 * time.Millisecond},
		OnPoll:      func(b *client.Batch) { polls = append(polls, b.RequestCounts) },
	})
	if err != nil {
		t.Fatal(err)
	}
	want := client.BatchRequestCounts{Total: 5, Completed: 4, Failed: 1}
	if done.Status != "completed" || done.RequestCounts != want || done.OutputFileID == nil || done.ErrorFileID == nil || done.CompletedAt == nil {
		t.Fatalf("finished = %+v", done)
	}
	if len(polls) == 0 || polls[len(polls)-1] != want {
		t.Fatalf("OnPoll saw %v; the last poll should be the final counts", polls)
	}

	out := results(t, c, *done.OutputFileID)
	if len(out) != 4 {
		t.Fatalf("%d output lines, want 4", len(out))
	}
	for i, r := range out {
		cid := fmt.Sprintf("req-%d", i)
		if r.CustomID != cid || r.Error != nil || r.Response == nil || r.Response.StatusCode != 200 || !strings.Contains(string(r.Response.Body), cid) {
			t.Fatalf("output line %d = %+v", i, r)
		}
	}
	errs := results(t, c, *done.ErrorFileID)
	if len(errs) != 1 || errs[0].CustomID != "req-4" || errs[0].Error == nil || !strings.Contains(errs[0].Error.Message, "gpt-nope") {
		t.Fatalf("error lines = %+v", errs)
	}
	if of, err := c.Files.Get(ctx, *done.OutputFileID); err != nil || of.Purpose != "batch_output" {
		t.Fatalf("output file = %+v, %v", of, err)
	}

	got, err := c.Batches.Get(ctx, b.ID)
	if err != nil || got.Status != "completed" {
		t.Fatalf("Batches.Get = %+v, %v", got, err)
	}
	// A finished batch cannot be cancelled.
	var apiErr *client.Error
	if _, err := c.Batches.Cancel(ctx, b.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 409 {
		t.Fatalf("cancel of a completed batch: %v", err)
	}

	// Listing: a second batch, then both, newest first, one per page. The
	// sweeper stops first, so that the second batch cannot end (and free
	// the input file) however slowly the checks below run.
	stopSweep()
	b2, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for x, err := range c.Batches.All(ctx, &client.ListParams{Limit: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, x.ID)
	}
	if len(ids) != 2 || ids[0] != b2.ID || ids[1] != b.ID {
		t.Fatalf("Batches.All = %v, want [%s %s]", ids, b2.ID, b.ID)
	}
	page, err := c.Batches.List(ctx, &client.ListParams{Limit: 1})
	if err != nil || len(page.Data) != 1 || !page.HasMore {
		t.Fatalf("Batches.List = %+v, %v", page, err)
	}

	// Files: the input and the two generated files, filtered by purpose.
	var inputs, outputs int
	for x, err := range c.Files.All(ctx, &client.FileListParams{Limit: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		switch x.Purpose {
		case "batch":
			inputs++
		case "batch_output":
			outputs++
		}
	}
	if inputs != 1 || outputs != 2 {
		t.Fatalf("files: %d inputs, %d outputs; want 1 and 2", inputs, outputs)
	}
	l, err := c.Files.List(ctx, &client.FileListParams{Purpose: "batch"})
	if err != nil || len(l.Data) != 1 || l.Data[0].ID != f.ID {
		t.Fatalf("Files.List(batch) = %+v, %v", l, err)
	}

	// A batch's input cannot be deleted; a file no batch uses can.
	if _, err := c.Files.Delete(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 409 {
		t.Fatalf("delete of a batch's input: %v", err)
	}
	spare, err := c.Files.Upload(ctx, "spare.jsonl", strings.NewReader(content), "batch")
	if err != nil {
		t.Fatal(err)
	}
	if d, err := c.Files.Delete(ctx, spare.ID); err != nil || !d.Deleted || d.ID != spare.ID {
		t.Fatalf("Files.Delete = %+v, %v", d, err)
	}
	if _, err := c.Files.Get(ctx, spare.ID); !client.IsNotFound(err) {
		t.Fatalf("deleted file: %v", err)
	}

	// Errors of the batch API are *Error too.
	if _, err := c.Batches.Get(ctx, "batch_nope"); !client.IsNotFound(err) {
		t.Fatalf("unknown batch: %v", err)
	}
	_, err = c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/nothing"})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "endpoint" {
		t.Fatalf("bad endpoint: %v", err)
	}
	_, err = c.Files.Upload(ctx, "x.jsonl", strings.NewReader("{}\n"), "fine-tune")
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "purpose" {
		t.Fatalf("bad purpose: %v", err)
	}
}

func TestBatchCancel(t *testing.T) {
	t.Parallel()
	a, c, _, _ := setup(t, 0) // no workers: the batch cannot finish
	sweep(t, a)
	ctx := ctxT(t)
	f, err := c.Files.Upload(ctx, "in.jsonl", strings.NewReader(input(3, 0)), "batch")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions"})
	if err != nil {
		t.Fatal(err)
	}
	cancelled, err := c.Batches.Cancel(ctx, b.ID)
	if err != nil || (cancelled.Status != "cancelling" && cancelled.Status != "cancelled") {
		t.Fatalf("Cancel = %+v, %v", cancelled, err)
	}
	end, err := c.Batches.Wait(ctx, b.ID, &client.BatchWaitOptions{WaitOptions: client.WaitOptions{Interval: 50 * time.Millisecond}})
	if err != nil || end.Status != "cancelled" || end.RequestCounts.Completed != 0 {
		t.Fatalf("cancelled batch = %+v, %v", end, err)
	}
}

// TestUploadLargeFile: 40 MiB of batch lines, produced as they are read,
// stored and read back intact.
func TestUploadLargeFile(t *testing.T) {
	t.Parallel()
	_, c, _, _ := setup(t, 0)
	ctx := ctxT(t)
	line := `{"custom_id":"%08d","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 900) + `"}]}}` + "\n"
	const lines = 40000
	pr, pw := io.Pipe()
	sent := sha256.New()
	written := make(chan struct{})
	go func() {
		defer close(written)
		for i := range lines {
			l := fmt.Sprintf(line, i)
			sent.Write([]byte(l))
			if _, err := io.WriteString(pw, l); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.Close()
	}()
	f, err := c.Files.Upload(ctx, "big.jsonl", pr, "batch")
	if err != nil {
		t.Fatal(err)
	}
	size := int64(lines * (len(line) - 4 + 8))
	if f.Bytes != size {
		t.Fatalf("stored %d bytes, want %d", f.Bytes, size)
	}
	rc, err := c.Files.Content(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := sha256.New()
	n, err := io.Copy(got, rc)
	<-written
	if err != nil || n != size || string(got.Sum(nil)) != string(sent.Sum(nil)) {
		t.Fatalf("read back %d bytes (%v), different from the upload", n, err)
	}
}
