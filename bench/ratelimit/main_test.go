package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs every scenario for a few seconds with few callers: worker
// processes, producers, baselines, the timelines and the table; and llmq and
// a baseline with half their requests sent to the Responses API. The groups
// run at once whatever -test.parallel says, most of their time being waits
// (a run's CPU is about a third of its time).
func TestRun(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	for _, c := range []struct {
		names     []string
		responses float64
	}{
		{[]string{"keep", "refund", "tokens-1.6x", "retry"}, 0},
		{[]string{"2x-keep", "2x-refund", "shared", "local"}, 0},
		{[]string{"azure-10s", "no-headers-2x"}, 0},
		{[]string{"keep", "local"}, 0.5},
	} {
		wg.Go(func() {
			t.Run(fmt.Sprintf("%s,responses=%g", strings.Join(c.names, ","), c.responses), func(t *testing.T) {
				testRun(t, c.names, c.responses)
			})
		})
	}
	wg.Wait()
}

// completedLine reads a timeline's line of what completed: "6 jobs
// completed (3 of them to /v1/responses), 0 failed; ...".
var completedLine = regexp.MustCompile(`(?m)^  (\d+) (?:jobs|requests) completed(?: \((\d+) of them to /v1/responses\))?, (\d+) failed;`)

func testRun(t *testing.T, names []string, responses float64) {
	var out bytes.Buffer
	args := []string{"-duration", "2s", "-warmup", "1s", "-interval", "1s", "-processes", "2", "-concurrency", "3",
		"-scenarios", strings.Join(names, ","), "-responses", fmt.Sprint(responses)}
	if err := run(t.Context(), args, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	got := out.String()
	var want []string
	llmq := 0
	for _, name := range names {
		sc, _ := findScenario(name)
		sc.responses = responses
		want = append(want, sc.label()+": "+sc.title()+" ...")
		if sc.caller == callerLLMQ {
			llmq++
			if sc.headers == sim.HeadersNone {
				// nothing announces the limit: the policy's stands
				want = append(want, sc.label()+": llmq learned: tpm limit")
			} else {
				want = append(want, sc.label()+": llmq learned: tpm limit 60000")
			}
		}
		switch {
		case sc.name == "tokens-1.6x":
			want = append(want, "request mix of tokens-1.6x: prompt 800-1600 words", "as the provider counts it (1.6x)")
		case sc.name == "shared":
			want = append(want, "by the external app", "no bucket replay: the external application's calls are not in the simulator's admission log")
		case sc.caller == callerLLMQ && sc.headers != sim.HeadersNone:
			want = append(want, "llmq bucket - provider's")
		}
	}
	want = append(want, "llmq's targets (TPM used in the steady state, 429s over the whole run): ", fmt.Sprintf(" of %d met", llmq))
	if responses > 0 {
		want = append(want, "Responses API: ", "% Responses)")
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
	// Every scenario completed some of its requests; with a share of them
	// sent to the Responses API, some of those too, and none failed
	// (llmq's jobs, whose bodies its admission and worker must take).
	done := completedLine.FindAllStringSubmatch(got, -1)
	if len(done) != len(names) {
		t.Errorf("%d lines of what completed, want %d:\n%s", len(done), len(names), got)
	}
	for _, m := range done {
		completed, resp, failed := m[1], m[2], m[3]
		switch {
		case completed == "0":
			t.Errorf("a scenario completed nothing:\n%s", got)
		case responses == 0 && resp != "":
			t.Errorf("chat-only run: %q", m[0])
		case responses > 0 && (resp == "" || resp == "0" || failed != "0"):
			t.Errorf("%g of the requests to the Responses API: %q; want some of them completed, none failed", responses, m[0])
		}
	}
	// The table has a first-minute and a steady-state line per scenario,
	// the latter with the target of each of llmq's.
	table := tableOf(got)
	for _, name := range names {
		sc, _ := findScenario(name)
		line := tableLine(table, sc.name)
		if line == "" {
			t.Errorf("no line for %s in the table:\n%s", sc.name, table)
			continue
		}
		if !strings.Contains(line, sc.provider) || !strings.Contains(line, "0-1s") {
			t.Errorf("line of %s lacks its provider or first window: %q", sc.name, line)
		}
	}
	if n := strings.Count(table, "1-2s"); n != len(names) {
		t.Errorf("%d steady-state lines, want %d:\n%s", n, len(names), table)
	}
	if n := strings.Count(table, " met\n") + strings.Count(table, " MISSED\n"); n != llmq {
		t.Errorf("%d verdicts, want %d (one per llmq scenario):\n%s", n, llmq, table)
	}
}

// tableOf is the final table of out: from its header to the next blank line.
func tableOf(out string) string {
	var b strings.Builder
	in := false
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		switch {
		case !in && len(f) > 2 && f[0] == "scenario" && f[1] == "provider":
			in = true
		case in && len(f) == 0:
			return b.String()
		case in:
			b.WriteString(line)
		}
	}
	return b.String()
}

// tableLine is the line of table whose first column is name.
func tableLine(table, name string) string {
	for line := range strings.Lines(table) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return line
		}
	}
	return ""
}

func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"-duration", "0"}, "-duration"},
		{[]string{"-warmup", "5m"}, "-warmup"},
		{[]string{"-processes", "0"}, "-processes"},
		{[]string{"-concurrency", "0"}, "-concurrency"},
		{[]string{"-rpm", "0"}, "-rpm"},
		{[]string{"-tpm", "100"}, "-tpm"},
		// The long mix's largest request, as the provider counts it, needs more.
		{[]string{"-tpm", "4000", "-scenarios", "tokens-1.6x"}, "tokens-1.6x"},
		// The external application's calls must fit its backlog.
		{[]string{"-tpm", "10000", "-scenarios", "shared"}, "shared"},
		{[]string{"-latency", "-1s"}, "-latency"},
		{[]string{"-interval", "500ms"}, "-interval"},
		{[]string{"-redis-db", "-1"}, "-redis-db"},
		{[]string{"-scenarios", "keep,nope"}, `-scenarios: unknown scenario "nope"`},
		{[]string{"-responses", "0,1.5"}, "-responses"},
		{[]string{"-responses", "half"}, "-responses"},
		{[]string{"-duration", "soon"}, "-duration"},
		{[]string{"extra"}, "extra"},
	} {
		var out bytes.Buffer
		err := run(t.Context(), c.args, &out)
		if err == nil || !strings.Contains(err.Error()+out.String(), c.flag) {
			t.Errorf("run %q: error %v, output %q; want one naming %s", c.args, err, out.String(), c.flag)
		}
	}
}

// The scenarios' names as they were before the provider's modes still run
// what they ran; -scenarios keeps its order and drops repeats.
func TestScenarioNames(t *testing.T) {
	o, err := parseOptions([]string{"-scenarios", "llmq-2x, llmq,keep,shared"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sc := range o.Scenarios {
		names = append(names, sc.name)
	}
	if got := strings.Join(names, ","); got != "2x-keep,keep,shared" {
		t.Errorf("scenarios %s, want 2x-keep,keep,shared", got)
	}
	if o.Duration != 150*time.Second || o.Warmup != 90*time.Second || o.RPM != 600 || o.TPM != 60_000 || o.Processes != 4 || o.Concurrency != 50 {
		t.Errorf("defaults %+v, want the issue's", o)
	}
	// Each scenario runs once per share of Responses API requests, in order.
	o, err = parseOptions([]string{"-scenarios", "keep,retry", "-responses", "0, 0.5,0"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, sc := range o.runs() {
		labels = append(labels, sc.label())
	}
	if got, want := strings.Join(labels, ","), "keep,keep (50% Responses),retry,retry (50% Responses)"; got != want {
		t.Errorf("runs %s, want %s", got, want)
	}
	o, err = parseOptions([]string{"-quick"}, &bytes.Buffer{})
	if err != nil || o.Duration != 30*time.Second || o.Warmup != 10*time.Second || len(o.Scenarios) != len(scenarios) || len(o.runs()) != len(scenarios) {
		t.Errorf("-quick: %+v, %v", o, err)
	}
}

// Each scenario's simulator is in the mode of its row of the issue.
func TestScenarioModes(t *testing.T) {
	o, err := parseOptions(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range o.Scenarios {
		c := sc.simConfig(o)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", sc.name, err)
		}
		if c.Limits != (sim.Limits{RPM: 600, TPM: 60_000}) || c.Latency != 200*time.Millisecond || c.Jitter != 600*time.Millisecond {
			t.Errorf("%s: limits %+v, latency %v + %v", sc.name, c.Limits, c.Latency, c.Jitter)
		}
		switch sc.name {
		case "refund", "2x-refund":
			if !c.Refund || c.PromptFactor != 0 || c.External.TPM != 0 {
				t.Errorf("%s: %+v", sc.name, c)
			}
		case "tokens-1.6x":
			if c.Refund || c.PromptFactor != 1.6 || sc.shape != longShape {
				t.Errorf("%s: %+v", sc.name, c)
			}
		case "shared":
			if c.Refund || c.External != (sim.External{TPM: 18_000, CallTokens: 500}) || sc.replayable() || !sc.target.account {
				t.Errorf("%s: %+v", sc.name, c)
			}
		default:
			if c.Refund || c.PromptFactor != 0 || c.External.TPM != 0 || !sc.replayable() {
				t.Errorf("%s: %+v", sc.name, c)
			}
		}
		if want := int64(1 + strings.Count(sc.name, "2x")); sc.caller == callerLLMQ && sc.policy != want {
			t.Errorf("%s: policy %dx, want %dx", sc.name, sc.policy, want)
		}
	}
}

// TestReplayTPM checks the replay against a bucket worked by hand: 60,000
// TPM (1,000 tokens/s), full at start, all of it taken at 1s, half of it
// refunded at 2s.
func TestReplayTPM(t *testing.T) {
	start := time.Unix(1000, 0)
	log := []sim.Admission{{Time: start.Add(time.Second), Tokens: 60_000, Outcome: sim.Admitted,
		Refunded: 30_000, RefundedAt: start.Add(2 * time.Second)},
		{Time: start.Add(1500 * time.Millisecond), Tokens: 99_999, Outcome: sim.RateLimited}}
	bins := replayTPM(log, 60_000, start, []time.Duration{0, time.Second, 3 * time.Second})
	if len(bins) != 2 {
		t.Fatalf("got %d bins, want 2", len(bins))
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// Full for the first second: its whole refill is lost.
	near("bin 0 lost", bins[0].lost, 1000)
	near("bin 0 mean level", bins[0].levelSeconds, 60_000)
	if bins[0].full != time.Second {
		t.Errorf("bin 0 full for %v, want 1s", bins[0].full)
	}
	// Empty at 1s, 1,000 at 2s, 31,000 after the refund, 32,000 at 3s.
	near("bin 1 lost", bins[1].lost, 0)
	near("bin 1 level·s", bins[1].levelSeconds, 500+31_500)

	levels := tpmLevels(log, 60_000, start, []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 2500 * time.Millisecond})
	for i, want := range []float64{60_000, 500, 31_500} {
		near("level", levels[i], want)
	}
}

// TestBetween checks a window's figures from the counters at its edges.
func TestBetween(t *testing.T) {
	r := &result{
		samples: []sample{
			{at: 0, st: sim.Stats{}},
			{at: time.Minute, st: sim.Stats{Requests: 100, Admitted: 90, RateLimited: 10, TokensAdmitted: 200_000, TokensRefunded: 20_000,
				ExternalTokens: 10_000}},
			{at: 2 * time.Minute, st: sim.Stats{Requests: 300, Admitted: 240, RateLimited: 60, TokensAdmitted: 400_000, TokensRefunded: 70_000,
				ExternalTokens: 55_000, ExternalRequests: 90}},
		},
		completions: []time.Duration{time.Second, 61 * time.Second, 90 * time.Second},
	}
	w := r.between(time.Minute+100*time.Millisecond, 2*time.Minute)
	// The external application's calls count apart, never as calls.
	if w.from != time.Minute || w.used != 150_000 || w.external != 45_000 || w.calls != 200 || w.limited != 50 || w.completions != 2 {
		t.Fatalf("window = %+v", w)
	}
	if got := w.usedShare(150_000); math.Abs(got-1) > 1e-9 {
		t.Errorf("usedShare = %v, want 1", got)
	}
	if got := w.externalShare(150_000); math.Abs(got-0.3) > 1e-9 {
		t.Errorf("externalShare = %v, want 0.3", got)
	}
	if got := w.accountShare(150_000); math.Abs(got-1.3) > 1e-9 {
		t.Errorf("accountShare = %v, want 1.3", got)
	}
	if got := w.limitedShare(); got != 0.25 {
		t.Errorf("limitedShare = %v, want 0.25", got)
	}
}

// A target is met only with both figures on the right side of its bounds,
// the account's tokens counting where the row says so, the 429s counted over
// the whole run.
func TestTargetMet(t *testing.T) {
	win := window{from: 0, to: time.Minute, used: 57_000, external: 18_000, calls: 1000, limited: 4}
	whole := window{from: 0, to: 2 * time.Minute, calls: 2000, limited: 8}
	for _, c := range []struct {
		t    target
		tpm  int64
		want bool
	}{
		{target{used: 0.95, limited: 0.005}, 60_000, true},
		{target{used: 0.95, limited: 0.004}, 60_000, false}, // 0.4% is not under 0.4%
		{target{used: 0.96, limited: 0.005}, 60_000, false},
		{target{used: 0.90, limited: 0.01}, 80_000, false},               // llmq's 71%
		{target{used: 0.90, limited: 0.01, account: true}, 80_000, true}, // the account's 94%
	} {
		if got := c.t.met(c.tpm, win, window{calls: 100, limited: 1}); got {
			t.Errorf("%v: met with 1%% of the whole run's calls refused", c.t)
		}
		if got := c.t.met(c.tpm, win, whole); got != c.want {
			t.Errorf("%v at %d TPM: met %v, want %v", c.t, c.tpm, got, c.want)
		}
	}
}

// TestLocalBucket checks the baseline's bucket: full at start, a cost it
// does not hold makes the caller wait, refunds never overfill it.
func TestLocalBucket(t *testing.T) {
	b := newLocalBucket(60, 600)
	if !b.take(t.Context(), 600) {
		t.Fatal("a full bucket refused its capacity")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if b.take(ctx, 600) {
		t.Fatal("an empty bucket admitted its capacity at once")
	}
	b.give(1, 10_000)
	if b.tok > 600 || b.req > 60 {
		t.Fatalf("refund overfilled the bucket: %v tokens, %v requests", b.tok, b.req)
	}
}

func TestMixIsDeterministic(t *testing.T) {
	for _, sh := range []shape{usualShape, longShape} {
		a, b := newMix(7, sh, 0), newMix(7, sh, 0)
		for i := range 20 {
			ra, err := a.request(i)
			if err != nil {
				t.Fatal(err)
			}
			rb, _ := b.request(i)
			if !bytes.Equal(ra.body, rb.body) || ra.cost != rb.cost {
				t.Fatalf("request %d differs between two mixes of one seed", i)
			}
			if ra.cost > sh.maxRequest(1) || ra.maxTokens < int64(sh.MaxMin) || ra.maxTokens > int64(sh.MaxMax) ||
				ra.promptTokens < int64(sh.PromptMin) || ra.contentTokens >= ra.promptTokens {
				t.Fatalf("request %d out of the mix's bounds %+v: %+v", i, sh, ra)
			}
		}
	}
}

// A mix with a share of Responses API requests sends the same prompts and
// max tokens as the chat-only one, about that share of them as Responses
// bodies (the words as input, max_output_tokens), which llmq's estimator
// counts as it counts the chat ones.
func TestMixResponses(t *testing.T) {
	t.Parallel()
	for _, sh := range []shape{usualShape, longShape} {
		chat, mixed := newMix(7, sh, 0), newMix(7, sh, 0.5)
		const n = 60
		responses := 0
		for i := range n {
			rc, err := chat.request(i)
			if err != nil {
				t.Fatal(err)
			}
			rm, err := mixed.request(i)
			if err != nil {
				t.Fatal(err)
			}
			if rc.endpoint != llm.EndpointChat {
				t.Fatalf("request %d of a chat-only mix to %s", i, rc.endpoint)
			}
			if rm.promptTokens != rc.promptTokens || rm.maxTokens != rc.maxTokens || rm.cost != rc.cost || rm.contentTokens != rc.contentTokens {
				t.Fatalf("request %d: mixed %+v, chat-only %+v", i, rm, rc)
			}
			if rm.endpoint == llm.EndpointChat {
				if !bytes.Equal(rm.body, rc.body) {
					t.Fatalf("request %d differs between the two mixes though both are chat", i)
				}
				continue
			}
			responses++
			var chatBody struct {
				Messages []struct{ Content string } `json:"messages"`
			}
			var body struct {
				Model           string `json:"model"`
				Input           string `json:"input"`
				MaxOutputTokens int64  `json:"max_output_tokens"`
			}
			if err := json.Unmarshal(rc.body, &chatBody); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(rm.body, &body); err != nil {
				t.Fatal(err)
			}
			if rm.endpoint != llm.EndpointResponses || body.Model != model || body.Input != chatBody.Messages[0].Content || body.MaxOutputTokens != rc.maxTokens {
				t.Fatalf("request %d to %s: %s; want the chat request's words and max_tokens: %s", i, rm.endpoint, rm.body, rc.body)
			}
		}
		if responses < n/3 || responses > 2*n/3 {
			t.Errorf("%d of %d requests to the Responses API, want about half", responses, n)
		}
	}
}
