package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

// scenario is one row of the benchmark: how the simulated provider counts,
// and who calls it (llmq's workers with a policy at some multiple of the
// provider's limits, or a baseline).
type scenario struct {
	name string
	// provider says in a few words how the provider counts.
	provider string
	// caller is llmq or one of the baselines.
	caller caller
	// policy is the policy's limits as a multiple of the provider's (llmq).
	policy int64
	// The simulator's mode (sim.Config): unused tokens refunded at
	// completion, prompts counted promptFactor times (1: as llmq does),
	// another application on the account using externalShare of its TPM,
	// the limits enforced over a shorter window too, the rate-limit headers
	// it sends (with headerNoise of them nonsense) and the form of a 429's
	// wait.
	refund        bool
	promptFactor  float64
	externalShare float64
	window        sim.ShortWindow
	headers       string
	headerNoise   float64
	retryAfter    string
	// shape is the request mix, responses the share of its requests sent
	// to the Responses API (-responses; 0: chat completions only).
	shape     shape
	responses float64
	// target is the row for llmq; zero for the baselines.
	target target
}

type caller int

const (
	callerLLMQ  caller = iota
	callerRetry        // no limiter, sleep the retry-after of a 429
	callerLocal        // an in-memory token bucket per process
)

// target is what a scenario must show: at least used of the provider's TPM
// in the steady state (with account, the external application's tokens
// count too) and fewer than limited of llmq's calls answered 429 over the
// whole run, its first seconds included.
type target struct {
	used, limited float64
	account       bool
}

func (t target) isZero() bool { return t == target{} }

// externalCallTokens is the size of each call of the external application.
const externalCallTokens = 500

// scenarios are every scenario, in the order they run: the rows of issue
// 12's table, those of issue 30's (limits also enforced over shorter
// windows, Azure's headers, no headers at all), then the two baselines
// against the provider that keeps max_tokens charged (OpenAI's documented
// admission).
var scenarios = []scenario{
	{name: "keep", provider: "keeps max_tokens charged", policy: 1, shape: usualShape,
		target: target{used: 0.95, limited: 0.005}},
	{name: "refund", provider: "refunds unused tokens", policy: 1, refund: true, shape: usualShape,
		target: target{used: 0.95, limited: 0.005}},
	{name: "tokens-1.6x", provider: "counts prompts 1.6x (long prompts)", policy: 1, promptFactor: 1.6, shape: longShape,
		target: target{used: 0.90, limited: 0.005}},
	{name: "2x-keep", provider: "keeps max_tokens charged", policy: 2, shape: usualShape,
		target: target{used: 0.90, limited: 0.02}},
	{name: "2x-refund", provider: "refunds unused tokens", policy: 2, refund: true, shape: usualShape,
		target: target{used: 0.90, limited: 0.02}},
	{name: "shared", provider: "keeps max_tokens; 30% used elsewhere", policy: 1, externalShare: 0.3, shape: usualShape,
		target: target{used: 0.90, limited: 0.005, account: true}},
	{name: "window-10s", provider: "keeps max_tokens; limits also over 10 s", policy: 1, shape: usualShape,
		window: sim.ShortWindow{Period: 10 * time.Second}, target: target{used: 0.90, limited: 0.01}},
	{name: "window-1s", provider: "keeps max_tokens; limits also over 1 s", policy: 1, shape: usualShape,
		window: sim.ShortWindow{Period: time.Second}, target: target{used: 0.90, limited: 0.01}},
	{name: "azure-10s", provider: "Azure's headers (10% nonsense); limits also over fixed 10 s windows", policy: 1, shape: usualShape,
		window: sim.ShortWindow{Period: 10 * time.Second, Kind: sim.WindowFixed}, headers: sim.HeadersAzure, headerNoise: 0.1,
		target: target{used: 0.90, limited: 0.01}},
	{name: "no-headers", provider: "no rate-limit headers; a 429 says retry-after in seconds", policy: 1, shape: usualShape,
		headers: sim.HeadersNone, retryAfter: sim.RetryAfterSeconds, target: target{used: 0.95, limited: 0.005}},
	{name: "no-headers-2x", provider: "no rate-limit headers; a 429 says retry-after in seconds", policy: 2, shape: usualShape,
		headers: sim.HeadersNone, retryAfter: sim.RetryAfterSeconds, target: target{used: 0.85, limited: 0.02}},
	{name: "retry", provider: "keeps max_tokens charged", caller: callerRetry, shape: usualShape},
	{name: "local", provider: "keeps max_tokens charged", caller: callerLocal, shape: usualShape},
}

// aliases are the names the first two scenarios had before the provider's
// modes, so that earlier commands still run.
var aliases = map[string]string{"llmq": "keep", "llmq-2x": "2x-keep"}

func scenarioNames() string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return strings.Join(names, ",")
}

func findScenario(name string) (scenario, bool) {
	if a, ok := aliases[name]; ok {
		name = a
	}
	for _, s := range scenarios {
		if s.name == name {
			return s, true
		}
	}
	return scenario{}, false
}

// factor is the prompt factor as the simulator takes it (1 when unset).
func (s scenario) factor() float64 {
	if s.promptFactor == 0 {
		return 1
	}
	return s.promptFactor
}

// external is the external application's TPM on a provider of tpm.
func (s scenario) external(tpm int64) int64 { return int64(s.externalShare * float64(tpm)) }

// replayable reports whether the admission log holds every change of the
// provider's TPM bucket: the external application's calls are not logged.
func (s scenario) replayable() bool { return s.externalShare == 0 }

// label names the scenario in the progress lines and the table: its name,
// with its share of Responses API requests when it has one.
func (s scenario) label() string {
	if s.responses == 0 {
		return s.name
	}
	return fmt.Sprintf("%s (%s Responses)", s.name, pct0(s.responses))
}

// fileName is the label as a file name: "keep", "keep-responses-50".
func (s scenario) fileName() string {
	if s.responses == 0 {
		return s.name
	}
	return fmt.Sprintf("%s-responses-%.0f", s.name, 100*s.responses)
}

// title is the scenario as its progress line and timeline name it.
func (s scenario) title() string {
	var t string
	switch s.caller {
	case callerRetry:
		t = "baseline: retry after retry-after, no limiter; provider " + s.provider
	case callerLocal:
		t = "baseline: a local token bucket per process; provider " + s.provider
	default:
		t = fmt.Sprintf("llmq, policy = %s; provider %s", s.policyName(), s.provider)
	}
	if s.responses > 0 {
		t += fmt.Sprintf("; %s of requests to %s", pct0(s.responses), llm.EndpointResponses)
	}
	return t
}

func (s scenario) policyName() string {
	switch {
	case s.caller != callerLLMQ:
		return "-"
	case s.policy == 1:
		return "limits"
	}
	return fmt.Sprintf("%dx limits", s.policy)
}

// simConfig is the simulator of the scenario, with the run's limits, latency
// and completion lengths.
func (s scenario) simConfig(o *options) sim.Config {
	c := sim.Config{
		Limits:        sim.Limits{RPM: o.RPM, TPM: o.TPM},
		Latency:       o.Latency,
		Jitter:        o.Jitter,
		Seed:          o.Seed,
		CompletionMin: completionMin,
		CompletionMax: completionMax,
		LogSize:       logSize,
		Refund:        s.refund,
		PromptFactor:  s.promptFactor,
		ShortWindow:   s.window,
		RateHeaders:   s.headers,
		HeaderNoise:   s.headerNoise,
		RetryAfter:    s.retryAfter,
	}
	if x := s.external(o.TPM); x > 0 {
		c.External = sim.External{TPM: x, CallTokens: externalCallTokens}
	}
	return c
}

// startSim starts a fresh simulated provider in the scenario's mode.
func startSim(o *options, s scenario) *sim.TestServer { return sim.Start(s.simConfig(o)) }

// firstWindow is the start of a scenario reported apart: its first minute,
// or less when the steady state starts sooner.
func firstWindow(o *options) time.Duration { return min(time.Minute, o.Warmup) }
