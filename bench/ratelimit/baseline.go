package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// runBaseline runs Processes groups of Concurrency callers against a fresh
// simulator in the scenario's mode for Duration. Each group models one
// process: its own HTTP connections and, for the local baseline, its own
// in-memory token bucket with the provider's full limits; nothing is shared
// between groups. Every caller sends the next request of the mix to its
// endpoint (chat completions or the Responses API), and on a 429 sleeps the
// provider's retry-after and sends it again, until it succeeds.
func runBaseline(ctx context.Context, o *options, sc scenario, mix *mix) (*result, error) {
	srv := startSim(o, sc)
	defer srv.Close()
	local := sc.caller == callerLocal

	var (
		next   atomic.Int64
		mu     sync.Mutex
		done   []time.Duration
		resps  int
		most   int
		with   int
		errs   atomic.Int64
		wg     sync.WaitGroup
		fatal  error
		failMu sync.Mutex
	)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	smp := startSampler(srv)
	for range o.Processes {
		tr := &http.Transport{MaxIdleConns: o.Concurrency, MaxIdleConnsPerHost: o.Concurrency}
		defer tr.CloseIdleConnections()
		c := &client{base: srv.BaseURL, client: &http.Client{Transport: tr, Timeout: time.Minute}}
		if local {
			c.bucket = newLocalBucket(o.RPM, o.TPM)
		}
		for range o.Concurrency {
			wg.Go(func() {
				for cctx.Err() == nil {
					r, err := mix.request(int(next.Add(1) - 1))
					if err != nil {
						failMu.Lock()
						fatal = err
						failMu.Unlock()
						cancel()
						return
					}
					n429, ok := c.do(cctx, r, &errs)
					if !ok {
						return
					}
					at := time.Since(smp.start)
					mu.Lock()
					done = append(done, at)
					if r.endpoint == llm.EndpointResponses {
						resps++
					}
					most = max(most, n429)
					if n429 > 0 {
						with++
					}
					mu.Unlock()
				}
			})
		}
	}

	timer := time.NewTimer(o.Duration)
	select {
	case <-cctx.Done():
		timer.Stop()
	case <-timer.C:
	}
	res := &result{start: smp.start, duration: o.Duration, samples: smp.finish()}
	cancel()
	wg.Wait()
	if fatal != nil {
		return nil, fatal
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mu.Lock()
	res.completions = slices.Sorted(slices.Values(done))
	res.responsesDone, res.most429, res.with429 = resps, most, with
	mu.Unlock()
	res.log = srv.Admissions(0)
	res.dropped = srv.Stats().LogDropped
	if n := errs.Load(); n > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d calls failed without an answer (retried after 1s)", n))
	}
	return res, nil
}

// client is what the callers of one modelled process share.
type client struct {
	base   string // the provider's base URL, ".../v1", as an OpenAI client takes it
	client *http.Client
	bucket *localBucket // nil: no limiter
}

// do sends r until the provider answers 200 and returns how many 429s it
// took; ok is false when ctx ended first.
func (c *client) do(ctx context.Context, r *request, errs *atomic.Int64) (n429 int, ok bool) {
	for {
		if c.bucket != nil && !c.bucket.take(ctx, r.cost) {
			return n429, false
		}
		status, rl, total, err := c.call(ctx, r)
		if ctx.Err() != nil {
			return n429, false
		}
		switch {
		case err == nil && status == http.StatusOK:
			if c.bucket != nil {
				c.bucket.give(0, r.cost-total)
			}
			return n429, true
		case err == nil && status == http.StatusTooManyRequests:
			n429++
			if c.bucket != nil {
				// The call did not happen: the process gets its permit back.
				c.bucket.give(1, r.cost)
			}
			wait := time.Second
			if rl.Known(llm.HasRetryAfter) {
				wait = rl.RetryAfter
			}
			if !sleep(ctx, wait) {
				return n429, false
			}
		default:
			errs.Add(1)
			if c.bucket != nil {
				c.bucket.give(1, r.cost)
			}
			if !sleep(ctx, time.Second) {
				return n429, false
			}
		}
	}
}

// call sends r to its endpoint (a chat completion or a response) and
// returns the status, the rate-limit headers and, on success, the usage's
// total tokens.
func (c *client) call(ctx context.Context, r *request) (status int, rl llm.RateLimit, total int64, err error) {
	url := c.base + strings.TrimPrefix(r.endpoint, "/v1")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(r.body))
	if err != nil {
		return 0, rl, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench")
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, rl, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, rl, 0, err
	}
	rl = llm.ParseRateLimit(resp.Header)
	if resp.StatusCode == http.StatusOK {
		u, err := llm.UsageOf(data)
		if err != nil {
			return 0, rl, 0, err
		}
		total = u.PromptTokens + u.CompletionTokens
	}
	return resp.StatusCode, rl, total, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// localBucket is what a single-process script enforces: the provider's RPM
// and TPM as two continuously refilled buckets in memory, full at start.
// A call reserves one request and prompt + max_tokens; the unused tokens
// come back when it completes, as such scripts assume.
type localBucket struct {
	mu       sync.Mutex
	req, tok float64
	rpm, tpm float64
	last     time.Time
}

func newLocalBucket(rpm, tpm int64) *localBucket {
	return &localBucket{req: float64(rpm), tok: float64(tpm), rpm: float64(rpm), tpm: float64(tpm), last: time.Now()}
}

func (b *localBucket) refill(now time.Time) {
	m := now.Sub(b.last).Minutes()
	b.req = math.Min(b.rpm, b.req+m*b.rpm)
	b.tok = math.Min(b.tpm, b.tok+m*b.tpm)
	b.last = now
}

// take waits until both buckets hold the cost and takes it; false when ctx
// ended first.
func (b *localBucket) take(ctx context.Context, tokens int64) bool {
	for {
		b.mu.Lock()
		b.refill(time.Now())
		needReq, needTok := 1-b.req, float64(tokens)-b.tok
		if needReq <= 0 && needTok <= 0 {
			b.req--
			b.tok -= float64(tokens)
			b.mu.Unlock()
			return true
		}
		wait := time.Duration(math.Max(needReq/b.rpm, needTok/b.tpm) * float64(time.Minute))
		b.mu.Unlock()
		if !sleep(ctx, max(wait, time.Millisecond)) {
			return false
		}
	}
}

// give returns requests and tokens (never beyond the capacity).
func (b *localBucket) give(requests, tokens int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(time.Now())
	b.req = math.Min(b.rpm, b.req+float64(requests))
	b.tok = math.Min(b.tpm, b.tok+float64(max(tokens, 0)))
}
