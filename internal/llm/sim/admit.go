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
	// limit names the limit that refused, as Anthropic words it ("input
	// tokens per minute", "acceleration"), and limitOf its size.
	limit   string
	limitOf int64
	wait    time.Duration // the retry-after of a 429; 0 if none
	short   bool          // refused by the short window or the ramp
	hangFor time.Duration
	// The per-minute buckets after the decision at at, for the headers:
	// requests, tokens, and Anthropic's input and output tokens.
	at                time.Time
	req, tok, in, out gauge
}

// gauge is one per-minute bucket as the headers show it.
type gauge struct {
	has              bool
	limit, remaining int64
	// reset is how long until the bucket holds the request's cost again,
	// full until it is full.
	reset, full time.Duration
}

// charge is what one request asks of its model's buckets beside one
// request: tokens of the TPM and TPD buckets (all it may use: its prompt,
// but for cache reads, and its output limit), and of them Anthropic's input
// tokens (ITPM) and output tokens (OTPM), 0 for OpenAI's calls.
type charge struct {
	tokens, input, output int64
}

// admit decides one request under the lock: a fault (drawn with u, before
// the buckets, so faults consume nothing) or the buckets' verdict, charging
// them when they admit. Every decision is logged.
func (s *Server) admit(model string, c charge, now time.Time, u float64) verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bucketsLocked(model, now)
	s.advanceLocked(b, now)
	var v verdict
	f := s.faults
	switch {
	case u < f.Rate429:
		v.outcome, v.kind, v.wait = Spurious429, "requests", f.RetryAfter429
		v.limit, v.limitOf = "requests per minute", b.rpm.limit
		v.message = "Rate limit reached for " + model + " in organization org-llmqsim on requests per min (RPM). Please try again in " + f.RetryAfter429.String() + "."
	case u < f.Rate429+f.Rate500:
		v.outcome = Error500
	case u < f.Rate429+f.Rate500+f.Rate529:
		v.outcome = Overloaded
	case u < f.Rate429+f.Rate500+f.Rate529+f.RateHang:
		v.outcome, v.hangFor = Hung, f.HangFor
	default:
		v.outcome = Admitted
		type check struct {
			b      *bucket
			cost   int64
			kind   string
			period string
			limit  string
		}
		checks := [...]check{
			{&b.rpm, 1, "requests", "requests per min (RPM)", "requests per minute"},
			{&b.tpm, c.tokens, "tokens", "tokens per min (TPM)", "tokens per minute"},
			{&b.rpd, 1, "requests", "requests per day (RPD)", "requests per day"},
			{&b.tpd, c.tokens, "tokens", "tokens per day (TPD)", "tokens per day"},
			{&b.itpm, c.input, "tokens", "input tokens per min (ITPM)", "input tokens per minute"},
			{&b.otpm, c.output, "tokens", "output tokens per min (OTPM)", "output tokens per minute"},
		}
		var binding *check
		for i := range checks {
			ck := &checks[i]
			d, ok := ck.b.wait(ck.cost)
			if !ok {
				v.outcome, v.kind, v.wait = RateLimited, ck.kind, 0
				v.limit, v.limitOf = ck.limit, ck.b.limit
				v.message = "Request too large for " + model + " in organization org-llmqsim on " + ck.period +
					": Limit " + itoa(ck.b.limit) + ", Requested " + itoa(ck.cost) +
					". The input or output tokens must be reduced in order to run successfully."
				binding = nil
				break
			}
			if d > v.wait {
				v.outcome, v.wait, binding = RateLimited, d, ck
			}
		}
		if binding != nil {
			v.kind, v.limit, v.limitOf = binding.kind, binding.limit, binding.b.limit
			v.message = "Rate limit reached for " + model + " in organization org-llmqsim on " + binding.period +
				": Limit " + itoa(binding.b.limit) + ", Used " + itoa(binding.b.limit-binding.b.remaining()) +
				", Requested " + itoa(binding.cost) + ". Please try again in " + v.wait.String() +
				". Visit https://platform.openai.com/account/rate-limits to learn more."
		}
		if v.outcome == Admitted {
			s.admitShort(&v, b, model, c, now)
		}
		if v.outcome == Admitted {
			for _, ck := range checks {
				ck.b.take(ck.cost)
			}
			if b.shortReq != nil {
				b.shortReq.take(1, now)
			}
			if b.shortTok != nil {
				b.shortTok.take(c.tokens, now)
			}
			if s.cfg.Ramp.Growth > 0 {
				b.ramp.now += float64(c.tokens)
			}
		}
	}
	v.snapshot(b, c, now)

	tokens := c.tokens
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
	case Overloaded:
		s.stats.Overloaded++
	case Hung:
		s.stats.Hung++
	}
	s.stats.Requests++
	v.seq = s.log.add(Admission{Seq: s.log.next, Time: now, Model: model, Requests: 1, Tokens: tokens,
		InputTokens: c.input, OutputTokens: c.output, Outcome: v.outcome, RetryAfter: v.wait})
	if v.outcome == RateLimited {
		s.cfg.Logger.Debug("sim: rate limited", "model", model, "tokens", tokens, "retry_after", v.wait)
	}
	return v
}

// snapshot records the per-minute buckets for the headers at now: their
// levels, how long until they hold the request's cost c again, and until
// they are full.
func (v *verdict) snapshot(b *buckets, c charge, now time.Time) {
	v.at = now
	v.req = gaugeOf(&b.rpm, 1)
	v.tok = gaugeOf(&b.tpm, c.tokens)
	v.in = gaugeOf(&b.itpm, c.input)
	v.out = gaugeOf(&b.otpm, c.output)
}

// gaugeOf is bucket b as the headers show it to a request costing cost; not
// has when b is no limit.
func gaugeOf(b *bucket, cost int64) gauge {
	if b.limit <= 0 {
		return gauge{}
	}
	return gauge{has: true, limit: b.limit, remaining: b.remaining(), reset: resetFor(b, cost), full: b.untilFull()}
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
func (s *Server) admitShort(v *verdict, b *buckets, model string, c charge, now time.Time) {
	refuse := func(kind, what, limit string, wait time.Duration) {
		if wait > v.wait {
			v.outcome, v.kind, v.wait, v.short, v.limit = RateLimited, kind, wait, true, limit
			v.message = "Rate limit reached for " + model + " in organization org-llmqsim on " + what +
				". Please try again in " + wait.String() + "."
		}
	}
	if b.shortReq != nil {
		if d := b.shortReq.wait(1, now); d > 0 {
			refuse("requests", "requests per min (RPM), enforced over "+b.shortReq.period.String(), "requests per minute", d)
		}
	}
	if b.shortTok != nil {
		if d := b.shortTok.wait(c.tokens, now); d > 0 {
			refuse("tokens", "tokens per min (TPM), enforced over "+b.shortTok.period.String(), "tokens per minute", d)
		}
	}
	// The ramp counts all of a call's tokens against the model's token
	// limit per minute: TPM, or Anthropic's ITPM + OTPM.
	capacity := b.tpm.limit
	if capacity == 0 {
		capacity = b.itpm.limit + b.otpm.limit
	}
	if r := s.cfg.Ramp; r.Growth > 0 && capacity > 0 {
		tokens := c.tokens
		b.ramp.advance(now)
		share := float64(capacity) * float64(rampWindow) / float64(time.Minute)
		allowed := max(r.Floor*share, r.Growth*b.ramp.prev)
		if b.ramp.now > 0 && b.ramp.now+float64(tokens) > allowed {
			refuse("tokens", "tokens per min (TPM): usage is rising too fast, increase it gradually", "acceleration",
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
			rpm:  newBucket(l.RPM, time.Minute, now),
			tpm:  newBucket(l.TPM, time.Minute, now),
			rpd:  newBucket(l.RPD, 24*time.Hour, now),
			tpd:  newBucket(l.TPD, 24*time.Hour, now),
			itpm: newBucket(l.ITPM, time.Minute, now),
			otpm: newBucket(l.OTPM, time.Minute, now),
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
	hw := s.headerWriter(h, n)
	switch s.cfg.RateHeaders {
	case HeadersAll, HeadersLimitsOnly:
		if v.req.has {
			hw.limit("X-Ratelimit-Limit-Requests", v.req.limit)
		}
		if v.tok.has {
			hw.limit("X-Ratelimit-Limit-Tokens", v.tok.limit)
		}
		if s.cfg.RateHeaders == HeadersAll && v.req.has {
			hw.remaining("X-Ratelimit-Remaining-Requests", v.req.remaining)
			h.Set("X-Ratelimit-Reset-Requests", v.req.reset.String())
		}
		if s.cfg.RateHeaders == HeadersAll && v.tok.has {
			hw.remaining("X-Ratelimit-Remaining-Tokens", v.tok.remaining)
			h.Set("X-Ratelimit-Reset-Tokens", v.tok.reset.String())
		}
	case HeadersAzure, HeadersAzurePTU:
		if v.req.has {
			hw.remaining("X-Ratelimit-Remaining-Requests", v.req.remaining)
		}
		if v.tok.has && s.cfg.RateHeaders == HeadersAzure {
			hw.remaining("X-Ratelimit-Remaining-Tokens", v.tok.remaining)
		}
		if v.tok.has && s.cfg.RateHeaders == HeadersAzurePTU {
			used := 100 * float64(v.tok.limit-v.tok.remaining) / float64(v.tok.limit)
			if hw.noise {
				used = -1
			}
			h.Set("Azure-Openai-Deployment-Utilization", strconv.FormatFloat(used, 'f', 1, 64)+"%")
		}
	case HeadersAnthropic:
		hw.anthropic(v)
	}
	if v.wait <= 0 {
		return
	}
	secs := retryAfterSeconds(v.wait)
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

// setAnthropicHeaders writes what Anthropic's Messages API sends with every
// answer, whatever Config.RateHeaders says: its request-id, its rate-limit
// headers, and a 429's retry-after in whole seconds.
func (s *Server) setAnthropicHeaders(h http.Header, v *verdict, n uint64) {
	h.Set("Request-Id", s.requestID(n))
	s.headerWriter(h, n).anthropic(v)
	if v.wait > 0 {
		h.Set("Retry-After", retryAfterSeconds(v.wait))
	}
}

// retryAfterSeconds is a wait in whole seconds, rounded up.
func retryAfterSeconds(d time.Duration) string {
	return itoa(int64((d + time.Second - 1) / time.Second))
}

// headerWriter writes limits and remaining counts, or, for an answer drawn
// to carry Config.HeaderNoise, nonsense in their place.
type headerWriter struct {
	h        http.Header
	noise    bool
	nonsense string
}

func (s *Server) headerWriter(h http.Header, n uint64) headerWriter {
	hw := headerWriter{h: h, nonsense: "0"}
	hw.noise = s.cfg.HeaderNoise > 0 && s.draw(n, drawNoise) < s.cfg.HeaderNoise
	if s.draw(n, drawNoise+1) < 0.5 {
		hw.nonsense = "-1"
	}
	return hw
}

func (hw headerWriter) limit(name string, v int64) {
	if hw.noise {
		hw.h.Set(name, "-1")
	} else {
		hw.h.Set(name, itoa(v))
	}
}

func (hw headerWriter) remaining(name string, v int64) {
	if hw.noise {
		hw.h.Set(name, hw.nonsense)
	} else {
		hw.h.Set(name, itoa(v))
	}
}

// anthropic writes Anthropic's rate-limit headers of v: for requests, input
// tokens, output tokens, and tokens (the most restrictive of the token
// limits in effect: the one with the smallest share left), each its limit,
// what remains (tokens rounded to the nearest thousand) and when it is full
// again, an RFC 3339 time rounded up to the second.
func (hw headerWriter) anthropic(v *verdict) {
	family := func(name string, g gauge, round bool) {
		if !g.has {
			return
		}
		rem := g.remaining
		if round {
			rem = nearestThousand(rem)
		}
		hw.limit("Anthropic-Ratelimit-"+name+"-Limit", g.limit)
		hw.remaining("Anthropic-Ratelimit-"+name+"-Remaining", rem)
		hw.h.Set("Anthropic-Ratelimit-"+name+"-Reset", v.at.Add(g.full).UTC().Truncate(time.Second).Add(time.Second).Format(time.RFC3339))
	}
	family("Requests", v.req, false)
	family("Input-Tokens", v.in, true)
	family("Output-Tokens", v.out, true)
	var tightest gauge
	for _, g := range []gauge{v.tok, v.in, v.out} {
		// remaining/limit < tightest's, without division
		if g.has && (!tightest.has || g.remaining*tightest.limit < tightest.remaining*g.limit) {
			tightest = g
		}
	}
	family("Tokens", tightest, true)
}

// nearestThousand rounds n to the nearest thousand, a tie down, as
// Anthropic rounds its remaining tokens.
func nearestThousand(n int64) int64 { return (n + 499) / 1000 * 1000 }
