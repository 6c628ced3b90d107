package dashboard

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

const (
	chartMinutes = 60
	rateMinutes  = 5
)

type view struct {
	Now          time.Time
	Refresh      int // seconds
	PolicyDigest string
	Workers      int
	WorkersKnown bool

	Summary  []tile
	Charts   []chart
	Models   []modelRow
	Tenants  tenantsView
	Raised   raisedView
	Batches  []batchRow
	Queues   []queueRow
	Waiting  []waitingRow
	API      apiLimitsView
	Problems []string
}

type tile struct{ Key, Label, Value, Note string }

type modelRow struct {
	Model, Deployment               string // one row per deployment
	Buckets                         []bucketRow
	Learned                         []learnedLine
	Paused                          bool
	PausedFor                       string // how long the 429 pause still holds
	PausedUntil                     string // when it ends, UTC
	Calls, Calls429, Unpredicted429 int64
	Rate429                         string
	Hot                             bool // 429 share past 5%
}

type bucketRow struct {
	Name, Unit string
	UsedPct    float64
	Text       string
	Provider   string // what the provider last said the bucket holds
}

type learnedLine struct{ Key, Text string }

type tenantsView struct {
	Rows             []tenantRow
	Read, Failed     int
	Shown            int
	Truncated, Empty bool
}

// raisedView counts the budget days raised to the ledger in the last hour.
type raisedView struct {
	Days  int64
	Added string
}

type tenantRow struct {
	ID, Name, Tier                     string
	Spent, Reserved, Budget, Remaining string
	SpentPct, ReservedPct, SoftPct     float64
	State                              string // ok, soft, exhausted, unlimited
}

type batchRow struct {
	ID, TenantID, Status                        string
	Total, Done, Succeeded, Failed, Outstanding int64
	Pct                                         float64
	Age                                         string
}

type waitingRow struct {
	metrics.Waiting
	Oldest string
}

type queueRow struct {
	queue.QueueStat
	Latency string // shadows QueueStat's
	Late    bool
}

func (s *Server) serveDashboard(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	v := s.build(ctx)
	var buf bytes.Buffer
	if err := s.page.Execute(&buf, v); err != nil {
		s.a.Logger.Error("dashboard: render", "err", err)
		http.Error(w, "500 Internal Server Error: the dashboard could not be rendered.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// build reads every section; a section that fails is named in Problems and
// the rest of the page still shows.
func (s *Server) build(ctx context.Context) *view {
	now := time.Now()
	v := &view{Now: now.UTC(), Refresh: int(s.refresh / time.Second), PolicyDigest: s.a.Policy.Current().Digest}
	v.PolicyDigest = v.PolicyDigest[:min(len(v.PolicyDigest), 12)]
	// fine reports whether a section was read, naming it in Problems when not.
	fine := func(section string, err error) bool {
		if err != nil {
			s.a.Logger.Warn("dashboard: read "+section, "err", err)
			v.Problems = append(v.Problems, fmt.Sprintf("%s could not be read: %v", section, err))
		}
		return err == nil
	}

	minutes, err := metrics.ReadMinutes(ctx, s.a.Redis, s.a.Keys, now, chartMinutes)
	fine("the charts", err)
	v.Summary, v.Charts = summarize(minutes)
	var added money.Micros
	for _, m := range minutes {
		v.Raised.Days += m.Get(metrics.FieldBudgetRaised)
		added += money.Micros(m.Get(metrics.FieldBudgetRaisedMicros))
	}
	v.Raised.Added = money2(added)

	if n, err := s.state.Workers(ctx); err == nil {
		v.Workers, v.WorkersKnown = n, true
	}
	if models, err := s.state.Models(ctx); fine("rate-limit buckets", err) {
		v.Models = modelRows(models, minutes, now)
	}
	if ts, err := s.state.Tenants(ctx); fine("budgets", err) {
		v.Tenants = tenantRows(ts)
	}
	if rows, err := s.batchRows(ctx, now); fine("batches", err) {
		v.Batches = rows
	}
	if api, err := s.apiLimits(ctx); fine("API exemptions", err) {
		v.API = api
	}
	if ws, err := s.state.Waiting(ctx); fine("the fair queues", err) {
		for _, w := range ws[:min(len(ws), 50)] {
			v.Waiting = append(v.Waiting, waitingRow{Waiting: w, Oldest: duration(w.OldestWait)})
		}
	}
	if qs, err := s.a.Inspector.QueueStats(ctx); fine("queues", err) {
		for _, q := range qs {
			v.Queues = append(v.Queues, queueRow{QueueStat: q, Latency: duration(q.Latency), Late: q.Latency > time.Minute})
		}
	}
	return v
}

// summarize turns the per-minute counters into the summary tiles and charts.
func summarize(ms []metrics.Minute) ([]tile, []chart) {
	series := func(f func(m metrics.Minute) float64) []float64 {
		out := make([]float64, len(ms))
		for i, m := range ms {
			out[i] = f(m)
		}
		return out
	}
	get := func(field string) []float64 {
		return series(func(m metrics.Minute) float64 { return float64(m.Get(field)) })
	}
	succeeded := get(metrics.FieldJobs + string(store.JobSucceeded))
	failed := get(metrics.FieldJobs + string(store.JobFailed))
	created := get(metrics.FieldJobs + string(store.JobQueued))
	in, out := get(metrics.FieldTokensIn), get(metrics.FieldTokensOut)
	spend := series(func(m metrics.Minute) float64 { return money.Micros(m.Get(metrics.FieldCostMicros)).USD() })
	calls, c429 := get(metrics.FieldCalls), get(metrics.FieldCalls429)

	recent429, recentCalls := sum(c429[max(0, len(c429)-rateMinutes):]), sum(calls[max(0, len(calls)-rateMinutes):])
	tiles := []tile{
		{Key: "jobs", Label: "Jobs done, last hour", Value: group(int64(sum(succeeded))),
			Note: group(int64(sum(failed))) + " failed, " + group(int64(sum(created))) + " via POST /v1/jobs (batch lines not counted)"},
		{Key: "tokens", Label: "Tokens, last hour", Value: group(int64(sum(in) + sum(out))), Note: group(int64(sum(in))) + " in, " + group(int64(sum(out))) + " out"},
		{Key: "spend", Label: "Spend, last hour", Value: usd(sum(spend))},
		{Key: "429", Label: "429 share, last 5 min", Value: percent(recent429, recentCalls), Note: group(int64(recent429)) + " of " + group(int64(recentCalls)) + " calls"},
	}
	charts := []chart{
		newChart("Throughput (jobs/min)", "jobs", ms, []line{{"succeeded", "ok", succeeded}, {"failed", "bad", failed}, {"via /v1/jobs", "muted", created}}),
		newChart("Tokens (per min)", "tokens", ms, []line{{"input", "ok", in}, {"output", "alt", out}}),
		newChart("Spend (USD/min)", "usd", ms, []line{{"spend", "alt", spend}}),
		newChart("Provider calls (per min)", "calls", ms, []line{{"calls", "ok", calls}, {"429", "bad", c429}}),
	}
	return tiles, charts
}

func sum(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t
}

func modelRows(models []metrics.ModelLevel, ms []metrics.Minute, now time.Time) []modelRow {
	recent := ms[max(0, len(ms)-rateMinutes):]
	rows := make([]modelRow, 0, len(models))
	for _, m := range models {
		row := modelRow{Model: m.Model, Deployment: m.Scope, Paused: m.Paused}
		if m.Paused {
			row.PausedFor = duration(m.PausedFor)
			row.PausedUntil = now.Add(m.PausedFor).UTC().Format("15:04:05") + " UTC"
		}
		for _, mm := range recent {
			row.Calls += mm.Get(metrics.FieldCalls + ":" + m.Scope)
			row.Calls429 += mm.Get(metrics.FieldCalls429 + ":" + m.Scope)
			row.Unpredicted429 += mm.Get(metrics.FieldUnpredicted429 + ":" + m.Model)
		}
		row.Rate429 = percent(float64(row.Calls429), float64(row.Calls))
		row.Hot = row.Calls > 0 && float64(row.Calls429)/float64(row.Calls) > 0.05
		for _, b := range m.Buckets {
			br := bucketRow{Name: b.Name, Unit: unitName(b.Unit), Text: group(b.Remaining) + " / " + group(b.Limit),
				UsedPct: clampPct(float64(b.Limit-b.Remaining) / float64(b.Limit) * 100)}
			if l := learnedBucket(m.Learned, b.Name); l != nil && l.ProviderRemaining >= 0 {
				br.Provider = group(l.ProviderRemaining) + " left, " + duration(m.Learned.Time.Sub(l.ProviderSeen)) + " ago"
			}
			row.Buckets = append(row.Buckets, br)
		}
		row.Learned = learnedLines(m.Learned)
		rows = append(rows, row)
	}
	return rows
}

func learnedBucket(l *limiter.ScopeLearning, name string) *limiter.BucketLearning {
	if l == nil {
		return nil
	}
	if i := slices.IndexFunc(l.Buckets, func(b limiter.BucketLearning) bool { return b.Name == name }); i >= 0 {
		return &l.Buckets[i]
	}
	return nil
}

// learnedLines says, for an operator, what a model's buckets learned.
func learnedLines(l *limiter.ScopeLearning) []learnedLine {
	if l == nil {
		return nil
	}
	var out []learnedLine
	add := func(key, format string, args ...any) {
		out = append(out, learnedLine{Key: key, Text: fmt.Sprintf(format, args...)})
	}
	for _, b := range l.Buckets {
		if b.ProviderRemaining < 0 {
			continue // the provider says nothing of this bucket
		}
		switch {
		case b.Refund < 0:
			add("refund:"+b.Name, "%s: refunds not seen yet (unused max_tokens stay counted)", b.Name)
		case b.Refund < 0.25:
			add("refund:"+b.Name, "%s: keeps max_tokens charged (~%s of unused tokens back)", b.Name, percent(b.Refund, 1))
		case b.Refund > 0.75:
			add("refund:"+b.Name, "%s: gives back unused tokens (~%s)", b.Name, percent(b.Refund, 1))
		default:
			add("refund:"+b.Name, "%s: gives back some unused tokens (~%s, not clear yet)", b.Name, percent(b.Refund, 1))
		}
		if b.Drain > 0.01 {
			add("drain:"+b.Name, "%s: others use ~%s of the refill", b.Name, percent(b.Drain, 1))
		}
	}
	for _, b := range l.Buckets {
		if b.Factor < 0.999 {
			add("factor:"+b.Name, "%s: %s of the limit after unpredicted 429s", b.Name, percent(b.Factor, 1))
		}
		switch {
		case b.Burst < 0:
		case b.BurstFactor < 0.999:
			add("burst:"+b.Name, "%s: enforced over a shorter window than its period (429s with room shown): at most %s of refill at once",
				b.Name, b.BurstWindow.Round(time.Millisecond))
		default:
			add("burst:"+b.Name, "%s: at most %s of refill at once", b.Name, b.BurstWindow.Round(time.Millisecond))
		}
		switch {
		case b.Burst < 0:
		case b.PaceFactor < 0.999:
			add("pace:"+b.Name, "%s: paced at %s of the limit (the provider's window frees in blocks)", b.Name, percent(b.PaceFactor, 1))
		case b.PaceFactor > 1.001:
			add("pace:"+b.Name, "%s: paced up to ×%.2f the limit while the provider shows room", b.Name, b.PaceFactor)
		}
	}
	if l.Calibration.Samples > 0 {
		add("calibration", "prompts counted ×%.2f (median of %d calls)", l.Calibration.Factor, l.Calibration.Samples)
	}
	if l.Distrusted {
		add("distrusted", "remaining counts distrusted until %s", l.DistrustedUntil.UTC().Format(time.TimeOnly))
	}
	return out
}

func unitName(u limiter.Unit) string { return u.String() }

func tenantRows(ts *metrics.Tenants) tenantsView {
	tv := tenantsView{Read: len(ts.List), Failed: ts.Failed, Truncated: ts.Truncated, Empty: len(ts.List) == 0}
	for _, t := range ts.List[:min(len(ts.List), maxTenantRows)] {
		row := tenantRow{ID: t.ID, Name: t.Name, Tier: t.Tier, Spent: money2(t.Spent), Reserved: money2(t.Reserved)}
		switch {
		case t.Unlimited:
			row.State, row.Budget, row.Remaining = "unlimited", "unlimited", "—"
		default:
			row.Budget, row.Remaining = money2(t.Budget), money2(t.Remaining)
			if t.Budget > 0 {
				row.SpentPct = clampPct(float64(t.Spent) / float64(t.Budget) * 100)
				row.ReservedPct = clampPct(float64(t.Reserved)/float64(t.Budget)*100+row.SpentPct) - row.SpentPct
				row.SoftPct = clampPct(float64(t.SoftMark) / float64(t.Budget) * 100)
			}
			switch {
			case t.Exhausted || t.Remaining == 0:
				row.State = "exhausted"
			case t.SoftLimitReached:
				row.State = "soft"
			default:
				row.State = "ok"
			}
		}
		tv.Rows = append(tv.Rows, row)
	}
	tv.Shown = len(tv.Rows)
	return tv
}

// batchRows reads the unfinished batches, oldest first, with their jobs
// counted by status.
func (s *Server) batchRows(ctx context.Context, now time.Time) ([]batchRow, error) {
	bs, _, err := s.a.Store.BatchListActive(ctx, &store.BatchListActiveParams{Limit: maxBatchRows})
	if err != nil {
		return nil, err
	}
	rows := make([]batchRow, 0, len(bs))
	for _, b := range bs {
		c, err := s.a.Store.JobCountsByBatch(ctx, b.ID)
		if err != nil {
			return nil, fmt.Errorf("batch %s: %w", b.ID, err)
		}
		total := max(b.Total, c.Total)
		done := c.Succeeded + c.Failed + c.Cancelled
		row := batchRow{
			ID: b.ID, TenantID: b.TenantID, Status: string(b.Status), Total: total, Done: done,
			Succeeded: c.Succeeded, Failed: c.Failed, Outstanding: total - done, Age: duration(now.Sub(b.CreatedAt)),
		}
		if total > 0 {
			row.Pct = clampPct(float64(done) / float64(total) * 100)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func clampPct(p float64) float64 { return max(0, min(100, p)) }

// group writes n with thousands separators: 1234567 -> "1,234,567".
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	digits := 0 // where the digits start
	if n < 0 {
		digits = 1
	}
	for i := len(s) - 3; i > digits; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// money2 formats dollars with cents, or more digits below a cent.
func money2(m money.Micros) string { return usd(m.USD()) }

func usd(v float64) string {
	switch a := math.Abs(v); {
	case a == 0 || a >= 1:
		whole, frac, _ := strings.Cut(strconv.FormatFloat(v, 'f', 2, 64), ".")
		n, _ := strconv.ParseInt(whole, 10, 64)
		return "$" + group(n) + "." + frac
	case a >= 0.01:
		return "$" + strconv.FormatFloat(v, 'f', 4, 64)
	}
	return "$" + strconv.FormatFloat(v, 'f', 6, 64)
}

func percent(part, whole float64) string {
	if whole <= 0 {
		return "—"
	}
	return strconv.FormatFloat(part/whole*100, 'f', 1, 64) + "%"
}

func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

var funcs = template.FuncMap{
	"pct":   func(p float64) string { return strconv.FormatFloat(p, 'f', 1, 64) },
	"group": group,
	"join":  func(es []string) string { return strings.Join(es, "; ") },
	"time":  func(t time.Time) string { return t.Format("2006-01-02 15:04:05 UTC") },
}
