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
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/llmq/llmq/client"
)

// jobLine is one line of a --jobs submission and what became of it.
type jobLine struct {
	n        int // 1-based line number
	params   client.JobCreateParams
	jobID    string
	result   *client.BatchResult // set when the job (or its refusal) is final
	failed   bool
	finished bool // the job had already finished when it was sent (sent before)
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
		var l client.BatchRequest
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
		jl := &jobLine{n: n, params: client.JobCreateParams{CustomID: l.CustomID, Endpoint: l.URL, Body: l.Body, Metadata: o.metadata}}
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
	var (
		g                  errgroup.Group
		stop               atomic.Bool
		mu                 sync.Mutex
		answered, nRefused int64
	)
	g.SetLimit(n)
	for _, l := range lines {
		if stop.Load() {
			break
		}
		g.Go(func() error {
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
				stop.Store(true)
				return fmt.Errorf("line %d: %w", l.n, err)
			}
			mu.Lock()
			answered++
			if l.failed {
				nRefused++
			}
			a, r := answered, nRefused
			mu.Unlock()
			sent(a, r)
			return nil
		})
	}
	return g.Wait()
}
