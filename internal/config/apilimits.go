package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/limiter"
)

// Defaults and bounds of the API's limits; a sliding_log window keeps an
// entry per request.
const (
	DefaultAPISoftLimit   = 0.8
	DefaultWebhookHostRPS = 10
	MaxSlidingLogLimit    = 10000
	maxWebhookHostRPS     = 100000
)

// DefaultAuthFailureLimits are the failed authentications a client address
// may make per window.
var DefaultAuthFailureLimits = APILimits{Minute: 20}

// APIEndpoints are the tenant endpoints api_endpoint_limits may name.
var APIEndpoints = []string{
	"jobs.create", "jobs.list", "jobs.retrieve", "jobs.cancel",
	"files.create", "files.list", "files.retrieve", "files.content", "files.delete",
	"batches.create", "batches.list", "batches.retrieve", "batches.cancel",
	"usage.retrieve",
}

// APILimits are request limits per window; 0 means no such window.
type APILimits struct {
	Second int64 `yaml:"second"`
	Minute int64 `yaml:"minute"`
	Hour   int64 `yaml:"hour"`
	Day    int64 `yaml:"day"`
}

var apiWindowNames = [4]string{"second", "minute", "hour", "day"}

var apiWindowPeriods = [4]time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}

func (l APILimits) values() [4]int64 { return [4]int64{l.Second, l.Minute, l.Hour, l.Day} }

// IsZero reports whether no window is set.
func (l APILimits) IsZero() bool { return l == APILimits{} }

// Windows returns the windows that are set, from second to day, each named
// prefix + its window ("files.create:minute").
func (l APILimits) Windows(prefix string) []limiter.NamedWindow {
	var ws []limiter.NamedWindow
	for i, v := range l.values() {
		if v > 0 {
			ws = append(ws, limiter.NamedWindow{Name: prefix + apiWindowNames[i],
				Window: limiter.Window{Limit: v, Period: apiWindowPeriods[i]}})
		}
	}
	return ws
}

// smallest is the lowest limit set; 0 when none is.
func (l APILimits) smallest() int64 {
	var s int64
	for _, v := range l.values() {
		if v > 0 && (s == 0 || v < s) {
			s = v
		}
	}
	return s
}

// build checks the limits read at path; nil is none.
func (r *APILimits) build(src *source, path string) APILimits {
	if r == nil {
		return APILimits{}
	}
	for i, v := range r.values() {
		if v < 0 {
			src.fail(path+"."+apiWindowNames[i], "must be 0 or more (0 = no such window), got %d", v)
		}
	}
	return *r
}

// checkLogCap refuses a sliding_log tier's windows above MaxSlidingLogLimit.
func checkLogCap(src *source, path string, l APILimits, alg limiter.Algorithm) {
	for i, v := range l.values() {
		if alg == limiter.AlgSlidingLog && v > MaxSlidingLogLimit {
			src.fail(path+"."+apiWindowNames[i],
				"%d is more than sliding_log allows (%d): it keeps an entry per request for the whole window; use sliding_window or token_bucket for larger limits",
				v, MaxSlidingLogLimit)
		}
	}
}

// buildAPI reads the tier's API and webhook limits into t.
func (rt rawTier) buildAPI(src *source, path string, t *Tier) {
	t.APIAlgorithm = limiter.AlgSlidingWindow
	t.APISoftLimit = DefaultAPISoftLimit
	t.WebhookHostRPS = positive(src, path+".webhook_host_rps", rt.WebhookHostRPS, DefaultWebhookHostRPS,
		maxWebhookHostRPS, fmt.Sprintf("%d deliveries per second", maxWebhookHostRPS))
	if rt.APIExempt {
		for _, f := range []struct {
			name string
			set  bool
			got  any
		}{
			{"api_rps", rt.APIRPS != 0, rt.APIRPS}, {"api_limits", rt.APILimits != nil, "a mapping"},
			{"api_algorithm", rt.APIAlgorithm != "", rt.APIAlgorithm}, {"api_soft_limit", rt.APISoftLimit != nil, "a fraction"},
			{"api_endpoint_limits", rt.APIEndpointLimits != nil, "a mapping"}, {"api_lease", rt.APILease != 0, rt.APILease},
		} {
			if f.set {
				src.fail(path+"."+f.name, "must not be set together with api_exempt: true, got %v", f.got)
			}
		}
		return
	}

	if rt.APIAlgorithm != "" {
		t.APIAlgorithm = limiter.Algorithm(rt.APIAlgorithm)
		if !slices.Contains(limiter.Algorithms, t.APIAlgorithm) {
			names := make([]string, len(limiter.Algorithms))
			for i, a := range limiter.Algorithms {
				names[i] = string(a)
			}
			hint := suggest(rt.APIAlgorithm, names, "")
			if !strings.Contains(hint, "did you mean") {
				hint = ""
			}
			src.fail(path+".api_algorithm", "must be sliding_window, fixed_window, sliding_log or token_bucket, got %q%s", rt.APIAlgorithm, hint)
		}
	}
	limits := rt.APILimits.build(src, path+".api_limits")
	switch {
	case rt.APIRPS < 0:
		src.fail(path+".api_rps", "must be at least 1, got %d", rt.APIRPS)
	case rt.APIRPS > 0 && limits.Second > 0:
		src.fail(path+".api_rps", "is short for api_limits.second, which is set too; give only one")
	case rt.APIRPS > 0:
		limits.Second = int64(rt.APIRPS)
	}
	if limits.IsZero() {
		src.fail(path+".api_limits",
			"required: at least one window above 0, such as {second: 50, day: 100000} (api_rps: 50 is short for {second: 50}), or api_exempt: true")
	}
	lp := path + ".api_limits"
	if rt.APILimits == nil {
		lp = path + ".api_rps"
	}
	checkLogCap(src, lp, limits, t.APIAlgorithm)
	t.APILimits = limits
	t.APISoftLimit = positive(src, path+".api_soft_limit", rt.APISoftLimit, DefaultAPISoftLimit, 1, "1")
	if rt.APILease < 0 || rt.APILease > limits.smallest() {
		src.fail(path+".api_lease", "must be from 0 (no lease: a round trip per request) to the smallest api_limits window, %d, got %d",
			limits.smallest(), rt.APILease)
	}
	t.APILease = rt.APILease

	for _, name := range sortedKeys(rt.APIEndpointLimits) {
		ep := path + ".api_endpoint_limits." + name
		if !slices.Contains(APIEndpoints, name) {
			src.fail(ep, "unknown endpoint%s", suggest(name, APIEndpoints, "endpoints"))
		}
		raw := rt.APIEndpointLimits[name]
		el := raw.build(src, ep)
		if el.IsZero() {
			src.fail(ep, "must set at least one window above 0, such as {minute: 10}")
		}
		own := limits.values()
		for i, v := range el.values() {
			if v > 0 && own[i] > 0 && v > own[i] {
				src.fail(ep+"."+apiWindowNames[i],
					"%d is more than api_limits.%s (%d): a request counts against both, so it would never bind", v, apiWindowNames[i], own[i])
			}
		}
		checkLogCap(src, ep, el, t.APIAlgorithm)
		if t.APIEndpointLimits == nil {
			t.APIEndpointLimits = map[string]APILimits{}
		}
		t.APIEndpointLimits[name] = el
	}
}

// String renders limits as "50/second, 200000/day", or "none".
func (l APILimits) String() string {
	if l.IsZero() {
		return "none"
	}
	var parts []string
	for _, w := range l.Windows("") {
		parts = append(parts, fmt.Sprintf("%d/%s", w.Limit, w.Name))
	}
	return strings.Join(parts, ", ")
}
