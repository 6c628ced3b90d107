package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/llmq/llmq/client"
)

// submitBatch uploads the file and creates a batch of it, followed with --wait.
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
		// first line. A file is sent from its start again (a seekable
		// content is retried after a 429); of a pipe, what was read is
		// sent before the rest.
		var read bytes.Buffer
		if endpoint, err = firstURL(bufio.NewReader(io.TeeReader(in, &read))); err != nil {
			return fmt.Errorf("%s: %w", o.path, err)
		}
		content = io.MultiReader(&read, in)
		if f, ok := in.(*os.File); ok {
			if _, err := f.Seek(0, io.SeekStart); err == nil {
				content = f
			}
		}
	}
	file, err := cl.Files.Upload(c.ctx, name, content, "batch")
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stderr, "uploaded %s as %s (%d bytes)\n", name, file.ID, file.Bytes)
	b, err := cl.Batches.Create(c.ctx, &client.BatchCreateParams{InputFileID: file.ID, Endpoint: endpoint,
		CompletionWindow: o.window, Metadata: o.metadata})
	if err != nil {
		return err
	}
	if o.out == "-" || o.errs == "-" {
		fmt.Fprintf(c.stderr, "batch %s\n", b.ID)
	} else {
		fmt.Fprintln(c.stdout, b.ID)
	}
	if !o.wait {
		fmt.Fprintf(c.stderr, "batch %s %s; follow it with: llmq batches get %s\n", b.ID, b.Status, b.ID)
		return nil
	}

	start, id := time.Now(), b.ID
	bar := &progress{w: c.stderr, quiet: o.quiet}
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
	switch {
	case path == "":
		return nil
	case fileID != nil && *fileID != "":
		return c.download(cl, *fileID, path, what)
	case path == "-":
		return nil
	}
	if _, err := writeFile(path, strings.NewReader("")); err != nil {
		return err
	}
	fmt.Fprintf(c.stderr, "no %s: wrote an empty %s\n", what, path)
	return nil
}
