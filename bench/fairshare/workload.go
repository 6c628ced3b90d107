package main

import (
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/queue"
)

// words are common English words of one token each in o200k_base, so a
// prompt of n words is about n tokens.
var words = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his from at which
but have an had they you were their one all we can her has there been if more when will would who so no out up into
do time only new some could these two may first then its over such than other also after most made well many them`)

// jobSpec is one job to submit: whose, for which model, at which priority
// ("" is the tier's), a prompt of Prompt words and max_tokens MaxTokens.
type jobSpec struct {
	Tenant    *tenant
	Model     string
	Priority  string
	Prompt    int
	MaxTokens int
}

// The job sizes, as the simulator charges them (prompt + max_tokens; the
// chat framing adds a few tokens): small ones, ~100 tokens, make RPM and
// TPM bind together at the default limits; medium ones, ~200, make TPM
// bind; long ones, ~1,000 tokens of which 900 prompt, are the tenant of
// long prompts that sends fewer, larger jobs.
var (
	small  = jobSpec{Prompt: 30, MaxTokens: 64}
	medium = jobSpec{Prompt: 100, MaxTokens: 96}
	long   = jobSpec{Prompt: 900, MaxTokens: 96}
)

// of returns the size sp for tenant t's jobs of model m.
func (sp jobSpec) of(t *tenant, m string) jobSpec {
	sp.Tenant, sp.Model = t, m
	return sp
}

// times returns n copies of sp.
func (sp jobSpec) times(n int) []jobSpec {
	out := make([]jobSpec, n)
	for i := range out {
		out[i] = sp
	}
	return out
}

func (sp jobSpec) prompt() string {
	var b strings.Builder
	for i := range sp.Prompt {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[i%len(words)])
	}
	return b.String()
}

// requestBody is the chat request.
func (sp jobSpec) requestBody() []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      sp.Model,
		"messages":   []map[string]string{{"role": "user", "content": sp.prompt()}},
		"max_tokens": sp.MaxTokens,
	})
	return b
}

// body is the POST /v1/jobs body.
func (sp jobSpec) body() []byte {
	m := map[string]any{"body": json.RawMessage(sp.requestBody())}
	if sp.Priority != "" {
		m["priority"] = sp.Priority
	}
	b, _ := json.Marshal(m)
	return b
}

// interleave merges lists so that each is spread evenly over the result
// (a list of a tenth of the length gets every tenth place): tenants
// submitting at once, each at its own rate.
func interleave(lists ...[]jobSpec) []jobSpec {
	total := 0
	for _, l := range lists {
		total += len(l)
	}
	out := make([]jobSpec, 0, total)
	next := make([]int, len(lists))
	for len(out) < total {
		// the list furthest behind its even spread goes next
		best, bestAt := -1, 2.0
		for i, l := range lists {
			if next[i] >= len(l) {
				continue
			}
			at := (float64(next[i]) + 0.5) / float64(len(l))
			if at < bestAt {
				best, bestAt = i, at
			}
		}
		out = append(out, lists[best][next[best]])
		next[best]++
	}
	return out
}

// finish is one job that succeeded, as the worker told it.
type finish struct {
	At     time.Time
	Tenant string
	Model  string
	Tokens int64 // prompt + completion: what the provider charged
}

// observer is the workers' observer: every success with its tokens, the
// limiter's requeues (a job dequeued, refused a permit for longer than the
// worker sleeps, and put back in its queue) and the workers' sleeps for
// permits.
type observer struct {
	mu       sync.Mutex
	finishes []finish
	requeued map[string]int64
	slept    map[string]time.Duration
	dequeues atomic.Int64
	released atomic.Int64
}

func newObserver() *observer {
	return &observer{requeued: map[string]int64{}, slept: map[string]time.Duration{}}
}

func (o *observer) JobFinished(tenantID, _, model, status string, prompt, completion, _ int64) {
	if status != "succeeded" {
		return
	}
	o.mu.Lock()
	o.finishes = append(o.finishes, finish{At: time.Now(), Tenant: tenantID, Model: model, Tokens: prompt + completion})
	o.mu.Unlock()
}

func (o *observer) LimiterWait(model string, d time.Duration, requeued bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if requeued {
		o.requeued[model]++
	} else {
		o.slept[model] += d
	}
}

// Released counts what the scheduler released (scheduler.Observer).
func (o *observer) Released(string, time.Duration) { o.released.Add(1) }

func (o *observer) ProviderCall(string, string, int, time.Duration) {}
func (o *observer) JobState(string, string, string)                 {}
func (o *observer) BreakerState(string, string)                     {}
func (o *observer) Failover(string, string)                         {}
func (o *observer) SoftLimitCrossed(string, string)                 {}
func (o *observer) Penalized(string, time.Duration)                 {}
func (o *observer) LimitsLearned(string, int64, int64)              {}
func (o *observer) UnpredictedRateLimit(string, []string)           {}
func (o *observer) ShortWindowRateLimit(string, []string)           {}
func (o *observer) UsageUnbelieved(string, string)                  {}

// waitsOf is how many jobs of model were put back for the limiter, and
// how long the workers slept for its permits (waits that ended).
func (o *observer) waitsOf(model string) (int64, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.requeued[model], o.slept[model]
}

// tokens sums the tokens of the successes from..to that keep says to.
func (o *observer) tokens(from, to time.Time, keep func(finish) bool) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var n int64
	for _, f := range o.finishes {
		if !f.At.Before(from) && f.At.Before(to) && (keep == nil || keep(f)) {
			n += f.Tokens
		}
	}
	return n
}

// The priorities in the order the scenario of priorities reports them.
var priorities = []string{queue.Critical, queue.Default, queue.Batch}
