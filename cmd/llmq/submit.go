package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/client"
)

// submitOptions are the flags of llmq submit.
type submitOptions struct {
	path        string
	wait        bool
	out, errs   string
	endpoint    string
	window      string
	metadata    map[string]string
	jobs        bool
	concurrency int
	poll        time.Duration
	quiet       bool
	noDedupe    bool
}

func (c *cli) submit(args []string) error {
	fs := c.flags("submit")
	o := submitOptions{metadata: map[string]string{}}
	fs.BoolVar(&o.wait, "wait", false, "")
	fs.StringVar(&o.out, "out", "", "")
	fs.StringVar(&o.errs, "errors", "", "")
	fs.StringVar(&o.endpoint, "endpoint", "", "")
	fs.StringVar(&o.window, "completion-window", "24h", "")
	fs.Func("metadata", "", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", s)
		}
		o.metadata[k] = v
		return nil
	})
	fs.BoolVar(&o.jobs, "jobs", false, "")
	fs.IntVar(&o.concurrency, "concurrency", 8, "")
	fs.DurationVar(&o.poll, "poll", time.Second, "")
	fs.BoolVar(&o.quiet, "quiet", false, "")
	fs.BoolVar(&o.noDedupe, "no-dedupe", false, "")
	pos, err := c.parse(fs, args, "FILE")
	if err != nil {
		return err
	}
	o.path = pos[0]
	if o.out != "" || o.errs != "" {
		o.wait = true
	}
	if o.concurrency < 1 || o.concurrency > 256 {
		return usageErrorf("--concurrency must be 1 to 256, got %d", o.concurrency)
	}
	if o.poll < 10*time.Millisecond {
		return usageErrorf("--poll must be at least 10ms, got %v", o.poll)
	}
	// Refuse an output path that cannot be written before any work is
	// sent, not after it is paid for.
	for _, p := range []string{o.out, o.errs} {
		if p == "" || p == "-" {
			continue
		}
		if st, err := os.Stat(filepath.Dir(p)); err != nil || !st.IsDir() {
			return usageErrorf("cannot write %s: no directory %s", p, filepath.Dir(p))
		}
	}
	if o.out == "-" && o.errs == "-" {
		return usageErrorf("--out and --errors cannot both be stdout")
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if o.jobs {
		return c.submitJobs(cl, &o)
	}
	return c.submitBatch(cl, &o)
}

// submitBatch uploads the file, creates a batch of it, and with --wait
// follows it to its end and downloads its files.
func (c *cli) submitBatch(cl *client.Client, o *submitOptions) error {
	in, name, err := c.open(o.path)
	if err != nil {
		return err
	}
	defer in.Close()
	var content io.Reader = in
	endpoint := o.endpoint
	if endpoint == "" {
		// The batch's endpoint is the url of its lines: read it from the
		// first line. A file is read again from the start; a pipe is
		// peeked, so what was looked at is still sent.
		if f, ok := in.(*os.File); ok {
			if _, err := f.Seek(0, io.SeekCurrent); err == nil {
				endpoint, err = firstURL(bufio.NewReader(f))
				if err != nil {
					return fmt.Errorf("%s: %w", o.path, err)
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return fmt.Errorf("%s: %w", o.path, err)
				}
			}
		}
		if endpoint == "" {
			br := bufio.NewReaderSize(in, 1<<20)
			endpoint, err = peekURL(br)
			if err != nil {
				return fmt.Errorf("%s: %w", o.path, err)
			}
			content = br
		}
	}
	file, err := cl.Files.Upload(c.ctx, name, content, "batch")
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stderr, "uploaded %s as %s (%d bytes)\n", name, file.ID, file.Bytes)
	p := &client.BatchCreateParams{InputFileID: file.ID, Endpoint: endpoint, CompletionWindow: o.window}
	if len(o.metadata) > 0 {
		p.Metadata = o.metadata
	}
	b, err := cl.Batches.Create(c.ctx, p)
	if err != nil {
		return err
	}
	if o.out == "-" || o.errs == "-" {
		// stdout carries the results.
		fmt.Fprintf(c.stderr, "batch %s\n", b.ID)
	} else {
		fmt.Fprintln(c.stdout, b.ID)
	}
	if !o.wait {
		fmt.Fprintf(c.stderr, "batch %s %s; follow it with: llmq batches get %s\n", b.ID, b.Status, b.ID)
		return nil
	}

	start, id := time.Now(), b.ID
	bar := c.newProgress(o.quiet)
	b, err = cl.Batches.Wait(c.ctx, id, &client.BatchWaitOptions{
		WaitOptions: client.WaitOptions{Interval: o.poll, MaxInterval: o.poll},
		OnPoll: func(b *client.Batch) {
			rc := b.RequestCounts
			bar.update(rc.Completed, rc.Failed, rc.Total)
		},
	})
	bar.finish()
	if err != nil {
		fmt.Fprintf(c.stderr, "stopped waiting; batch %s runs on: llmq batches get %s\n", id, id)
		return err
	}
	rc := b.RequestCounts
	fmt.Fprintf(c.stderr, "batch %s %s: %d done, %d failed of %d in %v\n",
		b.ID, b.Status, rc.Completed, rc.Failed, rc.Total, time.Since(start).Round(100*time.Millisecond))
	if b.Errors != nil {
		c.printBatchErrors(b.Errors.Data, o.errs)
	}
	if err := c.saveResult(cl, b.OutputFileID, o.out, "results"); err != nil {
		return err
	}
	if err := c.saveResult(cl, b.ErrorFileID, o.errs, "errors"); err != nil {
		return err
	}
	if b.Status != "completed" {
		return incompletef("batch %s %s", b.ID, b.Status)
	}
	if rc.Failed > 0 {
		return incompletef("%d of %d requests failed%s", rc.Failed, rc.Total, errorsHint(o.errs))
	}
	return nil
}

// printBatchErrors shows why a batch refused lines, the first few of them:
// the error file has them all.
func (c *cli) printBatchErrors(errs []client.BatchError, errFile string) {
	const show = 5
	for i, e := range errs {
		if i == show {
			fmt.Fprintf(c.stderr, "  … and %d more%s\n", len(errs)-show, errorsHint(errFile))
			return
		}
		msg := e.Message
		if e.Line != nil && !strings.HasPrefix(msg, fmt.Sprintf("Line %d", *e.Line)) {
			msg = fmt.Sprintf("line %d: %s", *e.Line, msg)
		}
		fmt.Fprintf(c.stderr, "  %s\n", msg)
	}
}

func errorsHint(errs string) string {
	if errs == "" {
		return " (--errors FILE writes them)"
	}
	if errs == "-" {
		return ""
	}
	return " (see " + errs + ")"
}

// saveResult downloads a batch's output or error file to path; a batch
// without that file gives an empty one, so what follows in a pipeline finds
// the file it expects.
func (c *cli) saveResult(cl *client.Client, fileID *string, path, what string) error {
	if path == "" {
		return nil
	}
	if fileID == nil || *fileID == "" {
		if path == "-" {
			return nil
		}
		if _, err := writeFile(path, strings.NewReader("")); err != nil {
			return err
		}
		fmt.Fprintf(c.stderr, "no %s: wrote an empty %s\n", what, path)
		return nil
	}
	n, err := c.download(cl, *fileID, path)
	if err != nil {
		return err
	}
	if path != "-" {
		fmt.Fprintf(c.stderr, "wrote %s to %s (%d bytes)\n", what, path, n)
	}
	return nil
}

// batchLine is what llmq submit reads of an input line.
type batchLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// firstURL reads the url of the first non-blank line.
func firstURL(r *bufio.Reader) (string, error) {
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			return lineURL(line, n)
		}
		if err == io.EOF {
			return "", errors.New("the file is empty; it needs one request per line")
		}
		if err != nil {
			return "", err
		}
	}
}

// peekURL finds the url of the first non-blank line without consuming it.
func peekURL(br *bufio.Reader) (string, error) {
	for size := 4096; ; size *= 2 {
		size = min(size, br.Size())
		data, err := br.Peek(size)
		rest, n := data, 1
		for {
			i := bytes.IndexByte(rest, '\n')
			if i < 0 {
				break
			}
			if line := rest[:i]; len(bytes.TrimSpace(line)) > 0 {
				return lineURL(line, n)
			}
			rest, n = rest[i+1:], n+1
		}
		switch {
		case err == io.EOF && len(bytes.TrimSpace(rest)) > 0:
			return lineURL(rest, n)
		case err == io.EOF:
			return "", errors.New("the input is empty; it needs one request per line")
		case errors.Is(err, bufio.ErrBufferFull) || size == br.Size():
			return "", errors.New("the first line is longer than 1 MiB; pass --endpoint")
		case err != nil:
			return "", err
		}
	}
}

func lineURL(line []byte, n int) (string, error) {
	var l batchLine
	if err := json.Unmarshal(line, &l); err != nil {
		return "", fmt.Errorf("line %d is not a JSON request line (custom_id, method, url, body): %v", n, err)
	}
	if l.URL == "" {
		return "", fmt.Errorf("line %d has no url; pass --endpoint", n)
	}
	return l.URL, nil
}

// jobLine is one line of a --jobs submission and what became of it.
type jobLine struct {
	n        int // 1-based line number
	params   client.JobCreateParams
	jobID    string
	result   *client.BatchResult // set when the job (or its refusal) is final
	failed   bool
	finished bool // the job had already finished when it was sent (sent before)
}

// submitJobs sends every line as a job (POST /v1/jobs), a few at a time;
// with --wait it follows them to their end and writes output and error
// files in the batch output format, in input order. Every line is checked
// before any is sent.
func (c *cli) submitJobs(cl *client.Client, o *submitOptions) error {
	in, _, err := c.open(o.path)
	if err != nil {
		return err
	}
	lines, err := readJobLines(in, o)
	in.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", o.path, err)
	}
	if len(lines) == 0 {
		return fmt.Errorf("%s: no requests", o.path)
	}

	start := time.Now()
	sendBar := c.newSendProgress(o.quiet)
	err = c.sendJobs(cl, lines, o.concurrency, func(sent, refused int64) { sendBar.update(sent-refused, refused, int64(len(lines))) })
	sendBar.finish()
	if err != nil {
		return err
	}
	sent := time.Since(start)
	refused, finished := 0, 0
	for _, l := range lines {
		switch {
		case l.result != nil:
			refused++
		case l.finished:
			finished++
		}
	}
	fmt.Fprintf(c.stderr, "sent %d lines in %v (%s): %d jobs, %d refused", len(lines), roundDuration(sent),
		perSecond(len(lines), sent), len(lines)-refused, refused)
	if finished > 0 {
		// Idempotency keys return the job a line made before: it is not
		// run or paid for again.
		fmt.Fprintf(c.stderr, "; %d had already finished (sent before)", finished)
	}
	fmt.Fprintln(c.stderr)
	if !o.wait {
		for _, l := range lines {
			if l.jobID != "" {
				fmt.Fprintf(c.stdout, "%s\t%s\n", l.jobID, l.params.CustomID)
			}
		}
		if refused > 0 {
			fmt.Fprintf(c.stderr, "%d refused:\n", refused)
			for _, l := range lines {
				if l.result != nil {
					fmt.Fprintf(c.stderr, "  line %d (%s): %s\n", l.n, l.params.CustomID, l.result.Error.Message)
				}
			}
			return incompletef("%d of %d requests refused", refused, len(lines))
		}
		return nil
	}

	waitStart := time.Now()
	bar := c.newProgress(o.quiet)
	err = c.waitJobs(cl, lines, o.poll, bar)
	bar.finish()
	if err != nil {
		fmt.Fprintf(c.stderr, "stopped waiting; the jobs run on: llmq jobs list\n")
		return err
	}
	var done, failed int
	var out, errs bytes.Buffer
	for _, l := range lines {
		dst := &out
		if l.failed {
			failed++
			dst = &errs
		} else {
			done++
		}
		line, err := json.Marshal(l.result)
		if err != nil {
			return err
		}
		dst.Write(append(line, '\n'))
	}
	fmt.Fprintf(c.stderr, "%d jobs: %d done, %d failed in %v (%v sending, %v waiting)\n", len(lines), done, failed,
		roundDuration(time.Since(start)), roundDuration(waitStart.Sub(start)), roundDuration(time.Since(waitStart)))
	for _, w := range []struct {
		path, what string
		data       *bytes.Buffer
	}{{o.out, "results", &out}, {o.errs, "errors", &errs}} {
		switch w.path {
		case "":
		case "-":
			if _, err := c.stdout.Write(w.data.Bytes()); err != nil {
				return err
			}
		default:
			n, err := writeFile(w.path, w.data)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stderr, "wrote %s to %s (%d bytes)\n", w.what, w.path, n)
		}
	}
	if failed > 0 {
		return incompletef("%d of %d requests failed%s", failed, len(lines), errorsHint(o.errs))
	}
	return nil
}

// readJobLines reads and checks every line of a batch input file.
func readJobLines(r io.Reader, o *submitOptions) ([]*jobLine, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var lines []*jobLine
	seen := map[string]int{}
	for n := 1; sc.Scan(); n++ {
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var l batchLine
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, fmt.Errorf("line %d is not a request line (custom_id, method, url, body): %v", n, err)
		}
		switch {
		case l.CustomID == "":
			return nil, fmt.Errorf("line %d has no custom_id", n)
		case seen[l.CustomID] != 0:
			return nil, fmt.Errorf("line %d repeats the custom_id %q of line %d", n, l.CustomID, seen[l.CustomID])
		case l.Method != "" && l.Method != "POST":
			return nil, fmt.Errorf("line %d: method must be POST, got %q", n, l.Method)
		case o.endpoint != "" && l.URL != o.endpoint:
			return nil, fmt.Errorf("line %d: url %q is not --endpoint %q", n, l.URL, o.endpoint)
		case len(bytes.TrimSpace(l.Body)) == 0 || l.Body[0] != '{':
			return nil, fmt.Errorf("line %d: body must be a JSON object", n)
		}
		seen[l.CustomID] = n
		jl := &jobLine{n: n, params: client.JobCreateParams{CustomID: l.CustomID, Endpoint: l.URL, Body: l.Body}}
		if len(o.metadata) > 0 {
			jl.params.Metadata = o.metadata
		}
		if !o.noDedupe {
			// The same line sent again (a re-run after a crash) returns the
			// job it made the first time instead of paying twice.
			sum := sha256.Sum256(raw)
			jl.params.IdempotencyKey = "llmq-submit-" + hex.EncodeToString(sum[:20])
		}
		lines = append(lines, jl)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d is longer than 16 MiB", len(lines)+1)
		}
		return nil, err
	}
	return lines, nil
}

// sendJobs creates the jobs of lines with at most n requests at once,
// telling sent the lines answered so far and how many of them were refused.
// A line the server refuses (a 4xx: unknown model, too large) is recorded
// as failed and the others go on; anything else (the server unreachable,
// the key refused) stops the submission.
func (c *cli) sendJobs(cl *client.Client, lines []*jobLine, n int, sent func(sent, refused int64)) error {
	work := make(chan *jobLine)
	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		firstErr           error
		answered, nRefused int64
	)
	stop := make(chan struct{})
	for range n {
		wg.Go(func() {
			for l := range work {
				j, err := cl.Jobs.Create(c.ctx, &l.params)
				var apiErr *client.Error
				switch {
				case err == nil:
					l.jobID, l.finished = j.ID, j.Finished()
				case errors.As(err, &apiErr) && apiErr.StatusCode >= 400 && apiErr.StatusCode < 500 &&
					apiErr.StatusCode != 401 && apiErr.StatusCode != 403 && apiErr.StatusCode != 429:
					l.failed = true
					l.result = &client.BatchResult{CustomID: l.params.CustomID,
						Error: &client.BatchLineError{Code: apiErr.Code, Message: apiErr.Message}}
				default:
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("line %d: %w", l.n, err)
						close(stop)
					}
					mu.Unlock()
					continue
				}
				mu.Lock()
				answered++
				if l.failed {
					nRefused++
				}
				a, r := answered, nRefused
				mu.Unlock()
				sent(a, r)
			}
		})
	}
send:
	for _, l := range lines {
		select {
		case work <- l:
		case <-stop:
			break send
		}
	}
	close(work)
	wg.Wait()
	return firstErr
}

// waitJobs follows the submitted jobs until each has finished. Rather than
// asking for each job, it reads the tenant's job list newest first down to
// the oldest job still pending (ids sort by creation), a page of 1,000 jobs
// per request, and sleeps poll between rounds.
func (c *cli) waitJobs(cl *client.Client, lines []*jobLine, poll time.Duration, bar *progress) error {
	pending := map[string]*jobLine{}
	var done, failed int64
	for _, l := range lines {
		switch {
		case l.jobID != "":
			pending[l.jobID] = l
		case l.failed:
			failed++
		}
	}
	total := int64(len(lines))
	// The bar's first count is the first round's: jobs that finished while
	// the file was being sent are not counted as finished at once.
	for len(pending) > 0 {
		oldest := ""
		for id := range pending {
			if oldest == "" || id < oldest {
				oldest = id
			}
		}
		for j, err := range cl.Jobs.All(c.ctx, &client.JobListParams{Limit: 1000}) {
			if err != nil {
				return err
			}
			if j.ID < oldest {
				break
			}
			l := pending[j.ID]
			if l == nil || !j.Finished() {
				continue
			}
			delete(pending, j.ID)
			l.result = &client.BatchResult{ID: j.ID, CustomID: l.params.CustomID, Response: j.Response}
			if j.Status == "succeeded" {
				done++
				continue
			}
			failed++
			l.failed = true
			e := &client.BatchLineError{Code: "job_" + j.Status, Message: "The job was " + j.Status + "."}
			if j.Error != nil {
				e = &client.BatchLineError{Code: j.Error.Code, Message: j.Error.Message}
			}
			l.result.Error = e
		}
		bar.update(done, failed, total)
		if len(pending) > 0 {
			if err := sleepCtx(c, poll); err != nil {
				return err
			}
		}
	}
	return nil
}

// roundDuration shows d to a tenth of a second, or to the millisecond
// below a second (a re-sent file that only de-duplicates takes that long).
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// perSecond is n in d as a rate.
func perSecond(n int, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f/s", float64(n)/d.Seconds())
}

func sleepCtx(c *cli, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-c.ctx.Done():
		return c.ctx.Err()
	}
}
