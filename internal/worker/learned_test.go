package worker_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/pacer"
	"github.com/llmq/llmq/internal/testutil"
)

// learnedObserver records LimitsLearned calls; it observes nothing else.
type learnedObserver struct {
	mu    sync.Mutex
	calls [][2]int64
}

func (o *learnedObserver) LimitsLearned(model string, rpm, tpm int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, [2]int64{rpm, tpm})
}

func (o *learnedObserver) got() [][2]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([][2]int64(nil), o.calls...)
}

func (*learnedObserver) ProviderCall(string, string, int, time.Duration)                 {}
func (*learnedObserver) JobFinished(string, string, string, string, int64, int64, int64) {}
func (*learnedObserver) JobState(string, string, string)                                 {}
func (*learnedObserver) LimiterWait(string, time.Duration, bool)                         {}
func (*learnedObserver) Failover(string, string)                                         {}
func (*learnedObserver) Penalized(string, time.Duration)                                 {}
func (*learnedObserver) BreakerState(string, string)                                     {}
func (*learnedObserver) SoftLimitCrossed(string, string)                                 {}
func (*learnedObserver) UnpredictedRateLimit(string, []string)                           {}
func (*learnedObserver) ShortWindowRateLimit(string, []string)                           {}
func (*learnedObserver) UsageUnbelieved(string, string)                                  {}

// logLines decodes the JSON log lines written to buf.
func logLines(t *testing.T, buf *testutil.SyncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// TestLearnedLimitsDisagreementIsLoggedOncePerChange: when the limits a
// provider announces differ from the policy's, lower or higher, one log line
// and one observer call say so; the same announcement again, from this
// worker or another, says nothing; agreeing again is reported once too.
func TestLearnedLimitsDisagreementIsLoggedOncePerChange(t *testing.T) {
	t.Parallel()
	a := start(t, nil)
	ctx := context.Background()
	m, _ := a.Policy.Current().Model("gpt-4o-mini") // policy: 3,000 RPM, 300,000 TPM
	type proc struct {
		l   *pacer.Learned
		log *testutil.SyncBuffer
		obs *learnedObserver
	}
	newWorker := func() proc {
		w := proc{log: &testutil.SyncBuffer{}, obs: &learnedObserver{}}
		logger := slog.New(slog.NewJSONHandler(w.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		w.l = pacer.NewLearned(a.Redis, a.Keys, logger, w.obs)
		return w
	}
	one, other := newWorker(), newWorker()
	announce := func(w proc, rpm, tpm int64) {
		w.l.Observe(ctx, m.Routes()[0], llm.RateLimit{LimitRequests: rpm, LimitTokens: tpm, Has: llm.HasLimitRequests | llm.HasLimitTokens})
	}
	expect := func(w proc, name string, lines int, level, msg string, calls [][2]int64) {
		t.Helper()
		got := logLines(t, w.log)
		if len(got) != lines {
			t.Fatalf("%s: %d log lines, want %d: %v", name, len(got), lines, got)
		}
		if lines > 0 {
			last := got[lines-1]
			if last["level"] != level || !strings.Contains(last["msg"].(string), msg) || last["model"] != m.Name ||
				last["policy_rpm"] != float64(m.Deployments[0].Limits.RPM) || last["policy_tpm"] != float64(m.Deployments[0].Limits.TPM) ||
				last["provider_rpm"] != float64(calls[len(calls)-1][0]) || last["provider_tpm"] != float64(calls[len(calls)-1][1]) {
				t.Fatalf("%s: log line %v, want %s %q with the model, the policy's and the provider's limits", name, last, level, msg)
			}
		}
		if obs := w.obs.got(); len(obs) != len(calls) || (len(calls) > 0 && obs[len(obs)-1] != calls[len(calls)-1]) {
			t.Fatalf("%s: observer got %v, want %v", name, obs, calls)
		}
	}

	// Lower than the policy: a warning, and the metric.
	announce(one, 1500, 150000)
	expect(one, "lower", 1, "WARN", "lower than the policy's", [][2]int64{{1500, 150000}})
	// The same again, from this worker and from another: nothing more.
	announce(one, 1500, 150000)
	announce(other, 1500, 150000)
	expect(one, "lower again", 1, "WARN", "lower than the policy's", [][2]int64{{1500, 150000}})
	expect(other, "lower, seen by another worker", 0, "", "", nil)

	// Higher than the policy: said once, by the worker that saw it first.
	announce(other, 6000, 600000)
	announce(one, 6000, 600000)
	announce(other, 6000, 600000)
	expect(other, "higher", 1, "INFO", "higher than the policy's", [][2]int64{{6000, 600000}})
	expect(one, "higher, seen by another worker", 1, "WARN", "lower than the policy's", [][2]int64{{1500, 150000}})

	// Back to the policy's limits: said once; agreeing says nothing after.
	announce(one, 3000, 300000)
	announce(one, 3000, 300000)
	expect(one, "agreeing", 2, "INFO", "agree with the policy's again", [][2]int64{{1500, 150000}, {3000, 300000}})
	expect(other, "agreeing, seen by another worker", 1, "INFO", "higher than the policy's", [][2]int64{{6000, 600000}})
}
