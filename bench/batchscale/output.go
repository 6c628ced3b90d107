package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/bench/internal/checks"
	"github.com/llmq/llmq/bench/internal/procs"
	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/batch/batchtest"
	"github.com/llmq/llmq/internal/testutil"
)

// runOutput runs the output scenario: a large batch's output file served
// by a dispatcher process, whose memory is read from /proc.
func runOutput(ctx context.Context, o *options, logger *slog.Logger, out io.Writer, c *checks.List) error {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		return fmt.Errorf("needs /proc to read the dispatcher's memory: %w", err)
	}
	bin, cleanup, err := procs.Binary(ctx, o.Dispatcher, "dispatcher", "-dispatcher")
	if err != nil {
		return err
	}
	defer cleanup()
	// No worker: the jobs stay queued until their answers are written.
	s, err := openStack(ctx, o, 0, logger)
	if err != nil {
		return err
	}
	defer s.close()
	_, key, cl, err := s.tenant(ctx, "bench-output")
	if err != nil {
		return err
	}
	n := o.OutputLines
	var input bytes.Buffer
	for i := range n {
		input.WriteString(batchtest.ChatLine(fmt.Sprintf("req-%d", i)) + "\n")
	}
	start := time.Now()
	f, err := cl.Files.Upload(ctx, "input.jsonl", &input, "batch")
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	b, err := cl.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions"})
	if err != nil {
		return fmt.Errorf("create the batch: %w", err)
	}
	b, _, err = wait(ctx, o, cl, b.ID, func(b *client.Batch) bool { return b.Status != "validating" })
	if err != nil {
		return err
	}
	validated := time.Since(start)
	if b.Status != "in_progress" || b.RequestCounts.Total != int64(n) {
		return fmt.Errorf("validated batch is %s with counts %+v, want in_progress with %d lines", b.Status, b.RequestCounts, n)
	}

	// Every job succeeded with an answer of o.AnswerBytes: written in one
	// statement, since n provider calls are not what this measures.
	t0 := time.Now()
	conn, err := pgx.Connect(ctx, testutil.PlainDSN(s.dsn))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `UPDATE jobs SET status = 'succeeded', response_status = 200,
		provider_request_id = 'req_' || line_no, finished_at = now(), updated_at = now(),
		response_body = jsonb_build_object('id', 'chatcmpl-' || line_no, 'object', 'chat.completion',
			'choices', jsonb_build_array(jsonb_build_object('index', 0, 'finish_reason', 'stop',
				'message', jsonb_build_object('role', 'assistant', 'content', custom_id || ' ' || left(repeat('lorem ipsum ', $2::int / 12 + 1), $2::int)))))
		WHERE batch_id = $1`, b.ID, o.AnswerBytes)
	_ = conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("write the answers: %w", err)
	}
	written := time.Since(t0)
	t0 = time.Now()
	if b, _, err = wait(ctx, o, cl, b.ID, func(*client.Batch) bool { return false }); err != nil {
		return err
	}
	finalized := time.Since(t0)
	if b.Status != "completed" || b.OutputFileID == nil {
		return fmt.Errorf("batch %s after its answers were written, output file %v (counts %+v)", b.Status, b.OutputFileID, b.RequestCounts)
	}
	file, err := cl.Files.Get(ctx, *b.OutputFileID)
	if err != nil {
		return err
	}

	// A dispatcher process serves the file.
	p, err := procs.Start(ctx, bin, s.environ, "listening on")
	if err != nil {
		return err
	}
	defer p.Stop()
	m := listening.FindStringSubmatch(p.Out.String())
	if m == nil {
		return fmt.Errorf("no address in the dispatcher's output:\n%s", p.Out.String())
	}
	startPeak, err := memory(p.Pid(), "VmHWM")
	if err != nil {
		return err
	}
	// The peak from here on: the kernel resets it to the current size.
	reset := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.Pid()), []byte("5"), 0)
	before, err := memory(p.Pid(), "VmRSS")
	if err != nil {
		return err
	}
	dc, err := client.New(m[1], key, client.WithHTTPClient(s.hc))
	if err != nil {
		return err
	}
	t0 = time.Now()
	lines, read, firstBad, err := readInOrder(ctx, dc, file.ID)
	if err != nil {
		return err
	}
	served := time.Since(t0)
	peak, err := memory(p.Pid(), "VmHWM")
	if err != nil {
		return err
	}
	growth := peak - before
	since := "since the request"
	if reset != nil {
		since = "since the dispatcher started (its peak could not be reset: " + reset.Error() + ")"
	}
	fmt.Fprintf(out, "output: %d lines validated in %v; answers of %d bytes written in %v; finalized in %v; "+
		"the output file (%.1f MiB) served in %v (%.0f MiB/s)\n",
		n, validated.Round(time.Millisecond), o.AnswerBytes, written.Round(time.Millisecond), finalized.Round(time.Millisecond),
		mib(file.Bytes), served.Round(time.Millisecond), mib(file.Bytes)/served.Seconds())
	fmt.Fprintf(out, "output: the dispatcher's resident memory: %.1f MiB at its start's peak, %.1f MiB before the request, "+
		"%.1f MiB at its peak %s (%.1f MiB more, %.1f%% of the file)\n",
		mib(startPeak), mib(before), mib(peak), since, mib(growth), 100*float64(growth)/float64(max(file.Bytes, 1)))

	const pre = "output: "
	c.Add(pre+"every line served once, in input order, the bytes the file announces", lines == n && read == file.Bytes && firstBad == "",
		"%d lines of %d, %d bytes of %d%s", lines, n, read, file.Bytes, firstBad)
	c.Add(pre+"the dispatcher's peak resident memory under -max-rss", peak < o.MaxRSS,
		"%.1f MiB (%s), bound %.0f MiB, serving a %.1f MiB file", mib(peak), since, mib(o.MaxRSS), mib(file.Bytes))
	if o.MaxGrowth > 0 {
		bound := int64(o.MaxGrowth * float64(file.Bytes))
		c.Add(pre+"the dispatcher's memory grew by less than -max-growth of the file", growth < bound,
			"%.1f MiB, bound %.1f MiB (%g of %.1f MiB)", mib(growth), mib(bound), o.MaxGrowth, mib(file.Bytes))
	}
	return nil
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// readInOrder streams a file's content and checks that line i is req-i's.
// It returns the lines and bytes read, and the first line out of order.
func readInOrder(ctx context.Context, c *client.Client, id string) (lines int, read int64, firstBad string, err error) {
	body, err := c.Files.Content(ctx, id)
	if err != nil {
		return 0, 0, "", err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		read += int64(len(sc.Bytes())) + 1
		var r struct {
			CustomID string `json:"custom_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); (err != nil || r.CustomID != fmt.Sprintf("req-%d", lines)) && firstBad == "" {
			firstBad = fmt.Sprintf("; line %d: custom_id %q (%v), want req-%d", lines+1, r.CustomID, err, lines)
		}
		lines++
	}
	return lines, read, firstBad, sc.Err()
}

// memory is a field of a process's /proc status (VmHWM, VmRSS), in bytes.
func memory(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
