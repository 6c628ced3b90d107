package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// target is an HTTP job API the driver measures: llmq's or the hand-wired
// stack's. Both speak the same subset of llmq's wire protocol: POST
// /v1/jobs with {"body": ...} answers 202 and the job's id, GET
// /v1/jobs/{id} answers the job with its status.
type target struct {
	url    string
	key    string
	client *http.Client
}

// newTarget returns a target at url whose client keeps a connection per
// producer and poller: Go's default of 2 idle connections per host would
// have the others dial a new connection for every request.
func newTarget(url, key string, conns int) *target {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}
	return &target{url: url, key: key, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

func (t *target) close() { t.client.CloseIdleConnections() }

func (t *target) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, t.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+t.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// jobBody is what every producer POSTs: a small chat request.
var jobBody = []byte(`{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello to the pipeline."}],"max_tokens":16}}`)

// pollWait is how long a poller waits before asking again about a job that
// had not finished: a client polling its jobs, as fast as the end of a run
// needs to be known (the end is late by at most this).
const pollWait = 20 * time.Millisecond

// drive is one measured run of the client: n jobs POSTed by producers
// goroutines (every 1/rate seconds between them when rate > 0, else as fast
// as they are answered), while as many pollers GET the jobs in the order
// they were POSTed until each has succeeded. It ends when the last job is
// seen succeeded; a job that ends otherwise fails the run.
type drive struct {
	n, producers int
	rate         float64 // POSTs per second over all producers; 0 is flat out
	timeout      time.Duration
}

// driven is what a drive measured.
type driven struct {
	jobs     int
	elapsed  time.Duration // first POST sent to the last job seen succeeded
	post     latencies     // every POST's round trip
	postSpan time.Duration // first POST sent to last POST answered
	gets     int64         // GETs the pollers sent
}

func (d *driven) rate() float64 { return float64(d.jobs) / d.elapsed.Seconds() }

// run drives t.
func (d drive) run(ctx context.Context, t *target) (*driven, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	res := &driven{jobs: d.n, post: make(latencies, d.n)}
	ids := make([]string, d.n)
	// posted[i] is closed when ids[i] is set (or its POST failed).
	posted := make([]chan struct{}, d.n)
	for i := range posted {
		posted[i] = make(chan struct{})
	}
	start := time.Now()

	var (
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) { errOnce.Do(func() { firstErr = err; cancel() }) }

	var postsDone atomic.Int64
	wg.Go(func() {
		err := produce(ctx, d.n, d.producers, func(ctx context.Context, i int) error {
			defer close(posted[i])
			if d.rate > 0 {
				at := start.Add(time.Duration(float64(i) / d.rate * float64(time.Second)))
				if w := time.Until(at); w > 0 {
					select {
					case <-time.After(w):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			t0 := time.Now()
			status, body, err := t.do(ctx, http.MethodPost, "/v1/jobs", jobBody)
			res.post[i] = time.Since(t0)
			if err != nil {
				return err
			}
			if status != http.StatusAccepted {
				return fmt.Errorf("POST /v1/jobs: %d %s", status, body)
			}
			var job struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(body, &job); err != nil || job.ID == "" {
				return fmt.Errorf("POST /v1/jobs: no job id in %s", body)
			}
			ids[i] = job.ID
			if postsDone.Add(1) == int64(d.n) {
				res.postSpan = time.Since(start)
			}
			return nil
		})
		if err != nil {
			fail(err)
		}
	})

	var (
		next   atomic.Int64
		gets   atomic.Int64
		lastAt atomic.Int64 // latest success seen, ns since start
	)
	for range min(d.producers, d.n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= d.n {
					return
				}
				select {
				case <-posted[i]:
				case <-ctx.Done():
					return
				}
				if ids[i] == "" {
					return // its POST failed
				}
				if err := d.await(ctx, t, ids[i], &gets); err != nil {
					fail(err)
					return
				}
				if at := int64(time.Since(start)); at > lastAt.Load() {
					for {
						cur := lastAt.Load()
						if at <= cur || lastAt.CompareAndSwap(cur, at) {
							break
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		if ctx.Err() != nil && firstErr == ctx.Err() {
			return nil, fmt.Errorf("%d jobs not done within %v", d.n, d.timeout)
		}
		return nil, firstErr
	}
	res.elapsed = time.Duration(lastAt.Load())
	res.gets = gets.Load()
	return res, nil
}

// await polls job id until it succeeded.
func (d drive) await(ctx context.Context, t *target, id string, gets *atomic.Int64) error {
	for {
		gets.Add(1)
		status, body, err := t.do(ctx, http.MethodGet, "/v1/jobs/"+id, nil)
		if err != nil {
			return err
		}
		if status != http.StatusOK {
			return fmt.Errorf("GET /v1/jobs/%s: %d %s", id, status, body)
		}
		var job struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(body, &job); err != nil {
			return fmt.Errorf("GET /v1/jobs/%s: %w in %s", id, err, body)
		}
		switch job.Status {
		case "succeeded":
			return nil
		case "failed", "cancelled", "expired":
			return fmt.Errorf("job %s ended %s: %s", id, job.Status, body)
		}
		select {
		case <-time.After(pollWait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
