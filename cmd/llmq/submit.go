package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/cmdline"
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

func (c *cli) submitCommand() command {
	o := submitOptions{metadata: map[string]string{}}
	return command{name: "submit", args: []string{"FILE"}, flags: func(fs *flag.FlagSet) {
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
	}, check: func(*flag.FlagSet) error {
		o.wait = o.wait || o.out != "" || o.errs != ""
		if o.concurrency < 1 || o.concurrency > 256 {
			return cmdline.Usagef("--concurrency must be 1 to 256, got %d", o.concurrency)
		}
		if o.poll < 10*time.Millisecond {
			return cmdline.Usagef("--poll must be at least 10ms, got %v", o.poll)
		}
		// Refuse an output path that cannot be written before any work is
		// sent, not after it is paid for.
		for _, p := range []string{o.out, o.errs} {
			if p == "" || p == "-" {
				continue
			}
			if st, err := os.Stat(filepath.Dir(p)); err != nil || !st.IsDir() {
				return cmdline.Usagef("cannot write %s: no directory %s", p, filepath.Dir(p))
			}
		}
		if o.out == "-" && o.errs == "-" {
			return cmdline.Usagef("--out and --errors cannot both be stdout")
		}
		return nil
	}, run: func(cl *client.Client, pos []string) error {
		o.path = pos[0]
		if o.jobs {
			return c.submitJobs(cl, &o)
		}
		return c.submitBatch(cl, &o)
	}}
}

// firstURL reads the url of the first non-blank line.
func firstURL(r *bufio.Reader) (string, error) {
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			return lineURL(line, n)
		}
		if err == io.EOF {
			return "", errors.New("the input is empty; it needs one request per line")
		}
		if err != nil {
			return "", err
		}
	}
}

func lineURL(line []byte, n int) (string, error) {
	var l client.BatchRequest
	if err := json.Unmarshal(line, &l); err != nil {
		return "", fmt.Errorf("line %d is not a JSON request line (custom_id, method, url, body): %v", n, err)
	}
	if l.URL == "" {
		return "", fmt.Errorf("line %d has no url; pass --endpoint", n)
	}
	return l.URL, nil
}

// submitJobs sends every line, all checked first, as a job; with --wait it
// writes output and error files in the batch output format, in input order.
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
	sendBar := &progress{w: c.stderr, quiet: o.quiet, sending: true}
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
	bar := &progress{w: c.stderr, quiet: o.quiet}
	err = c.waitJobs(cl, lines, o.poll, bar)
	bar.finish()
	if err != nil {
		fmt.Fprintf(c.stderr, "stopped waiting; the jobs run on: llmq jobs list\n")
		return err
	}
	failed := 0
	var out, errs bytes.Buffer
	for _, l := range lines {
		dst := &out
		if l.failed {
			failed++
			dst = &errs
		}
		if err := json.NewEncoder(dst).Encode(l.result); err != nil {
			return err
		}
	}
	fmt.Fprintf(c.stderr, "%d jobs: %d done, %d failed in %v (%v sending, %v waiting)\n", len(lines), len(lines)-failed, failed,
		roundDuration(time.Since(start)), roundDuration(waitStart.Sub(start)), roundDuration(time.Since(waitStart)))
	if err := c.save(o.out, "results", &out); err != nil {
		return err
	}
	if err := c.save(o.errs, "errors", &errs); err != nil {
		return err
	}
	if failed > 0 {
		return incompletef("%d of %d requests failed%s", failed, len(lines), errorsHint(o.errs))
	}
	return nil
}
