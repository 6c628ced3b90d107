package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/wire"
)

// rateLimit applies the API limits of the key's tier (unless the tier, the
// tenant or the key is exempt) and sets X-RateLimit-* on the response: on
// success those of the tightest window, on a 429 those of the window that
// refused (the one that frees last), with X-RateLimit-Window naming it, and
// X-RateLimit-Warning once a window passes the tier's api_soft_limit. A
// request counts in the key's own windows (the tier's api_limits) and, for
// an endpoint with its own limits, that endpoint's too, all in the key's
// scope so one script counts them together.
func (s *Server) rateLimit(ctx context.Context, h http.Header, endpoint string, c *caller) error {
	tier, key := c.tier, c.key
	if tier.APIExempt || c.tenant.APIExempt || key.APIExempt || s.APILimiter == nil {
		return nil
	}
	set := limiter.WindowSet{Algorithm: tier.APIAlgorithm, Scope: "api:" + key.ID, Windows: tier.APILimits.Windows("")}
	el, own := tier.APIEndpointLimits[endpoint]
	if own {
		set.Windows = append(set.Windows, el.Windows(endpoint+":")...)
	}
	var res *limiter.Result
	var err error
	if tier.APILease > 0 && !own {
		// Endpoints with limits of their own are the costly, rarely called
		// ones: they are counted per request.
		res, err = s.leases.take(ctx, s.APILimiter, key.ID, set, tier.APILease)
	} else {
		res, err = s.count(ctx, windowKey{tier: tier, keyID: key.ID, endpoint: endpoint}, set)
	}
	if err != nil {
		return err
	}
	i := res.Tightest()
	if i < 0 {
		return nil
	}
	b := res.Buckets[i]
	setRateLimitHeaders(h, b, max(b.Remaining, 0), b.Name)
	if warn := softWarning(res, tier.APISoftLimit); warn != "" {
		h.Set("X-RateLimit-Warning", warn)
	}
	if !res.Allowed {
		e := wire.Errorf(http.StatusTooManyRequests, wire.TypeRateLimit, client.CodeRateLimitExceeded, "",
			"Rate limit of %s for this API key reached. Retry after %v.", describeWindow(b), res.RetryAfter.Round(time.Millisecond))
		e.RetryAfter = res.RetryAfter
		return e
	}
	return nil
}

// windowKey names a key's windows for one endpoint under one policy
// snapshot (its tier): requests of one key share a count only when they
// count in the same windows.
type windowKey struct {
	tier            *config.Tier
	keyID, endpoint string
}

// windowCount is one count of a key's windows, shared by the requests it
// counts.
type windowCount struct {
	res *limiter.Result
	err error
}

// count counts one request in set. The key's requests that come while
// another's count is under way are counted together, n at once, in the
// next count: all of them or none, so a denial of the group (a window
// without room for all n, or smaller than n) is counted again request by
// request, each allowed or refused on its own. Either way each request is
// counted once, and in a count made after it came.
func (s *Server) count(ctx context.Context, key windowKey, set limiter.WindowSet) (*limiter.Result, error) {
	c, n, err := s.counts.Do(ctx, key, func(ctx context.Context, n int) windowCount {
		res, err := s.APILimiter.Allow(ctx, set, int64(n))
		return windowCount{res, err}
	})
	switch {
	case err != nil:
		return nil, err
	case n > 1 && (errors.Is(c.err, limiter.ErrCostExceedsCapacity) || c.err == nil && !c.res.Allowed):
		// More than a window holds, or more than it has room for now.
		return s.APILimiter.Allow(ctx, set, 1)
	}
	return c.res, c.err
}

// softWarning names every window past the soft fraction of its limit, e.g.
// "minute: 41 of 50 used (82%, soft limit 80%)"; empty when none is.
func softWarning(res *limiter.Result, soft float64) string {
	var parts []string
	for _, b := range res.Buckets {
		used := b.Limit - max(b.Remaining, 0)
		if float64(used) >= soft*float64(b.Limit) {
			parts = append(parts, fmt.Sprintf("%s: %d of %d used (%.0f%%, soft limit %.0f%%)",
				b.Name, used, b.Limit, 100*float64(used)/float64(b.Limit), 100*soft))
		}
	}
	return strings.Join(parts, "; ")
}

// describeWindow says what a window limits: "50 requests per minute", or
// "10 requests per minute to files.create".
func describeWindow(b limiter.BucketState) string {
	endpoint, window, ok := strings.Cut(b.Name, ":")
	if !ok {
		return fmt.Sprintf("%d requests per %s", b.Limit, b.Name)
	}
	return fmt.Sprintf("%d requests per %s to %s", b.Limit, window, endpoint)
}

// setRateLimitHeaders sets the X-RateLimit-* headers of window b, named
// window, with remaining requests left in it.
func setRateLimitHeaders(h http.Header, b limiter.BucketState, remaining int64, window string) {
	h.Set("X-RateLimit-Limit", strconv.FormatInt(b.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(int64((b.ResetAfter+time.Second-1)/time.Second), 10))
	h.Set("X-RateLimit-Window", window)
}

// leases holds a dispatcher's leases of its keys' windows (a tier's
// api_lease), one per key, replaced when the policy changes the key's
// windows or slice. A key's lease gives back its unspent part at its next
// request after MaxAge.
type leases struct {
	mu sync.Mutex
	m  map[string]*keyLease
}

type keyLease struct {
	lease *limiter.WindowPrefetch
	size  int64
}

func (ls *leases) take(ctx context.Context, w *limiter.Windows, keyID string, set limiter.WindowSet, size int64) (*limiter.Result, error) {
	res, err := ls.lease(ctx, w, keyID, set, size).Take(ctx, 1)
	if errors.Is(err, limiter.ErrPrefetchClosed) {
		// Replaced by a request that saw a newer policy meanwhile.
		return ls.lease(ctx, w, keyID, set, size).Take(ctx, 1)
	}
	return res, err
}

// lease returns key's lease of set with slices of size, replacing one of
// other windows or slices.
func (ls *leases) lease(ctx context.Context, w *limiter.Windows, keyID string, set limiter.WindowSet, size int64) *limiter.WindowPrefetch {
	ls.mu.Lock()
	if ls.m == nil {
		ls.m = map[string]*keyLease{}
	}
	kl := ls.m[keyID]
	var old *limiter.WindowPrefetch
	if kl != nil && (kl.size != size || !sameSet(kl.lease.Set(), set)) {
		old, kl = kl.lease, nil
	}
	if kl == nil {
		kl = &keyLease{lease: w.Prefetch(set, limiter.PrefetchOptions{Size: size}), size: size}
		ls.m[keyID] = kl
	}
	ls.mu.Unlock()
	if old != nil {
		// Best effort: what it cannot give back stays counted until its
		// windows pass.
		_ = old.Close(context.WithoutCancel(ctx))
	}
	return kl.lease
}

func sameSet(a, b limiter.WindowSet) bool {
	return a.Algorithm == b.Algorithm && a.Scope == b.Scope && slices.Equal(a.Windows, b.Windows)
}
