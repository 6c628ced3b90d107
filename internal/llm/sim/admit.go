package sim

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// verdict is the limiter's answer to one request.
type verdict struct {
	outcome Outcome
	seq     int64  // the log entry
	kind    string // "requests" or "tokens": the limit that refused
	message string
	wait    time.Duration // the retry-after of a 429; 0 if none
	hangFor time.Duration
	// The per-minute buckets after the decision, for the headers.
	hasReq, hasTok     bool
	limReq, limTok     int64
	remReq, remTok     int64
	resetReq, resetTok time.Duration
}

// admit decides one request under the lock: a fault (drawn with u, before
// the buckets, so faults consume nothing) or the buckets' verdict, charging
// them when they admit. Every decision is logged.
func (s *Server) admit(model string, tokens int64, now time.Time, u float64) verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bucketsLocked(model, now)
	s.advanceLocked(b, now)
	var v verdict
	f := s.faults
	switch {
	case u < f.Rate429:
		v.outcome, v.kind, v.wait = Spurious429, "requests", f.RetryAfter429
		v.message = "Rate limit reached for " + model + " in organization org-llmqsim on requests per min (RPM). Please try again in " + f.RetryAfter429.String() + "."
	case u < f.Rate429+f.Rate500:
		v.outcome = Error500
	case u < f.Rate429+f.Rate500+f.RateHang:
		v.outcome, v.hangFor = Hung, f.HangFor
	default:
		v.outcome = Admitted
		type check struct {
			b      *bucket
			cost   int64
			kind   string
			period string
		}
		checks := [...]check{
			{&b.rpm, 1, "requests", "requests per min (RPM)"},
			{&b.tpm, tokens, "tokens", "tokens per min (TPM)"},
			{&b.rpd, 1, "requests", "requests per day (RPD)"},
			{&b.tpd, tokens, "tokens", "tokens per day (TPD)"},
		}
		var binding *check
		for i := range checks {
			c := &checks[i]
			d, ok := c.b.wait(c.cost)
			if !ok {
				v.outcome, v.kind, v.wait = RateLimited, c.kind, 0
				v.message = "Request too large for " + model + " in organization org-llmqsim on " + c.period +
					": Limit " + itoa(c.b.limit) + ", Requested " + itoa(c.cost) +
					". The input or output tokens must be reduced in order to run successfully."
				binding = nil
				break
			}
			if d > v.wait {
				v.outcome, v.wait, binding = RateLimited, d, c
			}
		}
		if binding != nil {
			v.kind = binding.kind
			v.message = "Rate limit reached for " + model + " in organization org-llmqsim on " + binding.period +
				": Limit " + itoa(binding.b.limit) + ", Used " + itoa(binding.b.limit-binding.b.remaining()) +
				", Requested " + itoa(binding.cost) + ". Please try again in " + v.wait.String() +
				". Visit https://platform.openai.com/account/rate-limits to learn more."
		}
		if v.outcome == Admitted {
			for _, c := range checks {
				c.b.take(c.cost)
			}
		}
	}
	v.snapshot(b, 1, tokens)

	switch v.outcome {
	case Admitted:
		s.stats.Admitted++
		s.stats.TokensAdmitted += tokens
	case RateLimited:
		s.stats.RateLimited++
	case Spurious429:
		s.stats.Spurious429++
	case Error500:
		s.stats.Errors500++
	case Hung:
		s.stats.Hung++
	}
	s.stats.Requests++
	v.seq = s.log.add(Admission{Time: now, Model: model, Requests: 1, Tokens: tokens, Outcome: v.outcome, RetryAfter: v.wait})
	if v.outcome == RateLimited {
		s.cfg.Logger.Debug("sim: rate limited", "model", model, "tokens", tokens, "retry_after", v.wait)
	}
	return v
}

// snapshot records the per-minute buckets for the headers: their levels, and
// how long until they hold requests and tokens again.
func (v *verdict) snapshot(b *buckets, requests, tokens int64) {
	if b.rpm.limit > 0 {
		v.hasReq, v.limReq, v.remReq = true, b.rpm.limit, b.rpm.remaining()
		v.resetReq = resetFor(&b.rpm, requests)
	}
	if b.tpm.limit > 0 {
		v.hasTok, v.limTok, v.remTok = true, b.tpm.limit, b.tpm.remaining()
		v.resetTok = resetFor(&b.tpm, tokens)
	}
}

// resetFor is the x-ratelimit-reset of a bucket: how long until it holds
// cost (after this request was charged, if it was), or until it is full if it
// never can.
func resetFor(b *bucket, cost int64) time.Duration {
	if d, ok := b.wait(cost); ok {
		return d
	}
	return ceilMS(time.Duration(math.Ceil((float64(b.limit) - b.level) / b.rate())))
}

func (s *Server) bucketsLocked(model string, now time.Time) *buckets {
	key := model
	if s.cfg.SharedBuckets {
		key = ""
	}
	b := s.buckets[key]
	if b == nil {
		l := s.limitsLocked(model)
		b = &buckets{
			rpm: newBucket(l.RPM, time.Minute, now),
			tpm: newBucket(l.TPM, time.Minute, now),
			rpd: newBucket(l.RPD, 24*time.Hour, now),
			tpd: newBucket(l.TPD, 24*time.Hour, now),
		}
		s.buckets[key] = b
	}
	return b
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// setRateHeaders writes OpenAI's rate-limit headers, as far as
// Config.RateHeaders sends them, and the request id.
func (s *Server) setRateHeaders(h http.Header, v *verdict, n uint64) {
	h.Set("X-Request-Id", "req_"+strconv.FormatUint(s.cfg.Seed, 36)+"_"+strconv.FormatUint(n, 10))
	limits, levels := s.cfg.RateHeaders != HeadersNone, s.cfg.RateHeaders == HeadersAll
	if v.hasReq && limits {
		h.Set("X-Ratelimit-Limit-Requests", itoa(v.limReq))
	}
	if v.hasReq && levels {
		h.Set("X-Ratelimit-Remaining-Requests", itoa(v.remReq))
		h.Set("X-Ratelimit-Reset-Requests", v.resetReq.String())
	}
	if v.hasTok && limits {
		h.Set("X-Ratelimit-Limit-Tokens", itoa(v.limTok))
	}
	if v.hasTok && levels {
		h.Set("X-Ratelimit-Remaining-Tokens", itoa(v.remTok))
		h.Set("X-Ratelimit-Reset-Tokens", v.resetTok.String())
	}
	if v.wait > 0 {
		h.Set("Retry-After-Ms", itoa(int64(ceilMS(v.wait)/time.Millisecond)))
		h.Set("Retry-After", itoa(int64((v.wait+time.Second-1)/time.Second)))
	}
}
