package pacer

import (
	"cmp"
	"context"
	_ "embed" // the script's Lua
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/rkeys"
)

// Learned is the one store of the limits providers announce for the rpm and
// tpm buckets, shared by every worker through Redis. A route's buckets use
// the lower of the policy's limit and the provider's, until LearnedTTL after
// the provider last announced it. A disagreement is logged and observed
// once per change.
type Learned struct {
	rdb    redis.UniversalClient
	keys   rkeys.Builder
	logger *slog.Logger
	obs    Observer
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]learnedEntry // by scope name
}

const (
	LearnedTTL     = 10 * time.Minute // how long an announced limit applies after it was last seen
	learnedRefresh = time.Second      // how long a worker reuses what it read from Redis
)

type learnedEntry struct {
	rpm, tpm int64 // 0 = not learned
	read     time.Time
	written  time.Time
}

// NewLearned returns the learned limits kept in rdb.
func NewLearned(rdb redis.UniversalClient, keys rkeys.Builder, logger *slog.Logger, obs Observer) *Learned {
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	if obs == nil {
		obs = nopObserver{}
	}
	return &Learned{rdb: rdb, keys: keys, logger: logger, obs: obs, now: time.Now, cache: map[string]learnedEntry{}}
}

// Scope returns m's limiter scope (admission.Scope) with the policy's
// limits lowered to what the provider announced (the policy's when Redis
// cannot be read).
func (l *Learned) Scope(ctx context.Context, m config.Route) limiter.Scope {
	e := l.entry(ctx, m.Deployment.Name())
	d := *m.Deployment
	if lowers(e.rpm, d.Limits.RPM) {
		d.Limits.RPM = e.rpm
	}
	if lowers(e.tpm, d.Limits.TPM) {
		d.Limits.TPM = e.tpm
	}
	m.Deployment = &d
	return admission.Scope(m)
}

func (l *Learned) entry(ctx context.Context, scope string) learnedEntry {
	now := l.now()
	l.mu.Lock()
	e, ok := l.cache[scope]
	l.mu.Unlock()
	if ok && now.Sub(e.read) < learnedRefresh {
		return e
	}
	vals, err := l.rdb.HMGet(ctx, l.keys.LearnedLimits(scope), "rpm", "tpm").Result()
	if err != nil {
		l.logger.Warn("read learned limits", "scope", scope, "err", err)
		return e
	}
	e.rpm, e.tpm, e.read = parseLimit(vals[0]), parseLimit(vals[1]), now
	l.mu.Lock()
	if prev, ok := l.cache[scope]; ok {
		e.written = prev.written
	}
	l.cache[scope] = e
	l.mu.Unlock()
	return e
}

func parseLimit(v any) int64 {
	s, _ := v.(string) // nil: not learned
	n, _ := strconv.ParseInt(s, 10, 64)
	return max(n, 0)
}

// Observe records the limits a provider announced in an answer for m,
// writing Redis only when they changed or to keep them alive; the one
// caller whose write made a change reports it.
func (l *Learned) Observe(ctx context.Context, m config.Route, rl llm.RateLimit) {
	rpm, tpm := rl.LimitRequests, rl.LimitTokens
	if rpm == 0 && tpm == 0 {
		return
	}
	scope := m.Deployment.Name()
	e := l.entry(ctx, scope)
	now := l.now()
	if e.rpm == rpm && e.tpm == tpm && now.Sub(e.written) < LearnedTTL/4 {
		return
	}
	vals, err := recordLearnedScript.Run(ctx, l.rdb, []string{l.keys.LearnedLimits(scope)},
		strconv.FormatInt(rpm, 10), strconv.FormatInt(tpm, 10), LearnedTTL.Milliseconds()).Slice()
	if err == nil && len(vals) != 2 {
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	if err != nil {
		l.logger.Warn("record learned limits", "scope", scope, "err", err)
		return
	}
	l.mu.Lock()
	l.cache[scope] = learnedEntry{rpm: rpm, tpm: tpm, read: now, written: now}
	l.mu.Unlock()
	prevRPM, prevTPM := parseLimit(vals[0]), parseLimit(vals[1])
	if prevRPM == rpm && prevTPM == tpm {
		return // another caller recorded this change first, or nothing changed
	}
	lower := lowers(rpm, m.Limits.RPM) || lowers(tpm, m.Limits.TPM)
	higher := raises(rpm, m.Limits.RPM) || raises(tpm, m.Limits.TPM)
	differed := lowers(prevRPM, m.Limits.RPM) || lowers(prevTPM, m.Limits.TPM) ||
		raises(prevRPM, m.Limits.RPM) || raises(prevTPM, m.Limits.TPM)
	args := []any{"model", m.Model.Name, "policy_rpm", m.Limits.RPM, "provider_rpm", rpm, "policy_tpm", m.Limits.TPM, "provider_tpm", tpm}
	switch {
	case lower:
		l.logger.Warn("provider's limits are lower than the policy's; the buckets follow the provider's", args...)
	case higher:
		l.logger.Info("provider's limits are higher than the policy's; the policy's apply", args...)
	case differed:
		l.logger.Info("provider's limits agree with the policy's again", args...)
	default:
		return
	}
	l.obs.LimitsLearned(m.Model.Name, rpm, tpm)
}

// recordLearnedScript stores a scope's announced limits and returns the
// ones stored before.
//
//go:embed record_learned.lua
var recordLearnedLua string
var recordLearnedScript = redis.NewScript(recordLearnedLua)

func lowers(announced, policy int64) bool {
	return announced > 0 && (policy == 0 || announced < policy)
}

func raises(announced, policy int64) bool {
	return announced > 0 && policy > 0 && announced > policy
}
