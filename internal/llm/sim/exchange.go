package sim

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/wire"
)

// Exchange is one request's passage through the simulator, split at its two
// moments: Begin decides it (a fault, a 429, or admission, which charges the
// buckets) and Finish completes it (the refund, when Config.Refund, and the
// answer). The HTTP handler sleeps the call's latency between them; tests on
// a simulated clock call them at the moments they choose.
type Exchange struct {
	s       *Server
	status  int
	header  http.Header
	body    []byte
	latency time.Duration
	// hang is set for a hung request (a fault): no answer until the client
	// gives up, or hangFor passes.
	hang     bool
	hangFor  time.Duration
	admitted bool
	model    string
	endpoint string
	seq      int64 // the admission log entry
	unused   int64 // what a refund gives back
	// completion is the output tokens of an admitted request.
	completion int64
	// anthropic marks a call to Anthropic's Messages API: its headers are
	// Anthropic's, and outputReturn (max_tokens less its output) goes back
	// to the OTPM bucket when it ends.
	anthropic    bool
	outputReturn int64
	n            uint64
	finished     bool
}

// Latency is how long the call takes between Begin and Finish; 0 for a
// request answered at once (refused, failed).
func (x *Exchange) Latency() time.Duration { return x.latency }

// Admitted reports whether the buckets admitted the request.
func (x *Exchange) Admitted() bool { return x.admitted }

// Finish completes the exchange at the simulator's now and returns the
// answer: the refund of the unused tokens is due now (or RefundDelay after),
// an Anthropic call's OTPM charge is corrected to its real output, and with
// HeadersAtCompletion the rate-limit headers are computed now. A second
// Finish returns the same answer and changes nothing.
func (x *Exchange) Finish() (status int, header http.Header, body []byte) {
	if x.admitted && !x.finished {
		s := x.s
		now := s.cfg.Now()
		s.mu.Lock()
		b := s.bucketsLocked(x.model, now)
		s.advanceLocked(b, now)
		if s.cfg.Refund && x.unused > 0 {
			s.refundLocked(b, refund{at: now.Add(s.cfg.RefundDelay), tokens: x.unused, seq: x.seq}, now)
		}
		if x.outputReturn > 0 {
			// As Anthropic documents OTPM: max_tokens at admission, the
			// estimate corrected at the end of the request.
			b.otpm.give(x.outputReturn, now)
			if e := s.log.get(x.seq); e != nil {
				e.OutputReturned = x.outputReturn
			}
		}
		if s.cfg.HeadersAt == HeadersAtCompletion {
			v := verdict{outcome: Admitted}
			v.snapshot(b, charge{}, now)
			if x.anthropic {
				s.setAnthropicHeaders(x.header, &v, x.n)
			} else {
				s.setRateHeaders(x.header, &v, x.n)
			}
		}
		s.mu.Unlock()
	}
	x.finished = true
	return x.status, x.header, x.body
}

// answer fills the exchange with an error in OpenAI's shape.
func (x *Exchange) answer(status int, message, typ, param, code string) *Exchange {
	x.status, x.body = status, errorBody(message, typ, param, code)
	x.header.Set("Content-Type", "application/json")
	return x
}

// Begin decides a request to endpoint (llm.EndpointChat,
// llm.EndpointResponses, llm.EndpointEmbeddings or EndpointMessages) with
// body at the simulator's now: a 400 or 404 for a body it refuses, a fault,
// a 429, or admission, which charges the buckets, draws the answer and the
// latency, and bills the call.
func (s *Server) Begin(endpoint string, body []byte) *Exchange {
	return s.begin(endpoint, body, false)
}

// begin is Begin for a call whose answer is streamed when stream is set
// (the body without stream and stream_options): its bill says so.
func (s *Server) begin(endpoint string, body []byte, stream bool) *Exchange {
	if endpoint == EndpointMessages {
		return s.beginMessages(body, stream)
	}
	x := &Exchange{s: s, header: http.Header{}}
	c, bad := s.prepare(endpoint, body)
	if bad != nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		return x.refuse(bad)
	}
	n := s.arrival.Add(1)
	x.n, x.model, x.endpoint = n, c.p.Model, endpoint
	if bad := s.exceedsContext(c); bad != nil {
		// Nothing is counted against the limits.
		s.count(func(st *Stats) { st.BadRequests++ })
		return x.refuse(bad)
	}
	now := s.cfg.Now()
	v := s.admit(c.p.Model, charge{tokens: c.tokens}, now, s.draw(n, drawFault))
	if endpoint == llm.EndpointResponses {
		s.count(func(st *Stats) { st.Responses++ })
	}
	x.seq = v.seq
	s.setRateHeaders(x.header, &v, n)
	switch v.outcome {
	case RateLimited, Spurious429:
		return x.answer(http.StatusTooManyRequests, v.message, v.kind, "", "rate_limit_exceeded")
	case Error500:
		return x.answer(http.StatusInternalServerError, "The server had an error while processing your request. Sorry about that!", "server_error", "", "")
	case Overloaded:
		return x.answer(http.StatusServiceUnavailable, "The engine is currently overloaded, please try again later.", "server_error", "", "")
	case Hung:
		x.hang, x.hangFor = true, v.hangFor
		return x
	}

	// Admitted: draw the answer and the time it takes, and bill it.
	x.admitted, x.status = true, http.StatusOK
	var bill Bill
	x.body, bill = s.respond(c, n, now)
	bill.Seq, bill.Stream, bill.RequestID = x.seq, stream, s.requestID(n)
	s.record(bill)
	x.completion = bill.OutputTokens
	x.unused = c.tokens - c.prompt - x.completion
	x.latency = s.latency(n, x.completion)
	x.header.Set("Content-Type", "application/json")
	x.header.Set("Content-Length", strconv.Itoa(len(x.body)))
	return x
}

// call is a request the simulator answers, parsed and counted: what
// admission charges, what the answer is drawn from and what decides its
// bill. Synchronous calls and batch lines share it, so both get the same
// answers and bills.
type call struct {
	endpoint string
	body     []byte
	p        *llm.ParsedRequest
	emb      embeddingOptions
	// responses is what a Responses API call echoes; nil for the others.
	responses *responsesRequest
	// terms are what decides a chat or Responses API call's bill, read by
	// the simulator itself; the zero value for embeddings.
	terms terms
	// prompt is the prompt tokens as the provider counts them (with a
	// Responses API call's earlier turns and referenced items); maxTokens
	// what a chat or Responses API call may produce per choice; tokens what
	// admission charges (prompt plus maxTokens for every choice).
	prompt, maxTokens, tokens int64
}

// refusal is the answer, in OpenAI's error shape, to a request the
// simulator refuses before admission.
type refusal struct {
	status                    int
	message, typ, param, code string
}

// refuse fills the exchange with r.
func (x *Exchange) refuse(r *refusal) *Exchange {
	return x.answer(r.status, r.message, r.typ, r.param, r.code)
}

// prepare parses body for endpoint and counts it as the provider does: a
// 400 for a body it refuses, a 404 for a model it does not serve. llmq's
// parser validates the body and counts its prompt; the terms of the bill
// are the simulator's own reading (readTerms).
func (s *Server) prepare(endpoint string, body []byte) (*call, *refusal) {
	var m members
	var rq *responsesRequest
	if endpoint != llm.EndpointEmbeddings {
		m = readMembers(body)
	}
	if endpoint == llm.EndpointResponses {
		var bad *refusal
		if rq, bad = readResponsesRequest(m); bad != nil {
			return nil, bad
		}
	}
	p, err := s.est.Parse(endpoint, "", "", body)
	if err != nil {
		var ir *wire.Error
		if errors.As(err, &ir) {
			return nil, &refusal{http.StatusBadRequest, ir.Message, "invalid_request_error", ir.Param, ""}
		}
		return nil, &refusal{http.StatusBadRequest, err.Error(), "invalid_request_error", "", ""}
	}
	if s.cfg.OnlyKnownModels {
		s.mu.Lock()
		_, ok := s.models[p.Model]
		s.mu.Unlock()
		if !ok {
			return nil, &refusal{http.StatusNotFound, "The model `" + p.Model + "` does not exist or you do not have access to it.", "invalid_request_error", "", "model_not_found"}
		}
	}
	c := &call{endpoint: endpoint, body: body, p: p, responses: rq}
	if endpoint == llm.EndpointEmbeddings {
		if c.emb, err = s.embeddingOptions(body); err != nil {
			return nil, &refusal{http.StatusBadRequest, err.Error(), "invalid_request_error", "dimensions", ""}
		}
	} else {
		var bad *refusal
		if c.terms, bad = readTerms(endpoint, m); bad != nil {
			return nil, bad
		}
	}
	// The provider counts the prompt with its own tokenizer.
	c.prompt = int64(math.Ceil(float64(p.ContentTokens) * s.cfg.PromptFactor))
	if c.terms.previous != "" {
		// The provider counts the earlier turns it stored.
		earlier, bad := s.previousTokens(c.terms.previous)
		if bad != nil {
			return nil, bad
		}
		c.prompt += earlier
	}
	for _, id := range c.terms.refs {
		// And the items the input names, each its whole response's output.
		output, bad := s.referencedTokens(id)
		if bad != nil {
			return nil, bad
		}
		c.prompt += output
	}
	c.tokens = c.prompt
	if endpoint != llm.EndpointEmbeddings {
		c.maxTokens = c.terms.maxTokens
		if c.maxTokens == 0 {
			c.maxTokens = s.defaultMaxTokens(p.Model)
		}
		c.tokens += c.maxTokens * c.terms.n
	}
	return c, nil
}

// exceedsContext is OpenAI's 400 context_length_exceeded for a chat or
// Responses API call whose prompt and max_tokens (max_output_tokens, or the
// default max tokens) pass its model's context window; nil when it fits.
func (s *Server) exceedsContext(c *call) *refusal {
	if c.endpoint == llm.EndpointEmbeddings {
		return nil
	}
	window := s.contextWindow(c.p.Model)
	if window <= 0 || c.prompt+c.maxTokens <= window {
		return nil
	}
	if c.endpoint == llm.EndpointResponses {
		return responsesContext()
	}
	// OpenAI's wording.
	return &refusal{http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
		window, c.prompt+c.maxTokens, c.prompt, c.maxTokens), "invalid_request_error", "messages", "context_length_exceeded"}
}

// refund is unused tokens due back to a model's token buckets at a moment.
type refund struct {
	at     time.Time
	tokens int64
	seq    int64 // the admission log entry
}

// externalState is the external application's backlog: the tokens it has
// wanted since last, and whether it started.
type externalState struct {
	last    time.Time
	pending float64
}

// refundLocked gives r back now, or queues it until r.at.
func (s *Server) refundLocked(b *buckets, r refund, now time.Time) {
	if r.at.After(now) {
		b.refunds = append(b.refunds, r) // Finish runs in time order: refunds are sorted
		return
	}
	b.tpm.give(r.tokens, r.at)
	b.tpd.give(r.tokens, r.at)
	s.stats.TokensRefunded += r.tokens
	if e := s.log.get(r.seq); e != nil {
		e.Refunded, e.RefundedAt = r.tokens, r.at
	}
}

// advanceLocked brings b to now: refunds that fell due, in time order, each
// at its moment, then the external application's calls, then the refill.
func (s *Server) advanceLocked(b *buckets, now time.Time) {
	for len(b.refunds) > 0 && !b.refunds[0].at.After(now) {
		r := b.refunds[0]
		b.refunds = b.refunds[1:]
		s.refundLocked(b, r, r.at)
	}
	for _, bk := range []*bucket{&b.rpm, &b.tpm, &b.rpd, &b.tpd, &b.itpm, &b.otpm} {
		bk.refill(now)
	}
	s.externalLocked(b, now)
}

// externalLocked lets the external application send the calls it wanted
// since its last turn, as far as the buckets hold them. A backlog of more
// than five seconds of its calls is dropped, as an application would give up.
func (s *Server) externalLocked(b *buckets, now time.Time) {
	e := s.cfg.External
	if e.TPM <= 0 {
		return
	}
	if b.ext.last.IsZero() {
		b.ext.last = now
		return
	}
	if d := now.Sub(b.ext.last); d > 0 {
		b.ext.pending = min(b.ext.pending+float64(e.TPM)*float64(d)/float64(time.Minute), float64(e.TPM)/12)
		b.ext.last = now
	}
	call := e.CallTokens
	for b.ext.pending >= float64(call) && fits(&b.tpm, call) && fits(&b.tpd, call) && fits(&b.rpm, 1) && fits(&b.rpd, 1) {
		b.tpm.take(call)
		b.tpd.take(call)
		b.rpm.take(1)
		b.rpd.take(1)
		b.ext.pending -= float64(call)
		s.stats.ExternalRequests++
		s.stats.ExternalTokens += call
	}
}

// fits reports whether bucket b holds cost now.
func fits(b *bucket, cost int64) bool {
	d, ok := b.wait(cost)
	return ok && d == 0
}
