package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/hibiken/asynq"
	asynqmetrics "github.com/hibiken/asynq/x/metrics"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// redisDB is the Redis database of the metrics and dashboard tests
// (docs/ARCHITECTURE.md).
const redisDB = 9

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// families are the families /metrics must carry, with their types: what the
// issue asks for, and asynq's queue collector.
var families = map[string]string{
	"llmq_jobs_total":                             "COUNTER",
	"llmq_provider_calls_total":                   "COUNTER",
	"llmq_provider_call_duration_seconds":         "HISTOGRAM",
	"llmq_tokens_total":                           "COUNTER",
	"llmq_cost_usd_total":                         "COUNTER",
	"llmq_limiter_wait_seconds":                   "HISTOGRAM",
	"llmq_limiter_bucket_remaining":               "GAUGE",
	"llmq_limiter_bucket_limit":                   "GAUGE",
	"llmq_limiter_paused":                         "GAUGE",
	"llmq_limiter_penalties_total":                "COUNTER",
	"llmq_limiter_penalty_seconds_total":          "COUNTER",
	"llmq_limits_learned":                         "GAUGE",
	"llmq_limiter_unpredicted_429s_total":         "COUNTER",
	"llmq_limiter_short_window_429s_total":        "COUNTER",
	"llmq_limiter_burst_seconds":                  "GAUGE",
	"llmq_provider_usage_unbelieved_total":        "COUNTER",
	"llmq_limiter_bucket_capacity":                "GAUGE",
	"llmq_limiter_provider_remaining":             "GAUGE",
	"llmq_limiter_provider_remaining_age_seconds": "GAUGE",
	"llmq_limiter_drain_ratio":                    "GAUGE",
	"llmq_limiter_limit_factor":                   "GAUGE",
	"llmq_limiter_prompt_calibration":             "GAUGE",
	"llmq_limiter_prompt_calibration_samples":     "GAUGE",
	"llmq_limiter_provider_counts_distrusted":     "GAUGE",
	"llmq_budget_spent_usd":                       "GAUGE",
	"llmq_budget_reserved_usd":                    "GAUGE",
	"llmq_budget_limit_usd":                       "GAUGE",
	"llmq_budget_remaining_usd":                   "GAUGE",
	"llmq_budget_soft_limit_usd":                  "GAUGE",
	"llmq_budget_tenants_truncated":               "GAUGE",
	"llmq_budget_soft_limit_crossings_total":      "COUNTER",
	"llmq_budget_rebuilt_total":                   "COUNTER",
	"llmq_budget_rebuilt_usd_total":               "COUNTER",
	"llmq_circuit_breaker_state":                  "GAUGE",
	"llmq_failovers_total":                        "COUNTER",
	"llmq_circuit_breaker_transitions_total":      "COUNTER",
	"llmq_webhook_deliveries_total":               "COUNTER",
	"llmq_webhook_failures_total":                 "COUNTER",
	"llmq_workers":                                "GAUGE",
	"asynq_queue_size":                            "GAUGE",
	"asynq_queue_latency_seconds":                 "GAUGE",
	"asynq_tasks_enqueued_total":                  "GAUGE",
	"asynq_tasks_processed_total":                 "COUNTER",
	"asynq_tasks_failed_total":                    "COUNTER",
	"asynq_queue_paused_total":                    "GAUGE",
}

// scenario is a test app with a Recorder over it, a tenant that spent
// $41.25 of its $50 (past the 0.8 soft limit), and one event of each kind.
type scenario struct {
	a      *apptest.App
	rec    *metrics.Recorder
	tenant string
	url    string
}

func setup(t *testing.T) *scenario {
	t.Helper()
	ctx := context.Background()
	// No scheduler: the jobs queued below stay waiting.
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, NoScheduler: true})
	rec := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys})
	in := asynq.NewInspectorFromRedisClient(a.Redis)
	st := metrics.NewState(metrics.StateDeps{
		Policy: a.Policy, Limiter: a.Limiter, Budgets: a.Budgets, Store: a.Store, Asynq: in, Namespace: a.Queue.Namespace(),
		Queue: a.Queue,
	}, metrics.StateOptions{})
	if err := rec.Register(st.Collector(), asynqmetrics.NewQueueMetricsCollector(in)); err != nil {
		t.Fatal(err)
	}
	for _, c := range a.ReadyChecks() {
		if err := rec.WatchReady(c.Name, c.Check); err != nil {
			t.Fatal(err)
		}
	}
	if err := queue.RegisterQueues(ctx, a.Redis, a.Queue.Namespace()); err != nil {
		t.Fatal(err)
	}
	tenant, _ := a.Tenant("standard")
	spend(t, a, tenant, 41_250_000)

	rec.JobState("standard", "gpt-4o-mini", "queued")
	rec.ProviderCall("sim/gpt-4o-mini", "gpt-4o-mini", 200, 300*time.Millisecond)
	rec.ProviderCall("sim/gpt-4o-mini", "gpt-4o-mini", 429, 20*time.Millisecond)
	rec.Failover("gpt-4o-mini", "sim/gpt-4o-mini")
	rec.JobFinished(tenant, "standard", "gpt-4o-mini", "succeeded", 100, 20, 1234)
	rec.LimiterWait("gpt-4o-mini", 20*time.Millisecond, false)
	rec.LimiterWait("gpt-4o-mini", 3*time.Second, true)
	rec.Penalized("gpt-4o-mini", 2*time.Second)
	rec.BreakerState("sim/gpt-4o-mini", "open")
	rec.LimitsLearned("gpt-4o-mini", 500, 200000)
	rec.SoftLimitCrossed(tenant, "standard")
	rec.BudgetRaised(budget.RaisedPeriodic, 250_000)
	rec.BudgetRaised(budget.RaisedPeriodic, 50_000)
	rec.WebhookDelivery("job", "delivered")
	rec.WebhookDelivery("job", "http_5xx")
	rec.UnpredictedRateLimit("gpt-4o-mini", []string{"tpm"})
	rec.ShortWindowRateLimit("gpt-4o-mini", []string{"rpm", "tpm"})
	rec.UsageUnbelieved("gpt-4o-mini", "missing")
	rec.Released("default", 3*time.Second)
	// Three answers of the provider: its remaining tokens, and prompts it
	// counted a quarter more than llmq.
	m, _ := a.Policy.Current().Model("gpt-4o-mini")
	for range 3 {
		res, err := a.Limiter.Reserve(ctx, admission.Scope(m.Routes()[0]), limiter.Cost{Requests: 1, Tokens: 500})
		if err != nil || !res.Allowed {
			t.Fatalf("reserve: %v %+v", err, res)
		}
		if _, err := a.Limiter.Settle(ctx, res.Reservation, limiter.Feedback{PromptRatio: 1.25,
			Observed: []limiter.Observed{{Bucket: "tpm", Remaining: 250_000, Limit: 300_000}}}); err != nil {
			t.Fatal(err)
		}
	}

	// Two jobs of the tenant wait in the model's fair queue.
	for i := range 2 {
		ref := queue.JobRef{ID: fmt.Sprintf("job_waiting%d", i), Priority: queue.Default, Scope: m.Routes()[0].Deployment.Name(), TenantID: tenant, Cost: 100}
		if _, err := a.Queue.EnqueueJob(ctx, ref); err != nil {
			t.Fatal(err)
		}
	}

	srv := httptest.NewServer(rec.Handler())
	t.Cleanup(srv.Close)
	return &scenario{a: a, rec: rec, tenant: tenant, url: srv.URL}
}

// spend charges amount to the tenant's budget day, as a settled job would.
func spend(t *testing.T, a *apptest.App, tenantID string, amount money.Micros) {
	t.Helper()
	ctx := context.Background()
	acct := a.Account(tenantID)
	res, dec, err := a.Budgets.Reserve(ctx, acct, "job_seed"+tenantID, amount)
	if err != nil || !dec.Allowed {
		t.Fatalf("reserve %s: %v, %+v", amount, err, dec)
	}
	if err := a.Budgets.Settle(ctx, res, amount, true); err != nil {
		t.Fatal(err)
	}
}

// scrape fetches /metrics and parses it with the Prometheus text parser.
func (s *scenario) scrape(t *testing.T) map[string]*familyView {
	t.Helper()
	resp, err := http.Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := map[string]*familyView{}
	for name, mf := range mfs {
		fv := &familyView{Type: mf.GetType().String()}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			fv.Samples = append(fv.Samples, sample{labels, v})
		}
		out[name] = fv
	}
	return out
}

type familyView struct {
	Type    string
	Samples []sample
}

type sample struct {
	Labels map[string]string
	Value  float64
}

// value returns the sample whose labels include want, failing when none does.
func (f *familyView) value(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	if f == nil {
		t.Fatalf("%s: family missing", name)
	}
next:
	for _, s := range f.Samples {
		for k, v := range want {
			if s.Labels[k] != v {
				continue next
			}
		}
		return s.Value
	}
	t.Fatalf("%s: no sample with labels %v among %v", name, want, f.Samples)
	return 0
}

func TestMetricsCarryEveryFamily(t *testing.T) {
	t.Parallel()
	s := setup(t)
	got := s.scrape(t)
	// asynq's collector lists every queue of the Redis database, then reads
	// each: a queue another test deletes in between fails its whole scrape
	// (it logs "Failed to collect metrics data"), and the next one is whole.
	for i := 0; i < 5; i++ {
		if _, ok := got["asynq_queue_size"]; ok {
			break
		}
		time.Sleep(100 * time.Millisecond)
		got = s.scrape(t)
	}
	for name, typ := range families {
		f, ok := got[name]
		if !ok {
			t.Errorf("/metrics lacks %s", name)
			continue
		}
		if f.Type != typ {
			t.Errorf("%s is a %s, want %s", name, f.Type, typ)
		}
	}

	// The numbers are the scenario's.
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"llmq_jobs_total", map[string]string{"tier": "standard", "model": "gpt-4o-mini", "status": "queued"}, 1},
		{"llmq_provider_calls_total", map[string]string{"model": "gpt-4o-mini", "code": "429"}, 1},
		{"llmq_provider_call_duration_seconds", map[string]string{"deployment": "sim/gpt-4o-mini", "model": "gpt-4o-mini"}, 2},
		{"llmq_failovers_total", map[string]string{"deployment": "sim/gpt-4o-mini", "model": "gpt-4o-mini"}, 1},
		{"llmq_tokens_total", map[string]string{"direction": "input"}, 100},
		{"llmq_tokens_total", map[string]string{"direction": "output"}, 20},
		{"llmq_cost_usd_total", map[string]string{"tenant": s.tenant, "tier": "standard"}, 0.001234},
		{"llmq_limiter_wait_seconds", map[string]string{"outcome": "requeued"}, 1},
		{"llmq_limiter_penalty_seconds_total", map[string]string{"model": "gpt-4o-mini"}, 2},
		{"llmq_limiter_bucket_limit", map[string]string{"model": "gpt-4o-mini", "bucket": "tpm"}, 300000},
		{"llmq_limiter_paused", map[string]string{"model": "gpt-4o-mini"}, 0},
		{"llmq_limiter_unpredicted_429s_total", map[string]string{"model": "gpt-4o-mini", "bucket": "tpm"}, 1},
		{"llmq_limiter_bucket_capacity", map[string]string{"model": "gpt-4o-mini", "bucket": "tpm"}, 300000},
		{"llmq_limiter_provider_remaining", map[string]string{"model": "gpt-4o-mini", "bucket": "tpm"}, 250000},
		{"llmq_limiter_limit_factor", map[string]string{"model": "gpt-4o-mini", "bucket": "tpm"}, 1},
		{"llmq_limiter_burst_seconds", map[string]string{"model": "gpt-4o-mini", "bucket": "tpm"}, 0.5},
		{"llmq_limiter_short_window_429s_total", map[string]string{"model": "gpt-4o-mini", "bucket": "rpm"}, 1},
		{"llmq_limiter_drain_ratio", map[string]string{"model": "gpt-4o-mini", "bucket": "tpm"}, 0},
		{"llmq_limiter_prompt_calibration", map[string]string{"model": "gpt-4o-mini"}, 1.25},
		{"llmq_limiter_prompt_calibration_samples", map[string]string{"model": "gpt-4o-mini"}, 3},
		{"llmq_limiter_provider_counts_distrusted", map[string]string{"model": "gpt-4o-mini"}, 0},
		{"llmq_tenant_queued_jobs", map[string]string{"tenant": s.tenant, "priority": "default", "model": "gpt-4o-mini"}, 2},
		{"llmq_queue_wait_seconds", map[string]string{"priority": "default"}, 1},
		{"llmq_budget_spent_usd", map[string]string{"tenant": s.tenant, "tier": "standard"}, 41.25},
		{"llmq_budget_limit_usd", map[string]string{"tenant": s.tenant}, 50},
		{"llmq_budget_remaining_usd", map[string]string{"tenant": s.tenant}, 8.75},
		{"llmq_budget_soft_limit_usd", map[string]string{"tenant": s.tenant}, 40},
		{"llmq_budget_tenants_truncated", nil, 0},
		{"llmq_budget_rebuilt_total", map[string]string{"reason": "periodic"}, 2},
		{"llmq_budget_rebuilt_usd_total", map[string]string{"reason": "periodic"}, 0.3},
		{"llmq_circuit_breaker_state", map[string]string{"deployment": "sim/gpt-4o-mini", "state": "open"}, 1},
		{"llmq_circuit_breaker_state", map[string]string{"deployment": "sim/gpt-4o-mini", "state": "closed"}, 0},
		{"llmq_limits_learned", map[string]string{"model": "gpt-4o-mini", "limit": "tpm"}, 200000},
		{"llmq_webhook_failures_total", map[string]string{"kind": "job", "reason": "http_5xx"}, 1},
		{"llmq_webhook_deliveries_total", map[string]string{"kind": "job", "outcome": "delivered"}, 1},
		{"llmq_workers", nil, 0},
		{"asynq_queue_size", map[string]string{"queue": s.a.Queue.Namespace().Queue(queue.Jobs)}, 0},
	}
	for _, c := range checks {
		if v := got[c.name].value(t, c.name, c.labels); v < c.want-1e-9 || v > c.want+1e-9 {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}

	// Three requests were taken, refilling at 50 a second.
	if v := got["llmq_limiter_bucket_remaining"].value(t, "remaining", map[string]string{"model": "gpt-4o-mini", "bucket": "rpm"}); v < 2997 || v > 3000 {
		t.Errorf("llmq_limiter_bucket_remaining{rpm} = %v, want 2997-3000", v)
	}

	// No high-cardinality labels; tenant ids only on cost and budget families.
	for name, f := range got {
		for _, smp := range f.Samples {
			for l := range smp.Labels {
				switch {
				case strings.Contains(l, "job") || strings.Contains(l, "batch") || l == "id":
					t.Errorf("%s has label %q: job and batch ids must never be labels", name, l)
				case l == "tenant" && !strings.HasPrefix(name, "llmq_cost_") && !strings.HasPrefix(name, "llmq_budget_") &&
					!strings.HasPrefix(name, "llmq_tenant_"):
					t.Errorf("%s has a tenant label; only cost, budget and tenant queue families may", name)
				}
			}
		}
	}
}

// PromQL, read coarsely (no parser: the deploy files' expressions are
// plain): selectors with their matchers, grouping clauses, and the labels
// a legend or an annotation template shows.
var (
	promSelector  = regexp.MustCompile(`\b((?:llmq|asynq)_[a-zA-Z0-9_]+|llmq:[a-zA-Z0-9_:]+|up)\b(\{[^}]*\})?`)
	promMatcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"`)
	promGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	templateLabel = regexp.MustCompile(`\{\{\s*(?:\$labels\.)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	upJob         = regexp.MustCompile(`\bup\{[^}]*\bjob\s*=\s*"([^"]*)"`)
)

// labelSets are the label names of each family of a scrape (with the
// target's job and instance, which Prometheus adds to every series), of
// each recording rule (its grouping labels) and of Prometheus's own up.
type labelSets map[string]map[string]bool

func labelSetsOf(got map[string]*familyView) labelSets {
	ls := labelSets{"up": {"job": true, "instance": true}}
	for name, f := range got {
		for _, smp := range f.Samples {
			if ls[name] == nil {
				ls[name] = map[string]bool{"job": true, "instance": true}
			}
			for l := range smp.Labels {
				ls[name][l] = true
			}
		}
	}
	return ls
}

// record adds a recording rule: its series carry the labels it groups by.
func (ls labelSets) record(name, expr string) {
	ls[name] = map[string]bool{}
	for _, g := range promGrouping.FindAllStringSubmatch(expr, -1) {
		if g[1] == "by" {
			for _, l := range splitLabels(g[2]) {
				ls[name][l] = true
			}
		}
	}
}

// of returns the labels of a series name: a family, a histogram's
// _bucket (with le), _sum or _count, or a recording rule.
func (ls labelSets) of(name string) (map[string]bool, bool) {
	if l, ok := ls[name]; ok {
		return l, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if l, ok := ls[strings.TrimSuffix(name, suf)]; ok && strings.HasSuffix(name, suf) {
			if suf != "_bucket" {
				return l, true
			}
			withLe := map[string]bool{"le": true}
			for k := range l {
				withLe[k] = true
			}
			return withLe, true
		}
	}
	return nil, false
}

// check returns what is wrong with the labels expr and its templates use:
// a matcher on a label its metric lacks, an aggregation by a label some
// metric it aggregates lacks, a join on a label no metric has, a template
// showing a label the result cannot have.
func (ls labelSets) check(expr string, templates ...string) []string {
	var problems []string
	metricsIn := func(part string) (all []map[string]bool) {
		for _, m := range promSelector.FindAllStringSubmatch(part, -1) {
			if labels, ok := ls.of(m[1]); ok {
				all = append(all, labels)
			}
		}
		return all
	}
	for _, m := range promSelector.FindAllStringSubmatch(expr, -1) {
		labels, ok := ls.of(m[1])
		if !ok {
			problems = append(problems, fmt.Sprintf("%s has no series in the scrape to read its labels from", m[1]))
			continue
		}
		for _, mm := range promMatcher.FindAllStringSubmatch(m[2], -1) {
			if !labels[mm[1]] {
				problems = append(problems, fmt.Sprintf("%s%s: %s has no label %q", m[1], m[2], m[1], mm[1]))
			}
		}
	}
	all := metricsIn(expr)
	var grouped map[string]bool // the labels of by clauses, when there are any
	for _, idx := range promGrouping.FindAllStringSubmatchIndex(expr, -1) {
		kind, list := expr[idx[2]:idx[3]], expr[idx[4]:idx[5]]
		// An aggregation's argument is the group after its clause; a join
		// (on, ignoring, group_*) may name a label of either side.
		scope, every := all, false
		if kind == "by" || kind == "without" {
			if arg, ok := groupAfter(expr, idx[1]); ok {
				scope, every = metricsIn(arg), true
			}
		}
		for _, l := range splitLabels(list) {
			n := 0
			for _, labels := range scope {
				if labels[l] {
					n++
				}
			}
			if n == 0 || every && n < len(scope) {
				problems = append(problems, fmt.Sprintf("%s (%s): label %q is not on every metric it applies to", kind, list, l))
			}
			if kind == "by" {
				if grouped == nil {
					grouped = map[string]bool{}
				}
				grouped[l] = true
			}
		}
	}
	for _, tpl := range templates {
		for _, m := range templateLabel.FindAllStringSubmatch(tpl, -1) {
			onSome := false
			for _, labels := range all {
				onSome = onSome || labels[m[1]]
			}
			if !onSome || grouped != nil && !grouped[m[1]] {
				problems = append(problems, fmt.Sprintf("%q shows label %q, which the result of %q does not have", tpl, m[1], expr))
			}
		}
	}
	return problems
}

// groupAfter returns the parenthesized group that starts at or after i
// (spaces skipped), without its parentheses.
func groupAfter(s string, i int) (string, bool) {
	for i < len(s) && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t') {
		i++
	}
	if i >= len(s) || s[i] != '(' {
		return "", false
	}
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return s[i+1 : j], true
			}
		}
	}
	return "", false
}

func splitLabels(list string) []string {
	var out []string
	for _, l := range strings.Split(list, ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// identifiers finds metric names in PromQL, coarsely: anything shaped like
// an llmq or asynq family name.
var identifiers = regexp.MustCompile(`\b(?:llmq|asynq)_[a-zA-Z0-9_]+`)

// known reports whether name is a family of the scrape, or a histogram's
// _bucket, _sum or _count series.
func known(got map[string]*familyView, name string) bool {
	if _, ok := got[name]; ok {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := got[strings.TrimSuffix(name, suf)]; ok && strings.HasSuffix(name, suf) && f.Type == "HISTOGRAM" {
			return true
		}
	}
	return false
}

func TestDeployFilesReferenceExistingMetrics(t *testing.T) {
	t.Parallel()
	s := setup(t)
	got := s.scrape(t)

	// Grafana: every expression of every panel.
	raw, err := os.ReadFile("../../deploy/grafana/dashboards/llmq.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("llmq.json is not JSON: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) < 8 {
		t.Fatalf("llmq.json: uid %q, %d panels; want a uid and a panel per part of the issue", dash.UID, len(dash.Panels))
	}
	var exprs int
	ls := labelSetsOf(got)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs++
			names := identifiers.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: expression %q names no llmq or asynq metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				if !known(got, n) {
					t.Errorf("panel %q uses %s, which /metrics does not carry", p.Title, n)
				}
			}
			for _, problem := range ls.check(tg.Expr, tg.LegendFormat) {
				t.Errorf("panel %q: %s", p.Title, problem)
			}
		}
	}
	if exprs == 0 {
		t.Fatal("llmq.json has no expressions")
	}

	// Prometheus rules: every expression, and every recording rule an alert
	// uses is defined.
	raw, err = os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Record      string            `yaml:"record"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yml is not YAML: %v", err)
	}
	records := map[string]bool{}
	var alerts, upJobs []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records[r.Record] = true
				ls.record(r.Record, r.Expr)
			}
		}
	}
	recordRef := regexp.MustCompile(`\bllmq:[a-zA-Z0-9_:]+`)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
				if r.Labels["severity"] == "" {
					t.Errorf("alert %s has no severity label", r.Alert)
				}
			}
			for _, n := range identifiers.FindAllString(r.Expr, -1) {
				if !known(got, n) {
					t.Errorf("rule %s%s uses %s, which /metrics does not carry", r.Alert, r.Record, n)
				}
			}
			var templates []string
			for _, a := range r.Annotations {
				templates = append(templates, a)
			}
			for _, problem := range ls.check(r.Expr, templates...) {
				t.Errorf("rule %s%s: %s", r.Alert, r.Record, problem)
			}
			for _, m := range upJob.FindAllStringSubmatch(r.Expr, -1) {
				upJobs = append(upJobs, m[1])
			}
			for _, n := range recordRef.FindAllString(r.Expr, -1) {
				if !records[n] {
					t.Errorf("rule %s%s uses %s, which no recording rule defines", r.Alert, r.Record, n)
				}
			}
		}
	}
	for _, want := range []string{"LlmqTenantPastSoftLimit", "Llmq429ShareRising", "LlmqQueueLatencyHigh", "LlmqCircuitOpen", "LlmqNoWorkers"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yml lacks alert %s (has %v)", want, alerts)
		}
	}

	// The scrape config names the dispatcher and both workers of compose,
	// and loads the rules.
	raw, err = os.ReadFile("../../deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var prom struct {
		Alerting struct {
			Alertmanagers []struct {
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"alertmanagers"`
		} `yaml:"alerting"`
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &prom); err != nil {
		t.Fatalf("prometheus.yml is not YAML: %v", err)
	}
	var targets, jobs []string
	for _, sc := range prom.ScrapeConfigs {
		jobs = append(jobs, sc.JobName)
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	// up's job label is a scrape job's name.
	for _, j := range upJobs {
		if !slices.Contains(jobs, j) {
			t.Errorf("alerts.yml reads up{job=%q}, which prometheus.yml does not scrape (jobs %v)", j, jobs)
		}
	}
	for _, want := range []string{"dispatcher:9464", "worker-1:9464", "worker-2:9464"} {
		if !slices.Contains(targets, want) {
			t.Errorf("prometheus.yml does not scrape %s (targets %v)", want, targets)
		}
	}
	if len(prom.RuleFiles) == 0 {
		t.Error("prometheus.yml loads no rule files")
	}

	// Alerts reach someone: Prometheus sends them to the Alertmanager
	// service, whose routes send every severity the rules use to a
	// receiver it defines, notices apart from the pager.
	var amTargets []string
	for _, am := range prom.Alerting.Alertmanagers {
		for _, sc := range am.StaticConfigs {
			amTargets = append(amTargets, sc.Targets...)
		}
	}
	if !slices.Contains(amTargets, "alertmanager:9093") {
		t.Errorf("prometheus.yml sends alerts to %v, want alertmanager:9093", amTargets)
	}
	raw, err = os.ReadFile("../../deploy/alertmanager/alertmanager.yml")
	if err != nil {
		t.Fatal(err)
	}
	type amRoute struct {
		Receiver string   `yaml:"receiver"`
		Matchers []string `yaml:"matchers"`
	}
	var am struct {
		Route struct {
			Receiver string    `yaml:"receiver"`
			Routes   []amRoute `yaml:"routes"`
		} `yaml:"route"`
		Receivers []struct {
			Name string `yaml:"name"`
		} `yaml:"receivers"`
	}
	if err := yaml.Unmarshal(raw, &am); err != nil {
		t.Fatalf("alertmanager.yml is not YAML: %v", err)
	}
	receivers := map[string]bool{}
	for _, r := range am.Receivers {
		receivers[r.Name] = true
	}
	receiverOf := func(severity string) string {
		for _, r := range am.Route.Routes {
			if slices.Contains(r.Matchers, `severity="`+severity+`"`) {
				return r.Receiver
			}
		}
		return am.Route.Receiver
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			sev := r.Labels["severity"]
			if !slices.Contains([]string{"critical", "warning", "notice"}, sev) {
				t.Errorf("alert %s: severity %q, want critical, warning or notice", r.Alert, sev)
			}
			if rc := receiverOf(sev); !receivers[rc] {
				t.Errorf("alert %s (severity %s) goes to receiver %q, which alertmanager.yml does not define", r.Alert, sev, rc)
			}
		}
	}
	if receiverOf("notice") == receiverOf("critical") {
		t.Errorf("notices go to the pager's receiver %q", receiverOf("critical"))
	}

	// docker-compose runs Prometheus and Grafana over these files, and the
	// scrape targets are its services' metrics addresses.
	raw, err = os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml is not YAML: %v", err)
	}
	mounts := func(service, file string) {
		t.Helper()
		for _, v := range compose.Services[service].Volumes {
			if strings.HasPrefix(v, "./"+file+":") {
				if _, err := os.Stat("../../" + file); err != nil {
					t.Errorf("service %s mounts %s: %v", service, file, err)
				}
				return
			}
		}
		t.Errorf("service %s does not mount %s (volumes %v)", service, file, compose.Services[service].Volumes)
	}
	mounts("prometheus", "deploy/prometheus/prometheus.yml")
	mounts("prometheus", "deploy/prometheus/alerts.yml")
	mounts("alertmanager", "deploy/alertmanager/alertmanager.yml")
	mounts("grafana", "deploy/grafana/provisioning")
	mounts("grafana", "deploy/grafana/dashboards")
	for _, target := range targets {
		host, port, _ := strings.Cut(target, ":")
		svc, ok := compose.Services[host]
		if !ok {
			t.Errorf("prometheus.yml scrapes %s, not a compose service", target)
		} else if got := svc.Environment["LLMQ_METRICS_ADDR"]; got != ":"+port {
			t.Errorf("prometheus.yml scrapes %s, but the service serves /metrics on LLMQ_METRICS_ADDR %q", target, got)
		}
	}
}

func TestPerMinuteCounters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	now := time.Date(2026, 11, 30, 12, 5, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	rec := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, Now: clock, NoProcessMetrics: true})

	rec.JobFinished("ten_a", "standard", "gpt-4o-mini", string(store.JobSucceeded), 100, 20, 1500)
	rec.ProviderCall("sim/gpt-4o-mini", "gpt-4o-mini", 429, time.Millisecond)
	now = now.Add(time.Minute)
	rec.JobFinished("ten_a", "standard", "gpt-4o-mini", string(store.JobSucceeded), 10, 2, 500)
	rec.JobFinished("ten_a", "standard", "gpt-4o-mini", string(store.JobFailed), 0, 0, 0)
	rec.BudgetRaised(budget.RaisedRestored, 70_000)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// A second Recorder (another process) adds to the same minutes.
	other := metrics.New(metrics.Options{Redis: a.Redis, Keys: a.Keys, Now: clock, NoProcessMetrics: true})
	other.JobFinished("ten_b", "standard", "gpt-4o-mini", string(store.JobSucceeded), 1, 1, 1)
	if err := other.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	ms, err := metrics.ReadMinutes(ctx, a.Redis, a.Keys, now, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || !ms[2].Start.Equal(time.Date(2026, 11, 30, 12, 6, 0, 0, time.UTC)) {
		t.Fatalf("minutes %+v", ms)
	}
	want := []map[string]int64{
		{},
		{"jobs_succeeded": 1, "tokens_in": 100, "tokens_out": 20, "cost_micros": 1500, "calls": 1, "calls_429": 1,
			"calls:sim/gpt-4o-mini": 1, "calls_429:sim/gpt-4o-mini": 1},
		{"jobs_succeeded": 2, "jobs_failed": 1, "tokens_in": 11, "tokens_out": 3, "cost_micros": 501,
			"budget_raised": 1, "budget_raised_micros": 70_000},
	}
	for i, w := range want {
		if len(ms[i].Fields) != len(w) {
			t.Errorf("minute %s: %v, want %v", ms[i].Start.Format("15:04"), ms[i].Fields, w)
			continue
		}
		for f, n := range w {
			if ms[i].Get(f) != n {
				t.Errorf("minute %s: %s = %d, want %d", ms[i].Start.Format("15:04"), f, ms[i].Get(f), n)
			}
		}
	}
	ttl, err := a.Redis.TTL(ctx, a.Keys.Stats("202611301206")).Result()
	if err != nil || ttl <= time.Hour || ttl > metrics.StatsTTL {
		t.Errorf("TTL of a minute's hash = %v, %v; want about %v", ttl, err, metrics.StatsTTL)
	}

	// Run flushes on its way out.
	rec.JobState("standard", "gpt-4o-mini", "queued")
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { rec.Run(runCtx); close(done) }()
	cancel()
	<-done
	ms, err = metrics.ReadMinutes(ctx, a.Redis, a.Keys, now, 1)
	if err != nil || ms[0].Get("jobs_queued") != 1 {
		t.Errorf("after Run ended: %v, %v; want jobs_queued 1", ms, err)
	}
}

func TestTenantsAreCappedAndSorted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	low, _ := a.Tenant("standard")
	high, _ := a.Tenant("standard")
	spend(t, a, low, 1_000_000)
	spend(t, a, high, 45_000_000)
	newest, _ := a.Tenant("free")

	st := metrics.NewState(metrics.StateDeps{Policy: a.Policy, Limiter: a.Limiter, Budgets: a.Budgets, Store: a.Store},
		metrics.StateOptions{})
	ts, err := st.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, tb := range ts.List {
		order = append(order, tb.ID)
	}
	if !slices.Equal(order, []string{high, low, newest}) || ts.Truncated {
		t.Errorf("order %v truncated %v; want [high low newest] = %v", order, ts.Truncated, []string{high, low, newest})
	}
	if h := ts.List[0]; !h.SoftLimitReached || h.SoftMark != 40_000_000 || h.Remaining != 5_000_000 {
		t.Errorf("high spender: %+v", h)
	}

	capped := metrics.NewState(metrics.StateDeps{Policy: a.Policy, Limiter: a.Limiter, Budgets: a.Budgets, Store: a.Store},
		metrics.StateOptions{MaxTenants: 2})
	ts, err = capped.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts.List) != 2 || !ts.Truncated {
		t.Errorf("MaxTenants 2: %d tenants, truncated %v; want 2, true", len(ts.List), ts.Truncated)
	}
}

func TestWebhookReasonsAreBounded(t *testing.T) {
	t.Parallel()
	rec := metrics.New(metrics.Options{NoProcessMetrics: true})
	for i := range 40 {
		rec.WebhookDelivery("job", "reason_"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	rec.WebhookDelivery("job", strings.Repeat("x", 100))
	mfs, err := rec.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "llmq_webhook_failures_total" {
			continue
		}
		if n := len(mf.GetMetric()); n > 17 {
			t.Errorf("%d webhook failure series; want at most 16 reasons and other", n)
		}
		return
	}
	t.Fatal("no llmq_webhook_failures_total")
}

// llmq_ready says, at each scrape, whether the process reaches each
// dependency: a process that still answers /metrics but not Redis reads 0.
func TestReadyGauge(t *testing.T) {
	t.Parallel()
	rec := metrics.New(metrics.Options{})
	var down atomic.Bool
	if err := rec.WatchReady("redis", func(context.Context) error {
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	read := func() float64 {
		fams, err := rec.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "llmq_ready" {
				m := f.GetMetric()[0]
				if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "dependency" || l[0].GetValue() != "redis" {
					t.Fatalf("labels %v", l)
				}
				return m.GetGauge().GetValue()
			}
		}
		t.Fatal("no llmq_ready")
		return 0
	}
	if v := read(); v != 1 {
		t.Fatalf("reachable: %v, want 1", v)
	}
	down.Store(true)
	if v := read(); v != 0 {
		t.Fatalf("unreachable: %v, want 0", v)
	}
}

// The alert rules pass promtool's checks and its unit tests
// (deploy/prometheus/alerts_test.yml): each alert fires on the series that
// should fire it, with its labels and text, and an idle system fires none.
func TestAlertRulesFire(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: Debian's prometheus package has it (scripts/test installs it)")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = "../../deploy/prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
