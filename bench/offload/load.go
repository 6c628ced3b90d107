package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// syncBody is tenant C's request: a small chat completion.
var syncBody = []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Answer the interactive user, quickly."}],"max_tokens":16}`)

// maxSyncInFlight bounds C's calls in flight: a stuck llmq makes C give up
// sending rather than open connections without end.
const maxSyncInFlight = 2000

// syncLoad is tenant C: synchronous chat completions (POST
// /v1/chat/completions) sent open loop, one every 60 s / rpm, each on its
// own connection slot, whatever the answers to the ones before.
type syncLoad struct {
	stopped chan struct{}
	done    chan struct{}

	mu       sync.Mutex
	res      syncResult
	firstErr error
}

// syncResult is what C saw.
type syncResult struct {
	rpm                   int
	sent                  int
	answered              int // 200
	refused               int // 429, from llmq (the wait in place ran out, or an API limit)
	failed                int // anything else, or no answer
	skipped               int // not sent: maxSyncInFlight calls were in flight
	lat                   latencies
	first                 time.Time // the first call sent
	last                  time.Time // the last call sent
	firstReply, lastReply time.Time // the first and last answers read
}

// rate is C's answers a minute: the intervals between its answers over the
// time from its first answer to its last (the latency of a call moves both
// ends alike; an answer held back moves the last).
func (r *syncResult) rate() float64 {
	span := r.lastReply.Sub(r.firstReply)
	if r.answered < 2 || span <= 0 {
		return 0
	}
	return float64(r.answered-1) / span.Minutes()
}

// startSync starts C at rpm against base with key.
func startSync(ctx context.Context, hc *http.Client, base, key string, rpm int) *syncLoad {
	l := &syncLoad{stopped: make(chan struct{}), done: make(chan struct{}), res: syncResult{rpm: rpm}}
	interval := time.Minute / time.Duration(rpm)
	go func() {
		defer close(l.done)
		var wg sync.WaitGroup
		defer wg.Wait()
		slots := make(chan struct{}, maxSyncInFlight)
		start := time.Now()
		l.res.first = start
		t := time.NewTimer(0)
		defer t.Stop()
		for i := 0; ; i++ {
			// On a schedule of its own: a call late (a busy machine) is sent
			// at once, and the next ones catch up.
			t.Reset(time.Until(start.Add(time.Duration(i) * interval)))
			select {
			case <-l.stopped:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			select {
			case slots <- struct{}{}:
			default:
				l.mu.Lock()
				l.res.skipped++
				l.mu.Unlock()
				continue
			}
			l.mu.Lock()
			l.res.sent++
			l.res.last = time.Now()
			l.mu.Unlock()
			wg.Go(func() {
				defer func() { <-slots }()
				l.call(ctx, hc, base, key)
			})
		}
	}()
	return l
}

func (l *syncLoad) call(ctx context.Context, hc *http.Client, base, key string) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", bytes.NewReader(syncBody))
	if err != nil {
		l.fail(err)
		return
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	began := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		l.fail(err)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
		l.failLocked(err)
	case resp.StatusCode == http.StatusOK:
		l.res.answered++
		l.res.lat = append(l.res.lat, now.Sub(began))
		if l.res.firstReply.IsZero() || now.Before(l.res.firstReply) {
			l.res.firstReply = now
		}
		if now.After(l.res.lastReply) {
			l.res.lastReply = now
		}
	case resp.StatusCode == http.StatusTooManyRequests:
		l.res.refused++
	default:
		l.failLocked(fmt.Errorf("status %d: %.300s", resp.StatusCode, body))
	}
}

func (l *syncLoad) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failLocked(err)
}

func (l *syncLoad) failLocked(err error) {
	l.res.failed++
	if l.firstErr == nil {
		l.firstErr = err
	}
}

// stop sends no more calls, waits for those in flight and returns what C
// saw, and the first failure's error.
func (l *syncLoad) stop() (*syncResult, error) {
	close(l.stopped)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.res
	r.lat = slices.Clone(r.lat)
	slices.Sort(r.lat)
	return &r, l.firstErr
}

// latencies are request durations.
type latencies []time.Duration

// percentile of sorted latencies, nearest rank.
func (l latencies) percentile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	i := int(q*float64(len(l))+0.999999) - 1
	return l[min(max(i, 0), len(l)-1)]
}
