package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/llm/sim"
)

// runRouter is the baseline a team runs without llmq: a client-side router
// in each of Processes processes of Concurrency callers, as LiteLLM's
// simple-shuffle routes. Each call goes to a deployment picked at random in
// proportion to its TPM; a 429 sleeps the provider's retry-after, a failure
// (a 5xx, a refused connection) a second, and the call goes again to a
// deployment picked anew. Nothing is shared between processes. With
// outage, org-a goes down for Outage after Warmup + 30 s, as in the outage
// scenario.
func runRouter(ctx context.Context, o *options, outage bool) (*report, error) {
	deps := newDeployments()
	for _, d := range deps {
		d.srv = sim.Start(d.simConfig())
		defer d.srv.Close()
		px, err := startProxy(d.srv.URL[len("http://"):])
		if err != nil {
			return nil, err
		}
		d.px = px
		defer px.close()
	}
	var weights []float64
	total := 0.0
	for _, d := range deps {
		total += float64(d.tpm)
		weights = append(weights, total)
	}
	pick := func() *deployment {
		x := rand.Float64() * total
		for i, w := range weights {
			if x < w {
				return deps[i]
			}
		}
		return deps[len(deps)-1]
	}
	smp := startSampler(deps)
	defer smp.finish()
	start := time.Now()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next, failures atomic.Int64
	var wg sync.WaitGroup
	for range o.Processes {
		tr := &http.Transport{MaxIdleConns: o.Concurrency, MaxIdleConnsPerHost: o.Concurrency}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		for range o.Concurrency {
			wg.Go(func() {
				for cctx.Err() == nil {
					body := request("gpt-4o", int(next.Add(1)))
					for cctx.Err() == nil {
						wait, ok := call(cctx, hc, pick(), body)
						if ok {
							break
						}
						failures.Add(1)
						sleep(cctx, wait)
					}
				}
			})
		}
	}
	r := &report{}
	end := start.Add(o.Warmup + o.Measure)
	var down, up time.Time
	if outage {
		down = start.Add(o.Warmup + 30*time.Second)
		if err := sleepUntil(ctx, down); err != nil {
			return nil, err
		}
		deps[0].px.setDown(true)
		up = time.Now().Add(o.Outage)
		if err := sleepUntil(ctx, up); err != nil {
			return nil, err
		}
		deps[0].px.setDown(false)
		end = up.Add(45 * time.Second)
	}
	if err := sleepUntil(ctx, end); err != nil {
		return nil, err
	}
	cancel()
	wg.Wait()
	if outage {
		during := smp.between(down.Add(2*time.Second), up, deps)
		r.line("while org-a is down:")
		r.lines = append(r.lines, during.lines(deps)...)
		attempts := deps[0].px.attemptsSince(down)
		late := 0
		for _, t := range attempts {
			if t.After(down.Add(time.Second)) {
				late++
			}
		}
		r.line("org-a down for %v: %d connections reset, %d of them more than 1 s after it went down", up.Sub(down).Round(time.Second), len(attempts), late)
	} else {
		u := smp.between(start.Add(o.Warmup), end, deps)
		r.lines = append(r.lines, u.lines(deps)...)
	}
	whole := smp.between(start, end, deps)
	r.line("whole run: %d of %d calls answered 429 (%.2f%%); %d calls failed and went again", whole.totalLimited, whole.totalRequests,
		100*whole.share429(), failures.Load())
	return r, nil
}

// call sends body to d as the baseline router does: a 2xx is done; else
// the wait before going again (a 429's retry-after, or a second).
func call(ctx context.Context, hc *http.Client, d *deployment, body []byte) (time.Duration, bool) {
	url := d.px.url() + "/v1/chat/completions"
	if d.azure {
		url = d.px.url() + "/openai/deployments/" + d.upstream + "/chat/completions?api-version=2024-10-21"
	} else {
		body = bytes.Replace(body, []byte(`"model":"gpt-4o"`), []byte(fmt.Sprintf("%q:%q", "model", d.upstream)), 1)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return time.Second, false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench")
	req.Header.Set("api-key", "bench")
	resp, err := hc.Do(req)
	if err != nil {
		return time.Second, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return 0, true
	}
	if s, err := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64); err == nil && resp.StatusCode == http.StatusTooManyRequests {
		return time.Duration(s * float64(time.Second)), false
	}
	if ms, err := strconv.ParseFloat(resp.Header.Get("Retry-After-Ms"), 64); err == nil {
		return time.Duration(ms * float64(time.Millisecond)), false
	}
	return time.Second, false
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
