package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/llmq/llmq/bench/internal/checks"
	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/batch/batchtest"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// runInvalid runs the invalid scenario: a batch with invalid lines of every
// kind, end to end, and checks its counts and files.
func runInvalid(ctx context.Context, o *options, logger *slog.Logger, out io.Writer, c *checks.List) error {
	s, err := openStack(ctx, o, o.Concurrency, logger)
	if err != nil {
		return err
	}
	defer s.close()
	tenantID, _, cl, err := s.tenant(ctx, "bench-invalid")
	if err != nil {
		return err
	}
	input, valid, refused, codes := batchtest.MixedInput(o.Lines, o.InvalidPer100)
	start := time.Now()
	f, err := cl.Files.Upload(ctx, "input.jsonl", bytes.NewReader(input), "batch")
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	uploaded := time.Since(start)
	b, err := cl.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions",
		Metadata: map[string]string{"run": "batchscale"}})
	if err != nil {
		return fmt.Errorf("create the batch: %w", err)
	}
	b, validatedAt, err := wait(ctx, o, cl, b.ID, func(*client.Batch) bool { return false })
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	validated := validatedAt.Sub(start)
	fmt.Fprintf(out, "invalid: %d lines (%d invalid, %.1f MiB): uploaded in %v, validated (in_progress) at %v, %s at %v: %.0f lines/s from upload to end\n",
		o.Lines, len(refused), mib(int64(len(input))), uploaded.Round(time.Millisecond), validated.Round(time.Millisecond), b.Status,
		elapsed.Round(time.Millisecond), float64(o.Lines)/elapsed.Seconds())

	const p = "invalid: "
	c.Add(p+"the batch completed", b.Status == "completed" && b.OutputFileID != nil && b.InProgressAt != nil && b.FinalizingAt != nil &&
		b.CompletedAt != nil && b.Metadata["run"] == "batchscale" && (len(refused) == 0) == (b.ErrorFileID == nil),
		"status %s, output file %v, error file %v, in_progress_at %v, finalizing_at %v, completed_at %v",
		b.Status, b.OutputFileID != nil, b.ErrorFileID != nil, b.InProgressAt != nil, b.FinalizingAt != nil, b.CompletedAt != nil)
	want := client.BatchRequestCounts{Total: int64(o.Lines), Completed: int64(len(valid)), Failed: int64(len(refused))}
	c.Add(p+"exact counts", b.RequestCounts == want, "%+v, want %+v", b.RequestCounts, want)
	c.Add(p+"the errors list the first 100 refusals and count the rest", errorsListed(b.Errors, refused, codes), "%s", describeErrors(b.Errors))

	var outLines, outBad int
	var outFirstBad string
	var outBytes int64
	if b.OutputFileID != nil {
		outBytes, err = readResults(ctx, cl, *b.OutputFileID, func(r *client.BatchResult) {
			i := outLines
			outLines++
			ok := i < len(valid) && r.CustomID == valid[i] && r.Error == nil && r.Response != nil && r.Response.StatusCode == 200 &&
				strings.HasPrefix(r.ID, "batch_req_") && r.Response.RequestID != "" && strings.HasPrefix(batchtest.AnswerOf(r.Response.Body), valid[i])
			if !ok {
				if outBad == 0 {
					outFirstBad = fmt.Sprintf("; first: line %d, %.300s", i+1, fmt.Sprintf("%+v", r))
				}
				outBad++
			}
		})
		if err != nil {
			return fmt.Errorf("output file: %w", err)
		}
	}
	c.Add(p+"the output file: every valid line once, in input order, answered 200 with its own request's answer",
		outLines == len(valid) && outBad == 0, "%d lines of %d valid, %d not as they should be%s", outLines, len(valid), outBad, outFirstBad)

	var errLines, errBad int
	var errFirstBad string
	var errBytes int64
	if b.ErrorFileID != nil {
		errBytes, err = readResults(ctx, cl, *b.ErrorFileID, func(r *client.BatchResult) {
			i := errLines
			errLines++
			ok := i < len(refused) && r.Error != nil && r.Response == nil && r.Error.Line == refused[i] && r.Error.Code == codes[i] &&
				strings.HasPrefix(r.Error.Message, fmt.Sprintf("Line %d: ", refused[i]))
			if !ok {
				if errBad == 0 {
					errFirstBad = fmt.Sprintf("; first: line %d, %+v", i+1, r.Error)
				}
				errBad++
			}
		})
		if err != nil {
			return fmt.Errorf("error file: %w", err)
		}
	}
	c.Add(p+"the error file: every refused line, in order, with its line number and reason",
		errLines == len(refused) && errBad == 0, "%d lines of %d refused, %d not as they should be%s", errLines, len(refused), errBad, errFirstBad)

	sizesOK, sizes := true, ""
	for _, f := range []struct {
		id    *string
		bytes int64
	}{{b.OutputFileID, outBytes}, {b.ErrorFileID, errBytes}} {
		if f.id == nil {
			continue
		}
		fo, err := cl.Files.Get(ctx, *f.id)
		if err != nil {
			return err
		}
		sizesOK = sizesOK && fo.Bytes == f.bytes && fo.Purpose == "batch_output" && fo.Status == "processed"
		sizes += fmt.Sprintf("%s announces %d bytes (%s, %s), served %d; ", fo.ID, fo.Bytes, fo.Purpose, fo.Status, f.bytes)
	}
	c.Add(p+"each file is the size it announces", sizesOK, "%s", strings.TrimSuffix(sizes, "; "))

	jobs, _, err := s.app.Store.JobList(ctx, &store.JobListParams{TenantID: tenantID, BatchID: b.ID, Limit: 5})
	if err != nil {
		return err
	}
	inBatchQueue := len(jobs) > 0
	for _, j := range jobs {
		inBatchQueue = inBatchQueue && j.Queue == queue.Batch
	}
	c.Add(p+"the jobs ran in the batch queue", inBatchQueue, "%d jobs read, each in queue %q: %v", len(jobs), queue.Batch, inBatchQueue)
	return nil
}

// errorsListed reports whether a batch's errors list the first 100 of the
// refused lines, in order, and a last entry counting the rest when there
// are more.
func errorsListed(e *client.BatchErrors, refused []int, codes []client.Code) bool {
	if len(refused) == 0 {
		return e == nil || len(e.Data) == 0
	}
	if e == nil {
		return false
	}
	listed := min(len(refused), 100)
	if len(e.Data) != listed+btoi(len(refused) > 100) {
		return false
	}
	for i := range listed {
		if d := e.Data[i]; d.Line == nil || *d.Line != refused[i] || d.Code != codes[i] {
			return false
		}
	}
	return len(refused) <= 100 || e.Data[100].Code == "more_errors"
}

func describeErrors(e *client.BatchErrors) string {
	if e == nil || len(e.Data) == 0 {
		return "none"
	}
	d := e.Data[len(e.Data)-1]
	return fmt.Sprintf("%d entries, the last %s: %.120s", len(e.Data), d.Code, d.Message)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// readResults reads an output or error file line by line, and returns its
// size.
func readResults(ctx context.Context, c *client.Client, id string, fn func(*client.BatchResult)) (int64, error) {
	body, err := c.Files.Content(ctx, id)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var n int64
	for sc.Scan() {
		n += int64(len(sc.Bytes())) + 1
		var r client.BatchResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return n, fmt.Errorf("a line is not a result: %w: %.200s", err, sc.Bytes())
		}
		fn(&r)
	}
	return n, sc.Err()
}
