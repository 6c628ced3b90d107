// Command sync measures what llmq adds to a synchronous OpenAI call at light
// load: the same simulated provider is called directly and through llmq's
// POST /v1/chat/completions, alternately, one call at a time, in one run.
// It reports p50 and p99 of whole non-streamed calls and p50 of the time to
// the first streamed chunk, for both paths and their difference
// (docs/BENCHMARKS.md).
//
// Usage: go -C bench run ./sync [-n 300] [-latency 20ms]
//
// It needs Redis and PostgreSQL (LLMQ_BENCH_REDIS_URL, LLMQ_BENCH_DATABASE_URL,
// defaulting to the local test services) and uses Redis DB 10 of it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/llm/sim"
)

// redisDB is bench/'s Redis database (docs/ARCHITECTURE.md).
const redisDB = 10

const policyYAML = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 10s
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 10000000, tpm: 10000000000}
    max_output_tokens: 1024
tiers:
  - name: bench
    daily_budget_usd: 1000000
    priority: default
    on_exhausted: defer
    api_rps: 1000000
  - name: bench-critical
    daily_budget_usd: 1000000
    priority: critical
    on_exhausted: defer
    api_rps: 1000000
`

var chatBody = []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":16}`)
var streamBody = []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":16,"stream":true}`)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sync:", err)
		os.Exit(1)
	}
}

type options struct {
	n, clients, rpm, backlog int
	loadFor                  time.Duration
	providers                []string

	latency, perToken     time.Duration
	redisURL, databaseURL string
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sync", flag.ContinueOnError)
	fs.SetOutput(stdout)
	o := options{}
	fs.IntVar(&o.n, "n", 300, "calls per path and kind")
	fs.DurationVar(&o.latency, "latency", 20*time.Millisecond, "the simulator's latency before the first token")
	fs.DurationVar(&o.perToken, "per-token", 500*time.Microsecond, "the simulator's time per completion token")
	fs.IntVar(&o.clients, "load-clients", 200, "synchronous clients of the under-load row; 0 skips it")
	fs.DurationVar(&o.loadFor, "load-for", 20*time.Second, "how long the under-load row runs")
	fs.IntVar(&o.rpm, "load-rpm", 1200, "the model's requests per minute in the under-load row (the simulator's and the policy's)")
	fs.IntVar(&o.backlog, "load-backlog", 5000, "async jobs queued before the under-load row starts")
	providers := fs.String("load-providers", "minute,window-1s,azure-10s", "the under-load rows' providers, of minute, window-1s, azure-10s")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || o.n < 1 {
		return errors.New("usage: sync [-n N>0] [-latency D] [-per-token D]")
	}
	for _, p := range strings.Split(*providers, ",") {
		if !slices.ContainsFunc(loadProviders, func(l loadProvider) bool { return l.name == p }) {
			return fmt.Errorf("-load-providers: unknown provider %q", p)
		}
		o.providers = append(o.providers, p)
	}
	o.redisURL = benchenv.EnvOr("LLMQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379")
	o.databaseURL = benchenv.EnvOr("LLMQ_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")

	ss := sim.Start(sim.Config{Limits: sim.Limits{RPM: 10_000_000, TPM: 10_000_000_000}, DefaultMaxTokens: 1024,
		Latency: o.latency, LatencyPerToken: o.perToken, CompletionMin: 1, CompletionMax: 1})
	defer ss.Close()
	llmqURL, key, _, stop, err := startLLMQ(ctx, o, ss.BaseURL, policyYAML)
	if err != nil {
		return err
	}
	defer stop()

	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	direct := target{url: ss.BaseURL, auth: "Bearer bench"}
	via := target{url: llmqURL + "/v1", auth: "Bearer " + key}
	// Warm both paths: connections, caches, the policy's tokenizer.
	for range 20 {
		for _, t := range []target{direct, via} {
			if _, _, err := call(ctx, hc, t, chatBody, false); err != nil {
				return err
			}
		}
	}
	var whole, first [2]latencies
	for i := range o.n {
		for k, t := range []target{direct, via} {
			d, _, err := call(ctx, hc, t, chatBody, false)
			if err != nil {
				return fmt.Errorf("call %d: %w", i, err)
			}
			whole[k] = append(whole[k], d)
			_, f, err := call(ctx, hc, t, streamBody, true)
			if err != nil {
				return fmt.Errorf("stream %d: %w", i, err)
			}
			first[k] = append(first[k], f)
		}
	}
	for k := range 2 {
		slices.Sort(whole[k])
		slices.Sort(first[k])
	}
	fmt.Fprintf(stdout, "light load: %d calls per row, one at a time; simulator latency %s + %s/token, 16 tokens\n\n", o.n, o.latency, o.perToken)
	fmt.Fprintf(stdout, "| | direct | through llmq | llmq adds |\n|---|---|---|---|\n")
	row := func(name string, l [2]latencies, q float64) {
		a, b := l[0].percentile(q), l[1].percentile(q)
		fmt.Fprintf(stdout, "| %s | %s | %s | %s |\n", name, ms(a), ms(b), ms(b-a))
	}
	row("non-streamed call, p50", whole, 0.5)
	row("non-streamed call, p99", whole, 0.99)
	row("first streamed chunk, p50", first, 0.5)
	row("first streamed chunk, p99", first, 0.99)
	if o.clients > 0 {
		return underLoad(ctx, o, stdout)
	}
	return nil
}

type target struct{ url, auth string }

// call sends one chat request and returns how long the whole answer took
// and, for a stream, how long its first chunk took.
func call(ctx context.Context, hc *http.Client, t target, body []byte, stream bool) (whole, first time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, "POST", t.url+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", t.auth)
	req.Header.Set("Content-Type", "application/json")
	began := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return 0, 0, fmt.Errorf("%s: %d %s", t.url, resp.StatusCode, b)
	}
	if !stream {
		var v struct {
			Object string `json:"object"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Object != "chat.completion" {
			return 0, 0, fmt.Errorf("%s: not a chat completion (%v)", t.url, err)
		}
		return time.Since(began), 0, nil
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if first == 0 {
			first = time.Since(began)
		}
		if line == "data: [DONE]" {
			done = true
		}
	}
	if !done {
		return 0, 0, fmt.Errorf("%s: stream ended without [DONE] (%v)", t.url, sc.Err())
	}
	return time.Since(began), first, nil
}

// startLLMQ runs llmq's dispatcher in this process (API, scheduler, the
// synchronous path) over a fresh schema and key prefix.
func startLLMQ(ctx context.Context, o options, simURL, policy string) (base, key string, a *app.App, stop func(), err error) {
	var closers benchenv.Closers
	stop = closers.Close
	defer func() {
		if err != nil {
			closers.Close() // stop is nil by now: each return that fails clears it
		}
	}()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	l, err := inproc.Open(ctx, inproc.Options{Backends: benchenv.Backends{RedisURL: o.redisURL, RedisDB: redisDB, DatabaseURL: o.databaseURL},
		Name: "sync", Policy: policy, SimURL: simURL,
		Environ: benchenv.Environ{Concurrency: 50, ShutdownTimeout: 5 * time.Second, Extra: []string{"LLMQ_LOG_LEVEL=error"}}}, logger, &closers)
	if err != nil {
		return "", "", nil, nil, err
	}
	a = l.App
	var closeAPI func()
	if base, closeAPI, err = inproc.ServeAPI(a); err != nil {
		return "", "", nil, nil, err
	}
	closers = append(closers, closeAPI)
	// The scheduler releases async jobs from the fair queue, as in every
	// dispatcher.
	closers = append(closers, inproc.Loops(a.Scheduler().Run))
	key, err = createKey(ctx, base, "bench")
	return base, key, a, stop, err
}

func createKey(ctx context.Context, base, tier string) (string, error) {
	post := func(path, body string, out any) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+benchenv.AdminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		return json.Unmarshal(b, out)
	}
	var t struct{ ID string }
	if err := post("/admin/v1/tenants", `{"name":"bench-`+tier+`","tier":"`+tier+`"}`, &t); err != nil {
		return "", err
	}
	var k struct{ Key string }
	if err := post("/admin/v1/tenants/"+url.PathEscape(t.ID)+"/keys", `{}`, &k); err != nil {
		return "", err
	}
	return k.Key, nil
}

type latencies []time.Duration

// percentile of sorted latencies, nearest rank.
func (l latencies) percentile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	i := int(q*float64(len(l))+0.999999) - 1
	return l[min(max(i, 0), len(l)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
