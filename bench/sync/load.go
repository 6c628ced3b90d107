package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/internal/llm/sim"
)

type loadProvider struct {
	name, what string
	mode       func(*sim.Config)
}

// loadProviders are the providers of the under-load rows: one that counts
// over the minute only, and two of issue 30's, which also count over a
// shorter window.
var loadProviders = []loadProvider{
	{"minute", "counting over the minute", func(*sim.Config) {}},
	{"window-1s", "also counting over 1 s windows", func(c *sim.Config) { c.ShortWindow = sim.ShortWindow{Period: time.Second} }},
	{"azure-10s", "with Azure's headers (10% nonsense) and fixed 10 s windows", func(c *sim.Config) {
		c.ShortWindow = sim.ShortWindow{Period: 10 * time.Second, Kind: sim.WindowFixed}
		c.RateHeaders, c.HeaderNoise = sim.HeadersAzure, 0.1
	}},
}

// underLoad runs the under-load row against each provider of
// loadProviders: a backlog of async jobs with workers draining it, then
// clients synchronous callers in a loop, all against one model held at its
// limit (the simulator's limits are the policy's). It reports the
// provider's 429s, the callers' latency, and who got the model's calls
// while the callers ran.
func underLoad(ctx context.Context, o options, stdout io.Writer) error {
	for _, p := range loadProviders {
		if !slices.Contains(o.providers, p.name) {
			continue
		}
		cfg := sim.Config{Limits: sim.Limits{RPM: int64(o.rpm), TPM: 10_000_000_000}, DefaultMaxTokens: 1024,
			Latency: o.latency, LatencyPerToken: o.perToken, CompletionMin: 1, CompletionMax: 1}
		p.mode(&cfg)
		fmt.Fprintf(stdout, "\nunder load, a provider %s:\n", p.what)
		if err := underLoadOne(ctx, o, cfg, stdout); err != nil {
			return fmt.Errorf("under load, %s: %w", p.name, err)
		}
	}
	return nil
}

func underLoadOne(ctx context.Context, o options, cfg sim.Config, stdout io.Writer) error {
	ss := sim.Start(cfg)
	defer ss.Close()
	policy := strings.Replace(policyYAML, "rpm: 10000000,", "rpm: "+strconv.Itoa(o.rpm)+",", 1)
	base, key, a, stop, err := startLLMQ(ctx, o, ss.BaseURL, policy)
	if err != nil {
		return err
	}
	defer stop()
	shutdown, err := inproc.StartWorker(a)
	if err != nil {
		return err
	}
	defer shutdown()

	tr := &http.Transport{MaxIdleConnsPerHost: o.clients + 16}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	job := []byte(`{"body":` + string(chatBody) + `}`)
	for i := 0; i < o.backlog; i += 500 {
		var wg sync.WaitGroup
		var failed atomic.Int64
		for range min(500, o.backlog-i) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/jobs", bytes.NewReader(job))
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := hc.Do(req)
				if err != nil || resp.StatusCode != http.StatusAccepted {
					failed.Add(1)
				}
				if resp != nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		if failed.Load() > 0 {
			return fmt.Errorf("%d async jobs not accepted", failed.Load())
		}
	}
	// Let the backlog drain the model's buckets: async jobs then finish at
	// the model's limit, and only about a second of them is released ahead.
	perSecond := o.rpm / 60
	asyncBefore, err := succeeded(ctx, hc, base, key)
	if err != nil {
		return err
	}
	for range 60 {
		time.Sleep(time.Second)
		n, err := succeeded(ctx, hc, base, key)
		if err != nil {
			return err
		}
		steady := n-asyncBefore <= perSecond*3/2 && n > 0
		asyncBefore = n
		if steady {
			break
		}
	}
	before := ss.Stats()
	critical, err := createKey(ctx, base, "bench-critical")
	if err != nil {
		return err
	}
	// Half the callers are of a critical tenant, half of the backlog's
	// (default priority): the critical ones go first.
	vias := [2]target{{url: base + "/v1", auth: "Bearer " + key}, {url: base + "/v1", auth: "Bearer " + critical}}
	var (
		mu       sync.Mutex
		byPrio   [2]latencies
		lat      latencies
		refused  atomic.Int64
		errs     atomic.Int64
		firstErr atomic.Value
	)
	end := time.Now().Add(o.loadFor)
	var wg sync.WaitGroup
	for i := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				d, status, err := syncCall(ctx, hc, vias[i%2])
				switch {
				case err != nil:
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case status == http.StatusTooManyRequests:
					refused.Add(1)
				default:
					mu.Lock()
					lat = append(lat, d)
					byPrio[i%2] = append(byPrio[i%2], d)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	after := ss.Stats()
	asyncAfter, err := succeeded(ctx, hc, base, key)
	if err != nil {
		return err
	}
	if waiting := o.backlog - asyncAfter; waiting <= 0 {
		return fmt.Errorf("the async backlog ran out during the row (%d jobs): raise -load-backlog", o.backlog)
	}
	if errs.Load() > 0 {
		return fmt.Errorf("%d synchronous calls failed, first: %v", errs.Load(), firstErr.Load())
	}
	slices.Sort(lat)
	slices.Sort(byPrio[0])
	slices.Sort(byPrio[1])
	calls := after.Requests - before.Requests
	limited := after.RateLimited - before.RateLimited
	async := asyncAfter - asyncBefore
	fmt.Fprintf(stdout, "\nunder load: %d synchronous clients for %s against a model at %d RPM, with %d async jobs queued first\n\n",
		o.clients, o.loadFor, o.rpm, o.backlog)
	fmt.Fprintf(stdout, "| provider calls | provider 429s | sync answered | sync refused (429, wait over) | async jobs done meanwhile | sync share of calls | sync p50 | sync p99 |\n|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(stdout, "| %d | %d (%.2f%%) | %d | %d | %d | %.1f%% | %s | %s |\n", calls, limited, 100*float64(limited)/float64(max(calls, 1)),
		len(lat), refused.Load(), async, 100*float64(len(lat))/float64(max(int64(len(lat))+int64(async), 1)), ms(lat.percentile(0.5)), ms(lat.percentile(0.99)))
	fmt.Fprintf(stdout, "\n| callers' priority | answered | p50 | p99 |\n|---|---|---|---|\n")
	for k, name := range []string{"default (the backlog's)", "critical"} {
		fmt.Fprintf(stdout, "| %s | %d | %s | %s |\n", name, len(byPrio[k]), ms(byPrio[k].percentile(0.5)), ms(byPrio[k].percentile(0.99)))
	}
	return nil
}

// syncCall is one non-streamed call; a 429 is a status, not an error.
func syncCall(ctx context.Context, hc *http.Client, t target) (time.Duration, int, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", t.url+"/chat/completions", bytes.NewReader(chatBody))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", t.auth)
	began := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	return time.Since(began), resp.StatusCode, nil
}

// succeeded counts the tenant's succeeded async jobs.
func succeeded(ctx context.Context, hc *http.Client, base, key string) (int, error) {
	n, after := 0, ""
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/jobs?status=succeeded&limit=1000"+after, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		var page struct {
			Data []struct {
				ID   string `json:"id"`
				Sync bool   `json:"sync"`
			} `json:"data"`
			HasMore bool `json:"has_more"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			return 0, err
		}
		for _, j := range page.Data {
			if !j.Sync {
				n++
			}
		}
		if !page.HasMore || len(page.Data) == 0 {
			return n, nil
		}
		after = "&after=" + page.Data[len(page.Data)-1].ID
	}
}
