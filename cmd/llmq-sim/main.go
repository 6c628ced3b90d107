// Command llmq-sim serves the simulated provider of internal/llm/sim on a
// local address (OpenAI's chat completions, Responses API, embeddings, files
// and batches; Anthropic's Messages API), for integration tests, benchmarks
// and trying llmq without a provider account. Point a provider's base_url at the
// URL it prints; GET /sim/stats and GET /sim/admissions show what it
// admitted, GET /sim/bills what it billed for each call.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/llmq/llmq/internal/cmdline"
	"github.com/llmq/llmq/internal/llm/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	cmdline.Exit("llmq-sim", err)
}

// run serves the simulator until ctx ends. It prints the URL it listens on.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("llmq-sim", flag.ContinueOnError)
	var cfg sim.Config
	addr := fs.String("addr", "127.0.0.1:8089", "address to listen on (port 0 picks a free one)")
	fs.Int64Var(&cfg.Limits.RPM, "rpm", 0, "requests per minute per model (0: no limit)")
	fs.Int64Var(&cfg.Limits.TPM, "tpm", 0, "tokens per minute per model, prompt + max_tokens at admission (0: no limit)")
	fs.Int64Var(&cfg.Limits.RPD, "rpd", 0, "requests per day per model (0: no limit)")
	fs.Int64Var(&cfg.Limits.TPD, "tpd", 0, "tokens per day per model (0: no limit)")
	fs.Int64Var(&cfg.Limits.ITPM, "itpm", 0,
		"Anthropic's input tokens per minute per model, on /v1/messages: uncached input and cache writes, not cache reads (0: no limit)")
	fs.Int64Var(&cfg.Limits.OTPM, "otpm", 0,
		"Anthropic's output tokens per minute per model, on /v1/messages: max_tokens at admission, corrected to the output at the end (0: no limit)")
	fs.Int64Var(&cfg.CacheMinTokens, "cache-min-tokens", 1024, "shortest prompt prefix a cache_control breakpoint caches on /v1/messages")
	fs.BoolVar(&cfg.SharedBuckets, "shared", false, "one set of buckets for all models instead of one per model")
	fs.Int64Var(&cfg.DefaultMaxTokens, "default-max-tokens", 4096, "tokens charged per choice when a request has no max_tokens")
	fs.BoolVar(&cfg.WorstCase, "worst-case", false,
		"bill every call the most a provider may: each choice its whole output limit, every built-in tool call max_tool_calls allows (POST /sim/mode changes it)")
	fs.Int64Var(&cfg.ToolResultTokens, "tool-result-tokens", 1000, "with -worst-case, the tokens one built-in tool call's result adds to the turns after it")
	fs.BoolVar(&cfg.Refund, "refund", false, "give the unused part of max_tokens back when a call completes (default: kept charged, as OpenAI documents)")
	fs.DurationVar(&cfg.RefundDelay, "refund-delay", 0, "with -refund, how long after completion the refund comes")
	fs.Float64Var(&cfg.PromptFactor, "prompt-factor", 1, "tokens counted per prompt token of llmq's tokenizer (a model with another tokenizer)")
	fs.Int64Var(&cfg.External.TPM, "external-tpm", 0, "tokens per minute another application uses of the same account's limits")
	fs.Int64Var(&cfg.External.CallTokens, "external-call-tokens", 500, "size of each of the other application's calls")
	fs.StringVar(&cfg.HeadersAt, "headers-at", sim.HeadersAtAdmission, "when x-ratelimit-remaining-* are computed: admission or completion")
	fs.StringVar(&cfg.RateHeaders, "rate-headers", sim.HeadersAll,
		"rate-limit headers sent: all (OpenAI's), limits (x-ratelimit-limit-* only), none, azure (remaining counts only), azure-ptu (utilization) or anthropic")
	fs.Float64Var(&cfg.HeaderNoise, "header-noise", 0, "share of answers whose rate-limit headers are nonsense (-1 or 0), as some Azure deployments send")
	fs.StringVar(&cfg.RetryAfter, "retry-after", sim.RetryAfterMS, "how a 429 says when to retry: ms (retry-after-ms and retry-after), seconds, date or none")
	fs.DurationVar(&cfg.ShortWindow.Period, "window", 0, "also enforce the per-minute limits over windows this long, e.g. 1s or 10s (0: none)")
	fs.StringVar(&cfg.ShortWindow.Kind, "window-kind", sim.WindowBucket, "how -window counts: bucket (refilled continuously), fixed or sliding")
	fs.BoolVar(&cfg.ShortWindow.RequestsOnly, "window-requests-only", false, "with -window, limit only requests over it (as Azure documents its RPM)")
	fs.Float64Var(&cfg.Ramp.Growth, "ramp", 0,
		"limit how fast usage grows, as Anthropic's acceleration limits: at most this many times the previous 10 s window's tokens (0: no limit)")
	fs.DurationVar(&cfg.Latency, "latency", 0, "base time to answer an admitted request")
	fs.DurationVar(&cfg.Jitter, "jitter", 0, "uniform random time added to -latency")
	fs.DurationVar(&cfg.LatencyPerToken, "latency-per-token", 0, "time added per completion token")
	fs.Float64Var(&cfg.Faults.Rate429, "rate-429", 0, "fraction of requests answered 429 although under the limits")
	fs.Float64Var(&cfg.Faults.Rate500, "rate-500", 0, "fraction of requests answered 500")
	fs.Float64Var(&cfg.Faults.Rate529, "rate-529", 0, "fraction of requests answered as an overloaded platform: 529 overloaded_error on /v1/messages, 503 elsewhere")
	fs.Float64Var(&cfg.Faults.RateHang, "rate-hang", 0, "fraction of requests that hang")
	fs.Float64Var(&cfg.Faults.OmitUsage, "omit-usage", 0, "fraction of answers that carry no usage")
	fs.Float64Var(&cfg.Faults.StreamError, "stream-error", 0, "fraction of streamed answers that fail after their first content")
	fs.BoolVar(&cfg.Echo, "echo", false, "start each completion with the request's user field (for tests)")
	fs.DurationVar(&cfg.Faults.HangFor, "hang-for", 0, "how long a hung request waits before a 504 (0: until the client gives up)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of faults, latencies, completion lengths and embeddings")
	fs.IntVar(&cfg.EmbeddingDim, "embedding-dim", 64, "length of embeddings when the request asks no dimensions")
	fs.StringVar(&cfg.APIKey, "api-key", "", "key required of every request, to every path, /sim/ included (default: any)")
	fs.BoolVar(&cfg.RandomIDs, "random-ids", false, "draw ids from crypto/rand (default: from -seed and a counter, so a run repeats)")
	fs.IntVar(&cfg.StoredResponses, "stored-responses", 10_000, "how many /v1/responses answers are kept for GET /v1/responses/{id} and previous_response_id")
	fs.Float64Var(&cfg.Batch.LinesPerSecond, "batch-lines-per-second", 5000, "how fast a batch answers its lines (negative: all at once)")
	fs.DurationVar(&cfg.Batch.ValidatingFor, "batch-validating-for", 50*time.Millisecond, "how long a batch stays validating (negative: no time)")
	fs.DurationVar(&cfg.Batch.FinalizingFor, "batch-finalizing-for", 50*time.Millisecond, "how long a batch stays finalizing (negative: no time)")
	fs.DurationVar(&cfg.Batch.CancellingFor, "batch-cancelling-for", 100*time.Millisecond, "how long a cancelled batch stays cancelling (negative: no time)")
	fs.IntVar(&cfg.Batch.MaxLines, "batch-max-lines", 50_000, "most requests a batch input file may hold")
	fs.Int64Var(&cfg.Batch.MaxFileBytes, "batch-max-file-bytes", 200<<20, "largest file POST /v1/files takes")
	fs.Int64Var(&cfg.Batch.QueueLimit, "batch-queue-limit", 0, "batch queue limit per model: most prompt tokens its running batches may hold (0: no limit)")
	fs.Float64Var(&cfg.Batch.ExpireFraction, "batch-expire-fraction", 0, "share of every batch's lines left undone when it expires (0: batches complete)")
	fs.Float64Var(&cfg.Batch.FailRate, "batch-fail-rate", 0, "share of batches that fail (server_error) after validation, answering no line")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var help strings.Builder
	help.WriteString("usage: llmq-sim [FLAGS]\n  Serves the simulated provider until SIGINT or SIGTERM:\n" +
		"  /v1/chat/completions, /v1/responses, /v1/embeddings, /v1/files and /v1/batches\n  (and Azure OpenAI's paths under /openai),\n" +
		"  and Anthropic's /v1/messages (x-api-key and anthropic-version required).\n" +
		"  To play Anthropic, set its limits: -rpm, -itpm and -otpm (and -ramp, -rate-529);\n" +
		"  /v1/messages always answers with Anthropic's headers and errors.\n\nFlags:\n")
	fs.SetOutput(&help)
	fs.PrintDefaults()
	if done, err := cmdline.ParseProgram(fs, args, stdout, help.String(), "llmq-sim"); done {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return cmdline.Usagef("-log-level: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = logger

	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", *addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	s := sim.New(cfg)
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	url := "http://" + ln.Addr().String()
	fmt.Fprintf(stdout, "llmq-sim listening on %s (OpenAI base URL %s/v1)\n", url, url)
	logger.Info("llmq-sim started", "addr", ln.Addr().String(), "rpm", cfg.Limits.RPM, "tpm", cfg.Limits.TPM,
		"itpm", cfg.Limits.ITPM, "otpm", cfg.Limits.OTPM)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// End hung and slow requests first, so shutdown does not wait for them.
	s.Close()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
