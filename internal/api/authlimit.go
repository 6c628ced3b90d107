package api

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/wire"
)

// clientAddr is the address a request comes from: the connection's, unless
// that is a trusted proxy, whose X-Forwarded-For is then read from the
// right past every trusted proxy to the first address that is not one
// (entries further left were written by the client); an entry that is not
// an address ends the walk. IPv6 clients are counted by their /64.
func clientAddr(r *http.Request, trusted []netip.Prefix) netip.Prefix {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Prefix{}
	}
	addr := ap.Addr().Unmap()
	if isTrusted(addr, trusted) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop := strings.TrimSpace(hops[i])
			if hop == "" {
				continue
			}
			h, ok := parseHop(hop)
			if !ok {
				break
			}
			addr = h
			if !isTrusted(h, trusted) {
				break
			}
		}
	}
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p
	}
	return netip.PrefixFrom(addr, 32)
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	return slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Contains(a) })
}

// parseHop reads one X-Forwarded-For entry: an address, bracketed or with a
// port as some proxies write it.
func parseHop(h string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(h); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// maxBlocked caps the addresses a dispatcher remembers as blocked: past it,
// new ones are refused by Redis's count at their next failure instead.
const maxBlocked = 10000

// authFailures limits failed authentications per client address (the
// policy's auth_failure_limits). The credential is checked first, so an
// attacker behind the same NAT as real clients locks out only its own
// guesses. Failures are counted in Redis; an address that reached the limit
// is remembered here until its window frees, refused without a round trip.
type authFailures struct {
	mu      sync.Mutex
	blocked map[netip.Prefix]time.Time // until when
}

// blockedFor returns how long addr stays refused here; 0 when it is not.
func (f *authFailures) blockedFor(addr netip.Prefix, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	until, ok := f.blocked[addr]
	if !ok {
		return 0
	}
	if !now.Before(until) {
		delete(f.blocked, addr)
		return 0
	}
	return until.Sub(now)
}

func (f *authFailures) block(addr netip.Prefix, until, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.blocked == nil {
		f.blocked = map[netip.Prefix]time.Time{}
	}
	if len(f.blocked) >= maxBlocked {
		for a, u := range f.blocked {
			if !now.Before(u) {
				delete(f.blocked, a)
			}
		}
		if len(f.blocked) >= maxBlocked {
			return
		}
	}
	f.blocked[addr] = until
}

// authFailed counts a failed authentication of the request's address and
// returns e (the 401), or a 429 once the address has used up its failures
// (at once, without counting, while this dispatcher remembers it blocked).
// When the count cannot be made the 401 stands: a client's mistake is never
// a 500.
func (s *Server) authFailed(w http.ResponseWriter, r *http.Request, e *wire.Error) error {
	lim := s.Policy.Current().AuthFailureLimits
	if s.APILimiter == nil || lim.IsZero() {
		return e
	}
	addr := clientAddr(r, s.opts.TrustedProxies)
	if d := s.authFails.blockedFor(addr, s.opts.Now()); d > 0 {
		return tooManyFailures(d)
	}
	set := limiter.WindowSet{Algorithm: limiter.AlgSlidingWindow, Scope: "auth:" + addr.String(), Windows: lim.Windows("")}
	res, err := s.APILimiter.Allow(r.Context(), set, 1)
	if err != nil {
		s.Logger.WarnContext(r.Context(), "count a failed authentication", "err", err)
		return e
	}
	if res.Allowed {
		return e
	}
	s.authFails.block(addr, s.opts.Now().Add(res.RetryAfter), s.opts.Now())
	s.Logger.WarnContext(r.Context(), "client address refused after too many failed authentications",
		"addr", addr.String(), "retry_after", res.RetryAfter.Round(time.Second))
	if i := res.Tightest(); i >= 0 {
		setRateLimitHeaders(w.Header(), res.Buckets[i], 0, "auth_failures:"+res.Buckets[i].Name)
	}
	return tooManyFailures(res.RetryAfter)
}

// tooManyFailures is the 429 of an address that used up its failed
// authentications.
func tooManyFailures(retry time.Duration) error {
	e := wire.Errorf(http.StatusTooManyRequests, wire.TypeRateLimit, client.CodeTooManyAuthFailures, "",
		"Too many requests with a missing or wrong key from this address. Retry after %v.", retry.Round(time.Millisecond))
	e.RetryAfter = retry
	return e
}
