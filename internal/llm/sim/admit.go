package sim

import (
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
	short   bool          // refused by the short window or the ramp
	hangFor time.Duration
	// The per-minute buckets after the decision at at, for the headers.
	at                 time.Time
	fullReq, fullTok   time.Duration
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
			s.admitShort(&v, b, model, tokens, now)
		}
		if v.outcome == Admitted {
			for _, c := range checks {
				c.b.take(c.cost)
			}
			if b.shortReq != nil {
				b.shortReq.take(1, now)
			}
			if b.shortTok != nil {
				b.shortTok.take(tokens, now)
			}
			if s.cfg.Ramp.Growth > 0 {
				b.ramp.now += float64(tokens)
			}
		}
	}
	v.snapshot(b, 1, tokens, now)

	switch v.outcome {
	case Admitted:
		s.stats.Admitted++
		s.stats.TokensAdmitted += tokens
	case RateLimited:
		s.stats.RateLimited++
		if v.short {
			s.stats.RateLimitedShort++
		}
	case Spurious429:
		s.stats.Spurious429++
	case Error500:
		s.stats.Errors500++
	case Hung:
		s.stats.Hung++
	}
	s.stats.Requests++
	v.seq = s.log.add(Admission{Seq: s.log.next, Time: now, Model: model, Requests: 1, Tokens: tokens, Outcome: v.outcome, RetryAfter: v.wait})
	if v.outcome == RateLimited {
		s.cfg.Logger.Debug("sim: rate limited", "model", model, "tokens", tokens, "retry_after", v.wait)
	}
	return v
}

// snapshot records the per-minute buckets for the headers at now: their
// levels, how long until they hold requests and tokens again, and until they
// are full.
func (v *verdict) snapshot(b *buckets, requests, tokens int64, now time.Time) {
	v.at = now
	if b.rpm.limit > 0 {
		v.hasReq, v.limReq, v.remReq = true, b.rpm.limit, b.rpm.remaining()
		v.resetReq, v.fullReq = resetFor(&b.rpm, requests), b.rpm.untilFull()
	}
	if b.tpm.limit > 0 {
		v.hasTok, v.limTok, v.remTok = true, b.tpm.limit, b.tpm.remaining()
		v.resetTok, v.fullTok = resetFor(&b.tpm, tokens), b.tpm.untilFull()
	}
}

// resetFor is the x-ratelimit-reset of a bucket: how long until it holds
// cost (after this request was charged, if it was), or until it is full if it
// never can.
func resetFor(b *bucket, cost int64) time.Duration {
	if d, ok := b.wait(cost); ok {
		return d
	}
	return b.untilFull()
}

// admitShort refuses, with a 429, a request the minute's buckets admit but
// the short window (Config.ShortWindow) or the ramp (Config.Ramp) does not.
func (s *Server) admitShort(v *verdict, b *buckets, model string, tokens int64, now time.Time) {
	refuse := func(kind, what string, wait time.Duration) {
		if wait > v.wait {
			v.outcome, v.kind, v.wait, v.short = RateLimited, kind, wait, true
			v.message = "Rate limit reached for " + model + " in organization org-llmqsim on " + what +
				". Please try again in " + wait.String() + "."
		}
	}
	if b.shortReq != nil {
		if d := b.shortReq.wait(1, now); d > 0 {
			refuse("requests", "requests per min (RPM), enforced over "+b.shortReq.period.String(), d)
		}
	}
	if b.shortTok != nil {
		if d := b.shortTok.wait(tokens, now); d > 0 {
			refuse("tokens", "tokens per min (TPM), enforced over "+b.shortTok.period.String(), d)
		}
	}
	if r := s.cfg.Ramp; r.Growth > 0 && b.tpm.limit > 0 {
		b.ramp.advance(now)
		share := float64(b.tpm.limit) * float64(rampWindow) / float64(time.Minute)
		allowed := max(r.Floor*share, r.Growth*b.ramp.prev)
		if b.ramp.now > 0 && b.ramp.now+float64(tokens) > allowed {
			refuse("tokens", "tokens per min (TPM): usage is rising too fast, increase it gradually",
				ceilMS(time.Duration((b.ramp.index+1)*int64(rampWindow)-now.UnixNano())))
		}
	}
}

// advance moves the ramp's count to now's window.
func (r *rampState) advance(now time.Time) {
	i := now.UnixNano() / int64(rampWindow)
	switch {
	case i == r.index:
	case i == r.index+1:
		r.index, r.prev, r.now = i, r.now, 0
	default:
		r.index, r.prev, r.now = i, 0, 0
	}
}

// shortWindows are the short windows of limits l, nil where there is none.
func (s *Server) shortWindows(l Limits, now time.Time) (req, tok *window) {
	w := s.cfg.ShortWindow
	req = newWindow(w, l.RPM, now)
	if !w.RequestsOnly {
		tok = newWindow(w, l.TPM, now)
	}
	return req, tok
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
		b.shortReq, b.shortTok = s.shortWindows(l, now)
		b.ramp.index = now.UnixNano() / int64(rampWindow)
		s.buckets[key] = b
	}
	return b
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// requestID is the x-request-id of request n.
func (s *Server) requestID(n uint64) string {
	if s.cfg.RandomIDs {
		return s.ident("req_", identRequest, n)
	}
	return "req_" + strconv.FormatUint(s.cfg.Seed, 36) + "_" + strconv.FormatUint(n, 10)
}

// setRateHeaders writes the rate-limit headers of Config.RateHeaders (with
// Config.HeaderNoise, nonsense in their place), a 429's wait in the form of
// Config.RetryAfter, and the request id.
func (s *Server) setRateHeaders(h http.Header, v *verdict, n uint64) {
	h.Set("X-Request-Id", s.requestID(n))
	noise := s.cfg.HeaderNoise > 0 && s.draw(n, drawNoise) < s.cfg.HeaderNoise
	nonsense := "0"
	if s.draw(n, drawNoise+1) < 0.5 {
		nonsense = "-1"
	}
	limit := func(name string, v int64) {
		if noise {
			h.Set(name, "-1")
		} else {
			h.Set(name, itoa(v))
		}
	}
	remaining := func(name string, v int64) {
		if noise {
			h.Set(name, nonsense)
		} else {
			h.Set(name, itoa(v))
		}
	}
	switch s.cfg.RateHeaders {
	case HeadersAll, HeadersLimitsOnly:
		if v.hasReq {
			limit("X-Ratelimit-Limit-Requests", v.limReq)
		}
		if v.hasTok {
			limit("X-Ratelimit-Limit-Tokens", v.limTok)
		}
		if s.cfg.RateHeaders == HeadersAll && v.hasReq {
			remaining("X-Ratelimit-Remaining-Requests", v.remReq)
			h.Set("X-Ratelimit-Reset-Requests", v.resetReq.String())
		}
		if s.cfg.RateHeaders == HeadersAll && v.hasTok {
			remaining("X-Ratelimit-Remaining-Tokens", v.remTok)
			h.Set("X-Ratelimit-Reset-Tokens", v.resetTok.String())
		}
	case HeadersAzure, HeadersAzurePTU:
		if v.hasReq {
			remaining("X-Ratelimit-Remaining-Requests", v.remReq)
		}
		if v.hasTok && s.cfg.RateHeaders == HeadersAzure {
			remaining("X-Ratelimit-Remaining-Tokens", v.remTok)
		}
		if v.hasTok && s.cfg.RateHeaders == HeadersAzurePTU {
			used := 100 * float64(v.limTok-v.remTok) / float64(v.limTok)
			if noise {
				used = -1
			}
			h.Set("Azure-Openai-Deployment-Utilization", strconv.FormatFloat(used, 'f', 1, 64)+"%")
		}
	case HeadersAnthropic:
		reset := func(d time.Duration) string {
			return v.at.Add(d).UTC().Truncate(time.Second).Add(time.Second).Format(time.RFC3339)
		}
		if v.hasReq {
			limit("Anthropic-Ratelimit-Requests-Limit", v.limReq)
			remaining("Anthropic-Ratelimit-Requests-Remaining", v.remReq)
			h.Set("Anthropic-Ratelimit-Requests-Reset", reset(v.fullReq))
		}
		if v.hasTok {
			limit("Anthropic-Ratelimit-Tokens-Limit", v.limTok)
			remaining("Anthropic-Ratelimit-Tokens-Remaining", v.remTok/1000*1000)
			h.Set("Anthropic-Ratelimit-Tokens-Reset", reset(v.fullTok))
		}
	}
	if v.wait <= 0 {
		return
	}
	secs := itoa(int64((v.wait + time.Second - 1) / time.Second))
	switch s.cfg.RetryAfter {
	case RetryAfterMS:
		ms := itoa(int64(ceilMS(v.wait) / time.Millisecond))
		h.Set("Retry-After-Ms", ms)
		if s.cfg.RateHeaders == HeadersAzure || s.cfg.RateHeaders == HeadersAzurePTU {
			h.Set("X-Ms-Retry-After-Ms", ms)
		}
		h.Set("Retry-After", secs)
	case RetryAfterSeconds:
		h.Set("Retry-After", secs)
	case RetryAfterDate:
		// whole seconds, rounded up, so the date is never before the wait
		h.Set("Retry-After", v.at.Add(v.wait).UTC().Truncate(time.Second).Add(time.Second).Format(http.TimeFormat))
	}
}
