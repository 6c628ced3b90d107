package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/rkeys"
)

// The dashboard charts the last hour across every process without
// Prometheus: each Recorder adds its events to one Redis hash per minute
// (rkeys.Builder.Stats).

// Fields of the per-minute hashes.
const (
	// FieldJobs + a job status counts the jobs that reached it.
	FieldJobs = "jobs_"
	// Tokens and spend (µ$) of succeeded jobs.
	FieldTokensIn   = "tokens_in"
	FieldTokensOut  = "tokens_out"
	FieldCostMicros = "cost_micros"
	// Provider calls and their 429s, and with ":" + a deployment, those of
	// one deployment.
	FieldCalls    = "calls"
	FieldCalls429 = "calls_429"
	// 429s on calls the buckets admitted, and with ":" + a model, a model's.
	FieldUnpredicted429 = "unpredicted_429"
	// Jobs a worker put back because their permit was more than its inline
	// wait away, and with ":" + a model, a model's.
	FieldLimiterRequeued = "limiter_requeued"
	FieldWebhookFailures = "webhook_failures"
	// Budget days raised to the ledger, and what they added (µ$).
	FieldBudgetRaised       = "budget_raised"
	FieldBudgetRaisedMicros = "budget_raised_micros"
)

// StatsTTL is how long a minute's hash lives: an hour, and a margin.
const StatsTTL = 2 * time.Hour

func minuteID(t time.Time) string { return t.UTC().Format("200601021504") }

// statsBuffer adds up events per minute until the next flush; a nil one
// ignores everything.
type statsBuffer struct {
	rdb  redis.UniversalClient
	keys rkeys.Builder
	now  func() time.Time
	log  *slog.Logger

	mu      sync.Mutex
	pending map[int64]map[string]int64 // Unix minute -> field -> count
	failing bool                       // the last flush failed: log once
}

func (b *statsBuffer) add(field string, n int64) {
	if b == nil || n == 0 {
		return
	}
	m := b.now().Unix() / 60
	b.mu.Lock()
	f := b.pending[m]
	if f == nil {
		f = map[string]int64{}
		b.pending[m] = f
	}
	f[field] += n
	b.mu.Unlock()
}

// addPer adds one to field, and to field + ":" + key.
func (b *statsBuffer) addPer(field, key string) {
	b.add(field, 1)
	b.add(field+":"+key, 1)
}

// flush writes what accumulated. On failure the counts are dropped: a
// pipeline can fail half applied, and a gap is better than counting twice.
func (b *statsBuffer) flush(ctx context.Context) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	p := b.pending
	b.pending = map[int64]map[string]int64{}
	b.mu.Unlock()
	if len(p) == 0 {
		return nil
	}
	pipe := b.rdb.Pipeline()
	for m, fields := range p {
		key := b.keys.Stats(minuteID(time.Unix(m*60, 0)))
		for f, n := range fields {
			pipe.HIncrBy(ctx, key, f, n)
		}
		pipe.Expire(ctx, key, StatsTTL)
	}
	_, err := pipe.Exec(ctx)
	b.mu.Lock()
	wasFailing := b.failing
	b.failing = err != nil
	b.mu.Unlock()
	if err != nil && !wasFailing {
		b.log.Warn("metrics: write per-minute counters", "err", err)
	}
	return err
}

// Run writes the per-minute counters every flushInterval until ctx ends,
// then once more.
func (r *Recorder) Run(ctx context.Context) {
	if r.stats == nil {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(flushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = r.stats.flush(fctx)
			cancel()
			return
		case <-t.C:
			_ = r.stats.flush(ctx)
		}
	}
}

// Flush writes the per-minute counters gathered so far.
func (r *Recorder) Flush(ctx context.Context) error { return r.stats.flush(ctx) }

// Minute is one minute of counters, summed over every process.
type Minute struct {
	Start  time.Time
	Fields map[string]int64
}

// Get returns a field's count.
func (m Minute) Get(field string) int64 { return m.Fields[field] }

// ReadMinutes returns the n minutes up to the one holding now, oldest first.
func ReadMinutes(ctx context.Context, rdb redis.UniversalClient, keys rkeys.Builder, now time.Time, n int) ([]Minute, error) {
	last := now.UTC().Truncate(time.Minute)
	out := make([]Minute, n)
	cmds := make([]*redis.MapStringStringCmd, n)
	pipe := rdb.Pipeline()
	for i := range out {
		out[i].Start = last.Add(-time.Duration(n-1-i) * time.Minute)
		cmds[i] = pipe.HGetAll(ctx, keys.Stats(minuteID(out[i].Start)))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("metrics: read per-minute counters: %w", err)
	}
	for i, c := range cmds {
		raw := c.Val()
		out[i].Fields = make(map[string]int64, len(raw))
		for f, v := range raw {
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("metrics: per-minute counter %s of %s is %q, not a number", f, minuteID(out[i].Start), v)
			}
			out[i].Fields[f] = x
		}
	}
	return out, nil
}
